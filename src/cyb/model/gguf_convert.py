"""GGUF files as plain Hugging Face model folders.

``transformers`` reads a GGUF file (with the ``gguf`` package) and dequantises its weights to
float, but the model it gives carries a GGUF ``quantization_config`` and cannot be saved.
:func:`convert_gguf` builds a plain model of the same configuration, loads the dequantised
weights into it and writes a folder (safetensors, tokenizer, generation config), then checks
it: the folder's logits on a short text must equal those of the GGUF load (float32), and its
tokenizer must encode that text alike.  The folder appears complete or not at all (built
beside its place and renamed into it).

:func:`cached_conversion` does this once per file content, in ``$CYB_CACHE/gguf``.
"""

from __future__ import annotations

import contextlib
import copy
import time
from pathlib import Path

from ..extras import install_hint
from .cache import (SOURCE_FILE, cache_dir, file_sha256, is_complete, locked, read_source, say,
                      temporary_folder)

#: The text whose logits must agree between the GGUF load and the converted folder.
CHECK_TEXT = "The capital of France is Paris. A model that pauses for breath thinks before it speaks."
#: Largest |logit difference| accepted (both sides float32 from the same dequantised weights).
CHECK_TOLERANCE = 1e-4


class ConversionError(ValueError):
    """A GGUF file could not be converted, or its conversion did not check out."""


def gguf_metadata(path) -> dict:
    """A few fields of a GGUF file's header: ``name``, ``architecture``, ``license``,
    ``file_type`` (the quantisation), when present."""
    try:
        from gguf import GGUFReader
    except ImportError as e:
        raise ConversionError(f"reading {path} needs the gguf package, which is not installed: "
                              f"{install_hint('gguf')}") from e
    try:
        reader = GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 - a damaged or foreign file fails in many ways
        raise ConversionError(f"{path} is not a readable GGUF file ({type(e).__name__}: {str(e)[:160]})") from None
    out = {}
    for key, name in (("general.name", "name"), ("general.architecture", "architecture"),
                      ("general.license", "license"), ("general.file_type", "file_type")):
        field = reader.fields.get(key)
        if field is None:
            continue
        try:
            value = field.contents()
        except Exception:  # noqa: BLE001 - an odd field type: leave it out
            continue
        out[name] = value
    return out


def load_gguf(path, *, dtype=None):
    """``(model, tokenizer)`` of a GGUF file as ``transformers`` reads it (dequantised)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .hf import dtype_kwargs

    path = Path(path)
    from ..extras import available

    for package in ("gguf", "accelerate"):  # transformers reads a GGUF file only with both: say so in our words
        if not available(package):
            raise ConversionError(f"loading {path} needs the {package} package, which is not installed: "
                                  f"{install_hint('gguf')}")
    kw = dict(gguf_file=path.name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **kw)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), **kw,
                                                     **dtype_kwargs(dtype or torch.float32))
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise ConversionError(f"transformers cannot load {path} ({type(e).__name__}: {str(e)[:200]}); "
                              "is it a GGUF file of a causal LM architecture transformers knows?") from None
    return model.eval(), tokenizer


def plain_model(gguf_model):
    """A Hugging Face model of ``gguf_model``'s configuration without its GGUF quantisation
    entry, holding the same (dequantised) weights; saveable with ``save_pretrained``."""
    from transformers import AutoModelForCausalLM

    from .hf import dtype_kwargs

    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, **dtype_kwargs(gguf_model.dtype))
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    if getattr(gguf_model, "generation_config", None) is not None:
        model.generation_config = copy.deepcopy(gguf_model.generation_config)
    return model.eval()


def check_folder(folder, gguf_model, gguf_tokenizer, *, text: str = CHECK_TEXT) -> dict:
    """Compare a converted folder with the GGUF load on ``text``; returns the check's record,
    raises :class:`ConversionError` when the tokens or the logits differ."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .hf import dtype_kwargs

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    want = list(gguf_tokenizer(text, add_special_tokens=False)["input_ids"])
    got = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if got != want:
        raise ConversionError(f"the converted tokenizer encodes the check text differently ({got[:8]}... "
                              f"against {want[:8]}...)")
    model = AutoModelForCausalLM.from_pretrained(str(folder), **dtype_kwargs(torch.float32)).eval()
    ids = torch.tensor([want])
    with torch.no_grad():
        a = gguf_model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        b = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    diff = float((a - b).abs().max())
    if not diff <= CHECK_TOLERANCE:
        raise ConversionError(f"the converted model's logits differ from the GGUF load's by up to {diff:.3g} "
                              f"(tolerance {CHECK_TOLERANCE:g}) on the check text")
    return {"text": text, "tokens": len(want), "max_abs_logit_diff": diff, "dtype": "float32"}


def convert_gguf(path, out, *, source: dict | None = None, title: str | None = None, lock: bool = True) -> Path:
    """Convert the GGUF file ``path`` into the model folder ``out`` (replaced when it exists).

    ``out`` receives ``config.json``, ``generation_config.json``, ``model.safetensors`` (float32,
    the dequantised weights), the tokenizer files, ``cyb_source.json`` (``source`` plus the
    file's metadata, checksum and the check) and a model card ``README.md``.  Built in a folder
    beside ``out`` and renamed into place only after the check passed.  ``lock=False``: the
    caller already holds :func:`~cyb.model.cache.locked` on ``out``.
    """
    import shutil

    import torch

    from ..files import replace_dir, write_json_atomic
    from .card import source_card, write_card

    path, out = Path(path), Path(out)
    meta = gguf_metadata(path)
    start = time.perf_counter()
    with locked(out) if lock else contextlib.nullcontext():
        tmp = temporary_folder(out)
        try:
            say(f"converting {path.name} into a model folder (once; dequantising to float32)")
            gguf_model, tokenizer = load_gguf(path, dtype=torch.float32)
            model = plain_model(gguf_model)
            model.save_pretrained(str(tmp))
            del model
            tokenizer.save_pretrained(str(tmp))
            check = check_folder(tmp, gguf_model, tokenizer)
            info = {
                **(source or {}),
                "gguf": {"file": path.name, "sha256": file_sha256(path), "size": path.stat().st_size, **meta},
                "license": (source or {}).get("license") or meta.get("license"),
                "architecture": type(gguf_model).__name__,
                "parameters": int(sum(p.numel() for p in gguf_model.parameters())),
                "vocab_size": int(gguf_model.config.vocab_size),
                "check": check,
                "converted_seconds": round(time.perf_counter() - start, 1),
            }
            del gguf_model
            write_card(tmp, source_card(info, title=title))
            write_json_atomic(tmp / SOURCE_FILE, info)  # last: marks the folder complete
            replace_dir(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"converted {path.name} in {time.perf_counter() - start:.0f} s: {out} (logits checked, "
        f"max |diff| {check['max_abs_logit_diff']:.2g})")
    return out


def cached_folder(path) -> Path:
    """Where :func:`cached_conversion` puts (or put) the conversion of ``path``; converts nothing."""
    root = cache_dir() / "gguf"
    root.mkdir(parents=True, exist_ok=True)
    return root / file_sha256(Path(path).expanduser(), memo=root / "hashes.json")[:16]


def cached_conversion(path) -> Path:
    """The converted folder of the GGUF file ``path`` in ``$CYB_CACHE/gguf`` (converted on
    first use; the folder is named by the first 16 hex digits of the file's SHA-256, so a
    changed file is converted anew and a moved or copied one is not)."""
    path = Path(path).expanduser()
    out = cached_folder(path)
    if not is_complete(out):
        with locked(out):
            if not is_complete(out):  # another process may have converted it meanwhile
                convert_gguf(path, out, source={"source": "gguf file", "path": str(path.resolve())}, lock=False)
    found = read_source(out) or {}
    if not (found.get("gguf") or {}).get("sha256", "").startswith(out.name):
        raise ConversionError(f"{out} holds the conversion of another file (its {SOURCE_FILE} says so); "
                              "move that folder out of the cache to convert again")
    return out


__all__ = ["CHECK_TEXT", "ConversionError", "cached_conversion", "cached_folder", "check_folder", "convert_gguf",
           "gguf_metadata", "load_gguf", "plain_model"]
