"""The models a run folder holds, built: the model of each training checkpoint.

A run folder of ``cyb train`` holds its model in ``final/`` once training has finished, and the
model of step N in ``ckpt-N/`` while and after it trains.  Wherever a model is asked for
(``model.name_or_path``, ``cyb generate``, ``cyb eval``, ``cyb merge``, ``cyb serve``, the
lm-eval model), a run folder stands for its ``final/`` and a checkpoint folder for the model it
holds.  Reading that layout is the model layer's (:mod:`cyb.model.run_folders`); this module, of
the training layer (above :mod:`cyb.build`, below :mod:`cyb.train`), writes a checkpoint's model.

A checkpoint holds weights and training state, not a model folder: its model is built as the run
built it (the configuration the checkpoint was written with: the run's tokenizer, the base model
or a fresh one, LoRA adapters), its weights are put in, and the result is written once as a model
folder in the cache, ``$CYB_CACHE/checkpoints/<key>`` (:func:`cyb.model.run_folders.checkpoint_folder`),
with a model card that names the run and the step.  The checkpoint itself is only read.  The
commands call :func:`prepare` on the model they are given before they load it, so that the model
layer finds a checkpoint's model in the cache.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .model.run_folders import (CHECKPOINT_SOURCE, built_checkpoint_model, checkpoint_folder, checkpoint_key,
                                checkpoint_of, checkpoint_step, is_checkpoint, is_run_folder, run_final)


def checkpoint_model(path, *, build: bool = True) -> Path | None:
    """The model folder of the checkpoint ``path`` (see the module docstring), built on first
    use; with ``build=False``, None when it was not built yet."""
    from .model.cache import locked, say

    ckpt = Path(str(path)).expanduser().resolve()
    folder = checkpoint_folder(ckpt)
    if built_checkpoint_model(ckpt) is not None:
        if build:
            say(f"{ckpt} is checkpoint step {checkpoint_step(ckpt)} of run {ckpt.parent}: its model is {folder}")
        return folder
    if not build:
        return None
    with locked(folder):
        if built_checkpoint_model(ckpt) is None:  # another process may have built it meanwhile
            say(f"{ckpt} is checkpoint step {checkpoint_step(ckpt)} of run {ckpt.parent}: writing the model it "
                f"holds once into {folder}")
            _build_checkpoint_model(ckpt, folder)
    return folder


def prepare(name_or_path) -> None:
    """Before a model named ``name_or_path`` is loaded: when it is a training checkpoint, write the
    model it holds into the cache (once), where the model layer finds it (and says so when it
    loads it); nothing otherwise."""
    if name_or_path is not None and is_checkpoint(name_or_path) and built_checkpoint_model(name_or_path) is None:
        checkpoint_model(name_or_path)


def saved_model_folder(path, what: str = "MODEL_DIR", *, allow_plain: bool = False) -> Path:
    """:func:`cyb.model.sources.saved_model_folder` of ``path``, for a checkpoint once its model is
    written (:func:`prepare`): what the commands that load a model call."""
    from .model.sources import saved_model_folder as saved

    prepare(path)
    return saved(path, what, allow_plain=allow_plain)


def _build_checkpoint_model(ckpt: Path, folder: Path) -> None:
    import torch

    from .build import build_model, build_tokenizer
    from .checkpoint import Checkpoint, load_checkpoint
    from .config import ConfigError, RunConfig
    from .distributed import DistInfo
    from .files import replace_dir
    from .model.lora import is_lora, load_trainable_state
    from .model.settings import TRAINING_STATE_FILE
    from .run_data import trained_task

    step = checkpoint_step(ckpt)
    meta = json.loads((ckpt / "meta.json").read_text(encoding="utf-8"))
    try:
        cfg = RunConfig.from_dict(meta.get("config") or {}).validate()
    except (ConfigError, ValueError) as e:
        raise ValueError(f"{ckpt}: the configuration in its meta.json does not load ({e})") from None
    run = ckpt.parent
    cfg.train.device = "cpu"
    prepare(cfg.model.name_or_path)  # a run fine-tuned from another run's checkpoint
    torch.manual_seed(cfg.train.seed)
    if not (cfg.data.task or cfg.data.tokenizer or cfg.model.name_or_path) and not (run / "tokenizer").is_dir():
        raise ValueError(f"{ckpt} belongs to a run trained from scratch whose tokenizer ({run / 'tokenizer'}) is "
                         "missing: restore that folder beside the checkpoint")
    tokenizer = build_tokenizer(cfg, run, DistInfo())  # a from-scratch text run's is in run/tokenizer
    model = build_model(cfg, tokenizer)
    state, _, _, meta = load_checkpoint(Checkpoint(ckpt, step))
    if state is None:  # sharded: the model's part of the shards
        _load_sharded_model(ckpt, model, cfg)
    elif is_lora(model):
        load_trainable_state(model, state)
    else:
        model.load_hf_state_dict(state)
    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    (tmp / TRAINING_STATE_FILE).write_text(json.dumps({"step": step, **trained_task(cfg)}, indent=2))
    _write_card(tmp, cfg, model, run, step)
    (tmp / CHECKPOINT_SOURCE).write_text(json.dumps(
        {"run": str(run), "checkpoint": str(ckpt), "step": step, "key": folder.name}, indent=2))
    replace_dir(tmp, folder)


def _load_sharded_model(ckpt: Path, model, cfg) -> None:
    """The model's tensors of a sharded checkpoint (``torch.distributed.checkpoint``), read in one
    process into the module the run trained (model and objective), without the optimiser."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    from .checkpoint import CHECKPOINT_ADVICE, SHARDS, DamagedFileError, _short, _single_process_is_intended
    from .objective import LossModule, Objective

    module = LossModule(model, Objective(cfg.method, model.vocab, model.dk_bias, cfg.train.loss_impl))
    state = {"model": get_model_state_dict(module)}
    with _single_process_is_intended():
        try:
            dcp.load(state, checkpoint_id=str(ckpt / SHARDS), no_dist=True)
        except Exception as e:  # a shard missing, cut short or unreadable
            raise DamagedFileError(ckpt / SHARDS, _short(e), CHECKPOINT_ADVICE) from e
    set_model_state_dict(module, state["model"])


def _write_card(folder: Path, cfg, model, run: Path, step: int) -> None:
    """The model card: the run's card for the model of ``step``, titled as a checkpoint."""
    import sys

    from .files import write_text_atomic
    from .metrics_log import read_metrics
    from .run_card import run_card

    try:
        rows = [r for r in read_metrics(run, "valid") if int(r.get("step", -1)) <= step]
        text = run_card(cfg, model.settings, valid_rows=rows, state={"step": step},
                        num_parameters=model.num_parameters(),
                        title=f"{run.name}, checkpoint step {step}")
        write_text_atomic(folder / "README.md", text)
    except Exception as e:  # noqa: BLE001 - the model is worth more than its description
        print(f"warning: no model card written ({type(e).__name__}: {e})", file=sys.stderr, flush=True)


def model_folder(path, *, build: bool = True):
    """The folder that holds the model ``path`` names, when ``path`` is a run folder (its
    ``final/``) or a checkpoint (its model in the cache, built on first use unless ``build`` is
    False, then ``path`` unchanged); None for anything else."""
    if is_checkpoint(path):
        folder = checkpoint_model(path, build=build)
        return str(folder) if folder is not None else path
    if is_run_folder(path):
        return str(run_final(path))
    return None


__all__ = ["CHECKPOINT_SOURCE", "checkpoint_key", "checkpoint_model", "checkpoint_of", "checkpoint_step",
           "is_checkpoint", "is_run_folder", "model_folder", "prepare", "run_final", "saved_model_folder"]
