"""Atomic training checkpoints: written in full or not at all, the last ``k`` kept.

A checkpoint is a folder ``ckpt-<step>`` holding

* ``model.safetensors``: the full (unsharded) weights of the wrapped Hugging Face model
  (format ``full``), or ``shards/``: model and optimiser state written by every process with
  ``torch.distributed.checkpoint`` (format ``sharded``: no process gathers the whole model),
* ``trainer.pt``: optimiser (format ``full``) and scheduler state and RNG states, loaded with
  ``torch.load(weights_only=True)`` (no pickle of arbitrary objects),
* ``data.json``: the data iterator's position,
* ``meta.json``: step, format, metrics and config, written last.

It is written into ``ckpt-<step>.tmp-<suffix>`` and renamed into place only when complete, so a
process killed while writing leaves at worst a temporary folder that is ignored and removed.
Both formats load at any world size.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

_NAME = re.compile(r"^ckpt-(\d+)$")
#: Fault injection for tests, a comma-separated list of:
#: ``checkpoint_write`` (SIGKILL this process while writing any checkpoint),
#: ``checkpoint_write@N`` (only the checkpoint of step N),
#: ``step_delay=S`` (sleep S seconds after each optimiser step, to give a test time to act).
FAULT_ENV = "CYB_FAULT_INJECT"


def fault(name: str) -> str | None:
    """The setting of fault ``name`` in ``$CYB_FAULT_INJECT``: ``""`` when named without a
    value, the text after ``@`` or ``=`` when given one, None when absent."""
    for item in os.environ.get(FAULT_ENV, "").split(","):
        item = item.strip()
        if item == name:
            return ""
        for sep in ("@", "="):
            if item.startswith(name + sep):
                return item[len(name) + 1:]
    return None


def _kill_if_injected(step: int) -> None:
    spec = fault("checkpoint_write")
    if spec is not None and (spec == "" or int(spec) == step):
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class Checkpoint:
    path: Path
    step: int

    @property
    def meta(self) -> dict:
        return json.loads((self.path / "meta.json").read_text())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True))


def list_checkpoints(run_dir: str | Path) -> list[Checkpoint]:
    """Complete checkpoints in ``run_dir``, oldest first."""
    d = Path(run_dir)
    if not d.is_dir():
        return []
    out = []
    for p in d.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_dir() and (p / "meta.json").is_file():
            out.append(Checkpoint(p, int(m.group(1))))
    return sorted(out, key=lambda c: c.step)


def latest_checkpoint(run_dir: str | Path) -> Checkpoint | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def _contiguous_cpu(state: dict) -> dict:
    out = {}
    seen: dict[int, str] = {}
    for k, v in state.items():
        t = v.detach().to("cpu").contiguous()
        # safetensors refuses shared storage (tied weights): store a copy
        key = t.untyped_storage().data_ptr() if t.numel() else id(t)
        if key in seen:
            t = t.clone()
        seen[key] = k
        out[k] = t
    return out


SHARDS = "shards"
FORMATS = ("full", "sharded")


def begin_checkpoint(run_dir: str | Path, step: int, suffix: str | None = None) -> Path:
    """Remove stale temporary folders and create the one ``ckpt-<step>`` is written into.

    ``suffix`` (default: this process id) must be the same on every process that writes into
    it (a sharded checkpoint: call this on one process, then wait at a barrier)."""
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    for stale in run.glob("ckpt-*.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = temporary_dir(run, step, suffix)
    tmp.mkdir()
    return tmp


def temporary_dir(run_dir: str | Path, step: int, suffix: str | None = None) -> Path:
    """Where ``ckpt-<step>`` is written before it is renamed into place."""
    return Path(run_dir) / f"ckpt-{step:08d}.tmp-{suffix or os.getpid()}"


def _single_process() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def _single_process_is_intended():
    """Silence torch's notice that a checkpoint is written without a process group."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to (save|load) in a single process")
        yield


def save_sharded_state(tmp: Path, module: torch.nn.Module, optimizer) -> None:
    """Write the model's and the optimiser's state into ``tmp/shards`` with
    ``torch.distributed.checkpoint``: each process writes its own shards (FSDP2), replicas are
    written once (DDP).  A collective under torchrun: call it on every process."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(module, optimizer)
    with _single_process_is_intended():
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp / SHARDS),
                 no_dist=_single_process())


def load_sharded_state(ckpt: "Checkpoint", module: torch.nn.Module, optimizer) -> None:
    """Load ``shards/`` of a sharded checkpoint into ``module`` and ``optimizer`` as they are
    now set up (sharded or not, at any world size).  A collective under torchrun."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(module, optimizer)
    state = {"model": model_state, "optim": optim_state}
    with _single_process_is_intended():
        dcp.load(state, checkpoint_id=str(ckpt.path / SHARDS), no_dist=_single_process())
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model_state: dict | None,
    trainer_state: dict,
    data_state: dict,
    meta: dict,
    keep_last: int = 2,
    tmp: Path | None = None,
) -> Path:
    """Write ``ckpt-<step>`` atomically and delete all but the newest ``keep_last``.

    ``model_state``: the full weights (format ``full``), or None when ``tmp`` (from
    :func:`begin_checkpoint`) already holds ``shards/`` (format ``sharded``).
    ``trainer_state`` holds tensors and plain Python values only (it is read back with
    ``weights_only=True``); ``data_state`` and ``meta`` must be JSON-serialisable.
    """
    run = Path(run_dir)
    final = run / f"ckpt-{step:08d}"
    if tmp is None:
        tmp = begin_checkpoint(run, step)
    if model_state is not None:
        save_file(_contiguous_cpu(model_state), str(tmp / "model.safetensors"))
        _fsync_file(tmp / "model.safetensors")
        fmt = "full"
    elif (tmp / SHARDS / ".metadata").is_file():
        fmt = "sharded"
    else:
        raise ValueError(f"{tmp}: give model_state or write the shards first (save_sharded_state)")
    _kill_if_injected(step)
    torch.save(trainer_state, tmp / "trainer.pt")
    _fsync_file(tmp / "trainer.pt")
    _write_json(tmp / "data.json", data_state)
    _write_json(tmp / "meta.json", {**meta, "step": step, "format": fmt})
    _fsync_file(tmp / "meta.json")
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(run)
    for old in list_checkpoints(run)[:-keep_last]:
        shutil.rmtree(old.path, ignore_errors=True)
    return final


def checkpoint_format(ckpt: Checkpoint) -> str:
    """``"full"`` or ``"sharded"`` (checkpoints written before formats existed are full)."""
    return ckpt.meta.get("format", "full")


def load_checkpoint(ckpt: Checkpoint, map_location="cpu") -> tuple[dict | None, dict, dict, dict]:
    """``(model_state, trainer_state, data_state, meta)`` of a checkpoint; ``model_state`` is
    None for a sharded one (load it with :func:`load_sharded_state` once the model is set up).

    Weights load with safetensors and the trainer state with ``torch.load(weights_only=True)``;
    a missing or unreadable file raises ValueError naming it.
    """
    sharded = checkpoint_format(ckpt) == "sharded"
    weights = f"{SHARDS}/.metadata" if sharded else "model.safetensors"
    for name in (weights, "trainer.pt", "data.json", "meta.json"):
        if not (ckpt.path / name).is_file():
            raise ValueError(f"checkpoint {ckpt.path} lacks {name}: it is not a complete cyb checkpoint")
    model_state = None if sharded else load_file(str(ckpt.path / "model.safetensors"),
                                                 device=str(map_location))
    trainer_state = torch.load(ckpt.path / "trainer.pt", map_location=map_location, weights_only=True)
    data_state = json.loads((ckpt.path / "data.json").read_text())
    return model_state, trainer_state, data_state, ckpt.meta
