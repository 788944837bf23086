"""Run folders as the model layer reads them: where a ``cyb train`` run keeps its models.

A run folder (``config.yaml`` beside ``run.json``, ``final/`` or ``ckpt-*/``) holds its model in
``final/`` once training has finished.  A training checkpoint (``ckpt-<step>/`` with its
``meta.json``) holds weights and training state, not a model folder: the model it holds is
written once into the cache, ``$CYB_CACHE/checkpoints/<key>`` (``key``: the first 16 hex digits
of the SHA-256 of the checkpoint's manifest), by :mod:`cyb.run_models`, the training layer, which
builds the model as the run built it.

This module only reads: the paths of that layout and whether a checkpoint's model is in the
cache already.  :func:`cyb.model.sources.resolve_model_source` uses it, so that a run folder
stands for its ``final/`` and a checkpoint for its model wherever a model goes.
"""

from __future__ import annotations

import hashlib
import json
import re
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
    return (p / "run.json").is_file() or (p / "final").is_dir() or any(checkpoints(p))


def is_checkpoint(path) -> bool:
    """A training checkpoint folder (``ckpt-<step>`` with its ``meta.json``)."""
    p = Path(str(path)).expanduser()
    return p.is_dir() and _CKPT_NAME.match(p.name) is not None and (p / "meta.json").is_file()


def checkpoints(run: Path) -> list[Path]:
    """The checkpoint folders of a run folder, oldest first."""
    return sorted(p for p in run.iterdir() if _CKPT_NAME.match(p.name) and (p / "meta.json").is_file())


def run_final(run) -> Path:
    """The ``final/`` model of a run folder; ValueError saying what to give instead when the run
    has not finished (its newest checkpoint)."""
    from .lora import lora_folder

    run = Path(str(run)).expanduser()
    final = run / "final"
    if (final / "cyb_pause.json").is_file() or lora_folder(final) is not None:
        return final
    ckpts = checkpoints(run)
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


def checkpoint_folder(path) -> Path:
    """Where the model of the checkpoint ``path`` lives in the cache (written or not)."""
    from .cache import cache_dir

    return cache_dir() / "checkpoints" / checkpoint_key(Path(str(path)).expanduser().resolve())


def built_checkpoint_model(path) -> Path | None:
    """The model folder of the checkpoint ``path`` when it is in the cache already, else None."""
    folder = checkpoint_folder(path)
    return folder if (folder / CHECKPOINT_SOURCE).is_file() else None


def checkpoint_of(folder) -> dict | None:
    """``cyb_checkpoint.json`` of a checkpoint's model folder (run, checkpoint, step), or None."""
    try:
        data = json.loads((Path(str(folder)) / CHECKPOINT_SOURCE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def not_built(path) -> ValueError:
    """The error for a checkpoint whose model is not in the cache yet, where nothing may build it."""
    ckpt = Path(str(path)).expanduser().resolve()
    return ValueError(f"{ckpt} is checkpoint step {checkpoint_step(ckpt)} of run {ckpt.parent}, and the model it holds "
                      "is not in the cache yet: cyb.run_models.checkpoint_model(PATH) writes it there once (cyb "
                      "generate, eval, merge, serve and train do so when given the checkpoint)")


__all__ = ["CHECKPOINT_SOURCE", "built_checkpoint_model", "checkpoint_folder", "checkpoint_key", "checkpoint_of",
           "checkpoint_step", "checkpoints", "is_checkpoint", "is_run_folder", "not_built", "run_final"]
