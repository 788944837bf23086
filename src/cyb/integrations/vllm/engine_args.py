"""The engine arguments of a cyb model: what makes ``vllm serve RUN_FOLDER`` serve it.

vLLM's registries take new model classes, renderers and logits processors, but choosing them
for a model is left to the engine's arguments (``--hf-overrides``, ``--tokenizer-mode``,
``--logits-processors``...).  So that ``vllm serve RUN_FOLDER`` and ``vllm.LLM(RUN_FOLDER)``
need none of them, :func:`install` wraps vLLM's ``EngineArgs.create_model_config`` (the one step
every engine takes before it reads a model): when the model is a local cyb folder (a run folder,
its ``final/`` model or a checkpoint, as ``cyb serve`` takes them), :func:`prepare` sets

* ``model`` (and ``tokenizer``) to the folder that holds the model, ``served_model_name`` to what
  was given (so clients name the model as it was given);
* ``hf_overrides``: the pause layout (read by the readout, the renderer and the model class)
  and, for shared positions, the architecture ``CybShared<Arch>``
  (:mod:`cyb.integrations.vllm.model`) with ``max_position_embeddings`` ``M`` times the model's
  (real tokens keep their limit: vLLM counts pauses as tokens);
* ``tokenizer_mode`` ``cyb``: the Hugging Face tokenizer with the pause renderer
  (:mod:`cyb.integrations.vllm.renderer`);
* ``logits_processors``: the readout (:mod:`cyb.integrations.vllm.readout`);
* ``logprobs_mode`` ``processed_logits`` (unless set): a sampled token's logprob is its step
  code, so that fixed mode's steps can be read back.

Anything else (other folders, hub names) is left to vLLM as it is.  A cyb model that vLLM cannot
run is refused with one line that says why (:func:`cyb.integrations.vllm.pauses.refusal`).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from .pauses import ServedPauses, Unservable, read_config, refusal, settings_of

#: the tokenizer mode whose renderer lays prompts out with their pauses (registered by the plugin)
TOKENIZER_MODE = "cyb"
#: rope types whose rotary embedding reads no max_position_embeddings (the limit only sizes its table)
_PLAIN_ROPE = (None, "default", "linear", "llama3")


def install() -> None:
    """Wrap ``EngineArgs.create_model_config`` once (see the module docstring)."""
    from vllm.engine.arg_utils import EngineArgs

    current = EngineArgs.create_model_config
    if getattr(current, "_cyb_pauses", False):
        return

    @functools.wraps(current)
    def create_model_config(self):
        prepare(self)
        return current(self)

    create_model_config._cyb_pauses = True
    EngineArgs.create_model_config = create_model_config


def model_folder(given) -> Path | None:
    """The model folder of a local cyb folder (run folder, model folder, checkpoint), else None.
    A run folder whose training has not finished is refused."""
    if not isinstance(given, (str, os.PathLike)):
        return None
    path = Path(str(given)).expanduser()
    if not path.is_dir():
        return None
    from ...model.sources import resolve_model_source

    try:
        folder = Path(str(resolve_model_source(str(path))))
    except ValueError as e:
        raise Unservable(str(e).splitlines()[0]) from None
    return folder if settings_of(folder) is not None else None


def refuse(reason: str):
    """Stop with ``reason``: one line on standard error under the ``vllm`` command, else a
    :class:`~cyb.integrations.vllm.pauses.Unservable` error."""
    message = f"cyb: {reason}"
    if Path(sys.argv[0]).name == "vllm":
        raise SystemExit(message)
    raise Unservable(message)


def _check_tokenizer(folder: Path, pauses: ServedPauses) -> str | None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = sorted(pauses.special_ids)
    if ids and tok.decode(ids, skip_special_tokens=True).strip():
        return (f"{folder}: its tokenizer does not mark the pause and dk tokens as special, so vLLM would put "
                "them in the text; serve it with `cyb serve MODEL` instead")
    return None


def overrides(folder: Path, pauses: ServedPauses) -> dict:
    """The ``hf_overrides`` of a pause model (see the module docstring)."""
    from .model import shared_name
    from .readout import CONFIG_KEY, config_value

    out = {CONFIG_KEY: config_value(pauses)}
    if not pauses.shared_positions or pauses.num_steps == 1:
        return out
    cfg = read_config(folder)
    archs = cfg.get("architectures") or []
    if len(archs) != 1:
        refuse(f"{folder}: config.json must name one architecture, got {archs!r}")
    out["architectures"] = [shared_name(archs[0])]
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
    limit = cfg.get("max_position_embeddings")
    if isinstance(limit, int) and rope_type in _PLAIN_ROPE:
        out["max_position_embeddings"] = limit * pauses.num_steps
    return out


def prepare(args) -> None:
    """Set ``args`` (vLLM's ``EngineArgs``) for the cyb model it names, refuse one vLLM cannot
    run, or leave ``args`` alone when it names no cyb model."""
    from .readout import readout_class

    given = args.model
    try:
        folder = model_folder(given)
    except Unservable as e:
        refuse(str(e))
    if folder is None:
        return
    settings = settings_of(folder)
    reason = refusal(folder, settings)
    if reason is None:
        pauses = ServedPauses.of(settings)
        reason = _check_tokenizer(folder, pauses)
    if reason is not None:
        refuse(reason)
    if args.tokenizer_mode not in ("auto", "hf", TOKENIZER_MODE):
        refuse(f"tokenizer_mode {args.tokenizer_mode!r}: a pause model needs its Hugging Face tokenizer "
               "(leave --tokenizer-mode out)")
    ours = overrides(folder, pauses)
    if callable(args.hf_overrides):
        theirs = args.hf_overrides

        def combined(config):
            config = theirs(config)
            config.update(ours)
            return config

        args.hf_overrides = combined
    else:
        args.hf_overrides = {**(args.hf_overrides or {}), **ours}
    if args.tokenizer in (None, given):
        args.tokenizer = str(folder)
    if args.served_model_name is None:
        args.served_model_name = str(given)
    args.model = str(folder)
    args.tokenizer_mode = TOKENIZER_MODE
    readout = readout_class(pauses)
    procs = [p for p in (args.logits_processors or []) if p != readout]
    args.logits_processors = [*procs, readout]
    if args.logprobs_mode == "raw_logprobs":
        args.logprobs_mode = "processed_logits"
    _say(f"cyb: {given}: the pause model in {folder} (M = {pauses.num_steps}, {pauses.position_scheme} positions, "
         f"default mode {pauses.default_mode}; pause ids {list(pauses.pause_ids)}, dk id {pauses.dk_id})")


def _say(line: str) -> None:
    """One line through vLLM's logger (its handlers print the lines of loggers named vllm.*)."""
    import logging

    logging.getLogger("vllm.cyb").info(line)


__all__ = ["TOKENIZER_MODE", "install", "model_folder", "overrides", "prepare", "refuse"]
