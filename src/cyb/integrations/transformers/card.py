"""The model card (``README.md``) of a folder a Trainer saved with pauses: base model and licence,
method, M, pause visibility, LoRA, the optimiser steps taken and the last held-out numbers the
Trainer logged (none when it logged none), and how to generate from it."""

from __future__ import annotations

import sys
from pathlib import Path

from ... import methods
from ...model.card import _front_matter, _licence_id, _table, write_card
from ...model.lora import is_lora
from ...run_card import _method_rows, _use_section, base_origin


def _held_out(history: list[dict]) -> str:
    rows = [r for r in history if "eval_ppl" in r]
    if not rows:
        return "The Trainer logged no held-out evaluation, so this card reports no perplexity.\n"
    r = rows[-1]
    steps = f", E[S] {r['eval_mean_steps']:.3f}" if "eval_mean_steps" in r else ""
    return (f"The last evaluation the Trainer logged (step {r.get('step', '?')}): held-out perplexity "
            f"{r['eval_ppl']:.2f} (loss {r['eval_nll']:.4f}){steps} over {int(r.get('eval_targets', 0)):,} "
            "target tokens of its evaluation data set.\n")


def trainer_card(model, *, step: int | None, history: list[dict], trainer_name: str) -> str:
    """The card text for a :class:`~cyb.integrations.transformers.PauseTrainingModel` after
    ``step`` optimiser steps of ``trainer_name`` (``history``: the Trainer's ``log_history``)."""
    pm = model.pause_model
    base = base_origin(getattr(pm.hf_model, "name_or_path", None) or None)
    label = methods.label(model.method)
    rows = [("Base model", f"`{base['name']}`" if base["name"] else "a model built in the training script"),
            ("Licence", f"{base['license']} (the base model's)" if base["license"] else
             "the base model's licence applies; cyb did not record it")]
    rows += _method_rows(pm.settings, model.method)
    if is_lora(pm):
        rows.append(("LoRA", "this folder holds the adapters and the pause rows (`cyb merge` writes a plain model)"))
    rows.append(("Training", f"{step if step is not None else '?'} optimiser steps of `{trainer_name}` "
                             "(cyb.integrations.transformers)"))
    lines = [_front_matter({"license": _licence_id(base["license"]), "base_model": base["hub_id"],
                            "library_name": "transformers",
                            "tags": list(dict.fromkeys(["cyb", "pause-tokens", pm.settings.method]))}),
             f"# {base['name'] or 'A model'} fine-tuned with {label}\n",
             "A causal LM that pauses for breath (cyb), trained in a transformers Trainer script. The folder "
             "loads with `cyb.model.PauseModel.from_pretrained`; `cyb generate` and `cyb eval FOLDER --data "
             "SOURCE` read it.\n",
             _table(rows), "\n## Held-out results\n", _held_out(history), _use_section(pm.settings)]
    return "\n".join(lines)


def write_trainer_card(folder, model, *, step, history, trainer_name) -> Path | None:
    """Write :func:`trainer_card` into ``folder``; a card that cannot be made is reported, not raised."""
    try:
        return write_card(folder, trainer_card(model, step=step, history=history, trainer_name=trainer_name))
    except Exception as e:  # noqa: BLE001 - the saved model is worth more than its description
        print(f"warning: no model card written ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
        return None


__all__ = ["trainer_card", "write_trainer_card"]
