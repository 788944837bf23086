"""The model card of a ``cyb train`` run and of ``cyb merge``'s output.

* :func:`run_card`: the ``final/`` model of a run (base model and licence, method, M, pause
  visibility, the held-out perplexity and E[S] the run measured and on which data, the
  training command and configuration, how to generate from it);
* :func:`merged_card`: the output of ``cyb merge`` (the run's card, re-titled).

Cards hold only numbers that were measured: a run without a held-out evaluation says so.
:mod:`cyb.model.card` writes them.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import yaml

from .model.card import _front_matter, _licence_id, _source_text, _table, read_front_matter, write_card


def base_origin(name_or_path) -> dict:
    """What is known of a base model given as ``model.name_or_path``: ``name`` (as given),
    ``hub_id``, ``license``, ``source`` (how it got here), each None when unknown.  Reads the
    known-model table, the ``cyb_source.json`` of fetched or converted folders and the header of
    a folder's ``README.md``; touches no network and converts or fetches nothing."""
    from .model.cache import is_gguf, read_source
    from .model.sources import resolve_model_source
    from .model.zoo import find

    out = {"name": None if name_or_path is None else str(name_or_path), "hub_id": None, "license": None,
           "source": None}
    if name_or_path is None:
        return out
    known = find(str(name_or_path))
    folder = None
    path = Path(str(name_or_path)).expanduser()
    if path.is_dir():
        folder = path
    elif known is not None:
        out.update(hub_id=known.hub_id, license=known.licence)
        resolved = resolve_model_source(name_or_path, fetch=False)
        folder = Path(resolved) if resolved != name_or_path else None
    elif path.is_file() and is_gguf(path):
        from .model.gguf_convert import cached_folder

        folder = cached_folder(path)
    elif "/" in str(name_or_path) and not path.exists():
        out["hub_id"] = str(name_or_path)
    if folder is not None:
        info = read_source(folder) or {}
        front = read_front_matter(folder)
        base = front.get("base_model")
        out["hub_id"] = out["hub_id"] or info.get("hub_id") or (base if isinstance(base, str) else None)
        out["license"] = out["license"] or info.get("license") or front.get("license")
        out["source"] = _source_text(info) if info else None
    return out


def _method_rows(settings, method_section=None) -> list[tuple[str, str]]:
    from . import methods

    name = settings.method
    label = methods.label(method_section) if method_section is not None else name
    rows = [("Method", f"{label} (`{name}`)"),
            ("Steps per token M", f"{settings.num_steps} (the token and {settings.num_steps - 1} pause"
                                  f"{'' if settings.num_steps == 2 else 's'})")]
    if settings.num_steps > 1:
        rows.append(("Pause visibility", str(getattr(settings, "pause_visibility", "shared"))))
        rows.append(("Pause positions", settings.position_scheme))
    if settings.dk_id is not None:
        prior = f", prior psi'_dk = {settings.psi_dk:g}" if settings.psi_dk is not None else ", no prior"
        token = f"`{settings.dk_token}`" if settings.dk_token else "no token string"
        rows.append(("`<don't know>` output", f"id {settings.dk_id} ({token}{prior})"))
    if settings.pause_ids:
        ids = list(settings.pause_ids)
        rows.append(("Pause ids", ", ".join(str(i) for i in ids[:8]) + (" ..." if len(ids) > 8 else "")))
    return rows


def _fmt(v, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) and not isinstance(v, bool) else "n/a"


def _results(valid_rows: list[dict], data_text: str) -> str:
    if not valid_rows:
        return ("No held-out evaluation was made in this run (no held-out data, or train.eval_batches "
                "and train.eval_every left none), so this card reports no perplexity.\n")
    has_steps = any("mean_steps" in r for r in valid_rows)
    head = "| step | epoch | held-out perplexity | loss |" + (" E[S] |" if has_steps else "") + " tokens |\n"
    head += "|---:|---:|---:|---:|" + ("---:|" if has_steps else "") + "---:|\n"
    shown = valid_rows if len(valid_rows) <= 6 else [*valid_rows[:2], *valid_rows[-3:]]
    body = ""
    for r in shown:
        body += (f"| {r.get('step', '?')} | {_fmt(r.get('epoch'), '.3f')} | {_fmt(r.get('ppl'), '.2f')} | "
                 f"{_fmt(r.get('loss'), '.4f')} |" + (f" {_fmt(r.get('mean_steps'), '.3f')} |" if has_steps else "")
                 + f" {_fmt(r.get('targets'), ',')} |\n")
    note = ("E[S] is the expected number of steps per token under the model's own stopping (1 to M). "
            if has_steps else "")
    return (f"Measured by `cyb train` on {data_text}, every evaluation on the same rows"
            + (f" ({len(valid_rows) - len(shown)} rows of the log left out here)" if len(shown) < len(valid_rows) else "")
            + f". {note}Step 0 is the model before training.\n\n" + head + body)


def _data_text(cfg) -> str:
    d = cfg.data
    if d.task:
        kw = ", ".join(f"{k}={v}" for k, v in d.task_kwargs.items())
        return (f"the held-out examples of the synthetic task `{d.task}` (" + (f"{kw}; " if kw else "")
                + f"{d.num_valid_examples} drawn, answer tokens scored)")
    where = f"`{d.valid_source}`" if d.valid_source else f"{d.valid_fraction:g} of the documents of `{d.source}` held out"
    return f"{where}, in rows of {d.block_len} real tokens"


def training_command() -> str | None:
    """The ``cyb train`` command line of this process, when it was started as one."""
    argv = sys.argv[1:]
    if argv[:1] == ["train"]:
        return "cyb " + " ".join(shlex.quote(a) for a in argv)
    return None


def run_card(cfg, settings, *, valid_rows: list[dict], state: dict, command: str | None = None,
             num_parameters: int | None = None, title: str | None = None, merged: bool = False) -> str:
    """The card of a run's ``final/`` model.

    Args:
        cfg: the run's :class:`~cyb.config.RunConfig`.
        settings: the model's :class:`~cyb.model.PauseSettings`.
        valid_rows: the run's held-out evaluations (``metrics.jsonl`` rows of split ``valid``).
        state: ``training_state.json`` (step, epochs, real tokens seen).
        command: the command that trained it (None: the run's own config file is given).
        merged: the card of ``cyb merge``'s output (LoRA adapters folded into the weights).
    """
    from . import methods

    base = base_origin(cfg.model.name_or_path)
    label = methods.label(cfg.method)
    out_name = Path(cfg.train.out_dir).name
    if base["name"]:
        what = f"{base['name']} fine-tuned with {label}"
    else:
        what = f"a {cfg.model.arch} model trained from scratch with {label}"
    rows = [("Base model", (f"`{base['name']}`" + (f" (hub: `{base['hub_id']}`)" if base["hub_id"] and base["hub_id"] != base["name"] else "")
                            + (f"; from {base['source']}" if base["source"] else ""))
             if base["name"] else f"none: a randomly initialised {cfg.model.arch} model (hidden size "
                                  f"{cfg.model.hidden_size}, {cfg.model.num_layers} layers)"),
            ("Licence", (f"{base['license']} (the base model's)" if base["license"] else
                         "the base model's licence applies; cyb did not record it") if base["name"] else None)]
    rows += _method_rows(settings, cfg.method)
    if cfg.lora.rank > 0:
        rows.append(("LoRA", f"rank {cfg.lora.rank}, alpha {cfg.lora.alpha:g} on {', '.join(cfg.lora.target_modules)}; "
                     + ("folded into the weights by `cyb merge`" if merged else
                        "this folder holds the adapters (`cyb merge` writes a plain model)")))
    adapters = cfg.lora.rank > 0 and not merged
    t = cfg.train
    trained = f"{state.get('step', '?')} optimiser steps of {t.batch_size} rows"
    if not cfg.data.task:
        trained += f" x {methods.spec(cfg.method.name).context(cfg.method, cfg.data.block_len)} real tokens"
    if state.get("epochs") is not None:
        trained += f" ({state['epochs']:.3f} epochs)"
    rows.append(("Training", trained))
    rows.append(("Training data", f"synthetic task `{cfg.data.task}`" if cfg.data.task else f"`{cfg.data.source}`"))
    if num_parameters:
        rows.append(("Parameters", f"{num_parameters:,}"))
    config_yaml = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
    lines = [_front_matter({"license": _licence_id(base["license"]), "base_model": base["hub_id"],
                            "library_name": "transformers", "tags": list(dict.fromkeys(["cyb", "pause-tokens", settings.method]))}),
             f"# {title or out_name}: {what}\n",
             ("A causal LM that pauses for breath (cyb): after each real token it can output `<don't know>` "
              "and take another computation step on a `<pause>` input before it answers. "
              if settings.num_steps > 1 else "A causal LM trained without pauses (a baseline), written by cyb. ")
             + ("The folder holds LoRA adapters and loads with `cyb.model.PauseModel.from_pretrained` (with "
                "peft installed).\n" if adapters else
                "The folder loads with `cyb.model.PauseModel.from_pretrained`, and its weights with "
                "transformers' `AutoModelForCausalLM`.\n"),
             _table(rows),
             "\n## Held-out results\n",
             _results(valid_rows, _data_text(cfg)),
             "\n## Training command\n",
             "```bash\n" + (command or f"cyb train {Path(t.out_dir) / 'config.yaml'}") + "\n```\n",
             "The run's configuration (its `config.yaml`):\n",
             "```yaml\n" + config_yaml + "```\n",
             _use_section(settings)]
    return "\n".join(lines)


def _use_section(settings, folder: str = "FOLDER") -> str:
    adaptive = " --mode adaptive" if settings.dk_id is not None else ""
    return ("\n## Generate with cyb\n\n```bash\n"
            f"cyb generate {folder} --prompt \"Your prompt\"{adaptive} --shade\n```\n\n"
            f"FOLDER is this folder (or the run folder above it). `--shade` colours each token by the steps "
            "it took" + ("; `--mode adaptive` feeds a pause only when the model says `<don't know>`" if adaptive else "")
            + ".\n\n```python\nfrom cyb.generation import generate\nfrom cyb.model import PauseModel\n\n"
            "model = PauseModel.from_pretrained(\"FOLDER\")\n"
            "print(generate(model, [\"Your prompt\"], max_new_tokens=40)[0].text)\n```\n")


def merged_card(source_folder, settings, *, lora_base: str | None, run_dir=None) -> str:
    """The card of ``cyb merge``'s output: the run's card (when the adapters come from a run's
    ``final/``, whose numbers hold: merging gives the same logits), re-titled."""
    source_folder = Path(source_folder)
    text = None
    if run_dir is not None and (Path(run_dir) / "config.yaml").is_file():
        from .config import RunConfig
        from .metrics_log import read_metrics

        cfg = RunConfig.load(Path(run_dir) / "config.yaml")
        try:
            state = json.loads((source_folder / "training_state.json").read_text())
        except (OSError, ValueError):
            state = {}
        text = run_card(cfg, settings, valid_rows=read_metrics(run_dir, "valid"), state=state,
                        title=f"{Path(run_dir).name} (merged)", merged=True)
    note = (f"\n## Merged\n\nWritten by `cyb merge` from the LoRA folder `{source_folder}`: the adapters and pause "
            f"rows are folded into the weights of the base model `{lora_base}`, so this folder loads without "
            "peft and gives the same logits as the adapter folder (up to rounding).\n")
    if text is None:
        origin = base_origin(lora_base)
        rows = [("Base model", f"`{lora_base}`"),
                ("Licence", f"{origin['license']} (the base model's)" if origin["license"] else
                 "the base model's licence applies; cyb did not record it")] + _method_rows(settings)
        text = "\n".join([_front_matter({"license": _licence_id(origin["license"]), "base_model": origin["hub_id"],
                                         "library_name": "transformers", "tags": ["cyb", "pause-tokens"]}),
                          f"# {source_folder.name} (merged)\n", _table(rows),
                          "\nNo held-out numbers are recorded with the adapter folder; evaluate this one with "
                          "`cyb eval FOLDER --data SOURCE`.\n", _use_section(settings)])
    return text + note


def write_run_card(folder, trainer) -> Path | None:
    """Write the card of a :class:`~cyb.train.Trainer`'s final model into ``folder`` (before it is
    renamed into place).  A card that cannot be made is reported, not raised: the trained model
    is worth more than its description."""
    from .metrics_log import read_metrics

    try:
        text = run_card(trainer.cfg, trainer.model.settings, valid_rows=read_metrics(trainer.run_dir, "valid"),
                        state=trainer.training_state(), command=training_command(),
                        num_parameters=trainer.model.num_parameters())
        return write_card(folder, text)
    except Exception as e:  # noqa: BLE001
        print(f"warning: no model card written ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
        return None


def write_merged_card(folder, adapter_folder, settings) -> Path | None:
    """Write the card of ``cyb merge``'s output ``folder``, merged from ``adapter_folder``."""
    from .model.lora import read_lora_file

    adapter_folder = Path(adapter_folder)
    run_dir = adapter_folder.parent if (adapter_folder.parent / "config.yaml").is_file() else None
    try:
        base = read_lora_file(adapter_folder).get("base_model")
        return write_card(folder, merged_card(adapter_folder, settings, lora_base=base, run_dir=run_dir))
    except Exception as e:  # noqa: BLE001
        print(f"warning: no model card written ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
        return None


__all__ = ["base_origin", "merged_card", "run_card", "training_command", "write_merged_card", "write_run_card"]
