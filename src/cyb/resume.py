"""Resuming a run: which configuration fields a checkpoint must share with the run that resumes
it, and the random state a checkpoint keeps."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from .config import RunConfig, local_paths


def rng_state() -> dict:
    """The random state a checkpoint keeps: torch's (CPU and every GPU) and Python's."""
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore :func:`rng_state` (the GPUs' only when there are as many as when it was taken)."""
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(int(x) for x in state["python"]), None))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


# Fields that must agree between a checkpoint and the configuration resuming it (None = all).
_RESUME_FIELDS = {
    "model": None,
    "method": None,
    "lora": None,
    "data": ("tokenizer", "bpe_vocab_size", "bpe_train_docs", "block_len", "task", "task_kwargs",
             "num_train_examples", "shuffle", "shuffle_buffer", "fraction", "fraction_seed"),
    "train": ("seed", "batch_size"),
}
_RESUME_FREE = {"model": ("gradient_checkpointing", "attn_implementation", "dtype", "pause_init")}


class CannotResume(ValueError):
    """``train.out_dir`` holds checkpoints this run cannot resume from (another run's, damaged
    ones, a later step than ``train.steps``, or ``train.resume`` is false)."""


def check_resumable(saved: dict, cfg: RunConfig, where: Path) -> None:
    """Raise ValueError naming the first field in which a checkpoint's run differs from ``cfg``
    (paths compared as absolute paths: a checkpoint of an older version may hold them relative)."""
    now = local_paths(cfg.to_dict())
    saved = local_paths(saved)
    defaults = RunConfig().to_dict()  # a section the checkpoint's version did not have yet
    for section, names in _RESUME_FIELDS.items():
        keys = names if names is not None else [k for k in now[section] if k not in _RESUME_FREE.get(section, ())]
        for key in keys:
            # a section or field the checkpoint's version did not have yet: its default
            before = saved[section].get(key, defaults[section][key]) if section in saved else defaults[section][key]
            after = now[section][key]
            if before != after:
                raise CannotResume(
                    f"train.out_dir ({where}) holds checkpoints of another run: {section}.{key} was "
                    f"{before!r}, now {after!r}; use another train.out_dir (or move its checkpoints out of it)")


__all__ = ["CannotResume", "check_resumable", "rng_state", "set_rng_state"]
