"""The models a run folder holds: its final model and the model of each of its checkpoints.

A run folder of ``cyb train`` (``config.yaml`` beside ``run.json``, ``final/`` or ``ckpt-*/``)
holds its model in ``final/`` once training has finished, and the model of step N in
``ckpt-N/`` while and after it trains.  Wherever a model is asked for (``model.name_or_path``,
``cyb generate``, ``cyb eval``, ``cyb merge``, the lm-eval model), a run folder stands for its
``final/`` and a checkpoint folder for the model it holds
(:func:`cyb.model.sources.resolve_model_source` asks this module).

A checkpoint holds weights and training state, not a model folder: its model is built as the run
built it (the configuration the checkpoint was written with: the run's tokenizer, the base model
or a fresh one, LoRA adapters), its weights are put in, and the result is written once as a model
folder in the cache, ``$CYB_CACHE/checkpoints/<key>`` (``key``: the first 16 hex digits of the
SHA-256 of the checkpoint's manifest, which covers every file's hash), with a model card that
names the run and the step.  The checkpoint itself is only read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

#: Written last into a checkpoint's model folder: the run, the checkpoint and its step.
CHECKPOINT_SOURCE = "cyb_checkpoint.json"
_CKPT_NAME = re.compile(r"^ckpt-(\d+)$")


def is_run_folder(path) -> bool:
    """A folder written by ``cyb train`` (its ``config.yaml`` beside ``run.json``, ``final/`` or a
    checkpoint) that is not itself a saved model."""
    p = Path(str(path)).expanduser()
    if not p.is_dir() or not (p / "config.yaml").is_file() or (p / "cyb_pause.json").is_file():
        return False
    return (p / "run.json").is_file() or (p / "final").is_dir() or any(_checkpoints(p))


def is_checkpoint(path) -> bool:
    """A training checkpoint folder (``ckpt-<step>`` with its ``meta.json``)."""
    p = Path(str(path)).expanduser()
    return p.is_dir() and _CKPT_NAME.match(p.name) is not None and (p / "meta.json").is_file()


def _checkpoints(run: Path) -> list[Path]:
    return sorted(p for p in run.iterdir() if _CKPT_NAME.match(p.name) and (p / "meta.json").is_file())


def run_final(run) -> Path:
    """The ``final/`` model of a run folder; ValueError saying what to give instead when the run
    has not finished (its newest checkpoint)."""
    from .model.lora import lora_folder

    run = Path(str(run)).expanduser()
    final = run / "final"
    if (final / "cyb_pause.json").is_file() or lora_folder(final) is not None:
        return final
    ckpts = _checkpoints(run)
    if ckpts:
        raise ValueError(f"{run} is a run folder whose training has not finished (no final/ model yet): give one "
                         f"of its checkpoints (the newest: {ckpts[-1]}), or finish it with cyb train")
    raise ValueError(f"{run} is a run folder whose training has not finished (no final/ model, no checkpoint "
                     "yet): finish it with cyb train")


def checkpoint_step(path) -> int:
    return int(_CKPT_NAME.match(Path(str(path)).name).group(1))


def checkpoint_key(ckpt: Path) -> str:
    """What names a checkpoint's model in the cache: its manifest's hash (its meta.json and the
    weights' size and time for a checkpoint written before manifests)."""
    h = hashlib.sha256()
    manifest = ckpt / "manifest.json"
    if manifest.is_file():
        h.update(manifest.read_bytes())
    else:
        h.update((ckpt / "meta.json").read_bytes())
        for f in sorted(ckpt.rglob("*")):
            if f.is_file():
                st = f.stat()
                h.update(f"{f.relative_to(ckpt)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def checkpoint_model(path, *, build: bool = True) -> Path | None:
    """The model folder of the checkpoint ``path`` (see the module docstring), built on first
    use; with ``build=False``, None when it was not built yet."""
    from .model.cache import cache_dir, locked, say

    ckpt = Path(str(path)).expanduser().resolve()
    folder = cache_dir() / "checkpoints" / checkpoint_key(ckpt)
    if (folder / CHECKPOINT_SOURCE).is_file():
        if build:
            say(f"{ckpt} is checkpoint step {checkpoint_step(ckpt)} of run {ckpt.parent}: its model is {folder}")
        return folder
    if not build:
        return None
    with locked(folder):
        if not (folder / CHECKPOINT_SOURCE).is_file():  # another process may have built it meanwhile
            say(f"{ckpt} is checkpoint step {checkpoint_step(ckpt)} of run {ckpt.parent}: writing the model it "
                f"holds once into {folder}")
            _build_checkpoint_model(ckpt, folder)
    return folder


def checkpoint_of(folder) -> dict | None:
    """``cyb_checkpoint.json`` of a checkpoint's model folder (run, checkpoint, step), or None."""
    try:
        data = json.loads((Path(str(folder)) / CHECKPOINT_SOURCE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _build_checkpoint_model(ckpt: Path, folder: Path) -> None:
    import torch

    from .build import build_model, build_tokenizer
    from .checkpoint import Checkpoint, load_checkpoint
    from .config import ConfigError, RunConfig
    from .distributed import DistInfo
    from .files import replace_dir
    from .model.lora import is_lora, load_trainable_state
    from .model.settings import TRAINING_STATE_FILE

    step = checkpoint_step(ckpt)
    meta = json.loads((ckpt / "meta.json").read_text(encoding="utf-8"))
    try:
        cfg = RunConfig.from_dict(meta.get("config") or {}).validate()
    except (ConfigError, ValueError) as e:
        raise ValueError(f"{ckpt}: the configuration in its meta.json does not load ({e})") from None
    run = ckpt.parent
    cfg.train.device = "cpu"
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
    (tmp / TRAINING_STATE_FILE).write_text(json.dumps({"step": step}, indent=2))
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
    from .objective import Objective
    from .train import LossModule

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
           "is_checkpoint", "is_run_folder", "model_folder", "run_final"]
