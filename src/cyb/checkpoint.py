"""Atomic training checkpoints: written in full or not at all, the last ``k`` kept.

A checkpoint is a folder ``ckpt-<step>`` holding

* ``model.safetensors``: the full (unsharded) weights of the wrapped Hugging Face model
  (format ``full``; for a LoRA run only its trainable tensors, the frozen ones being the base
  model's), or ``shards/``: model and optimiser state written by every process with
  ``torch.distributed.checkpoint`` (format ``sharded``: no process gathers the whole model),
* ``trainer.pt``: optimiser (format ``full``) and scheduler state and RNG states, loaded with
  ``torch.load(weights_only=True)`` (no pickle of arbitrary objects),
* ``data.json``: the data iterator's position,
* ``meta.json``: step, format, metrics and config,
* ``manifest.json``: every other file's relative path, size and sha256, written last.

It is written into ``ckpt-<step>.tmp-<suffix>`` and renamed into place only when complete, so a
process killed while writing leaves at worst a temporary folder that is ignored and removed.
Both formats load at any world size.

A checkpoint damaged afterwards (a disk that fills up or fails, a copy cut short, a file
edited by hand) is found by :func:`verify_checkpoint`, which compares the files with the
manifest; :func:`newest_good_checkpoint` picks the newest one that verifies, which is what
training resumes from.  Checkpoints written before manifests existed are checked structurally
instead (every file present, JSON that parses, a safetensors header that reads back, a
``trainer.pt`` whose zip records all match their CRC-32); they count as intact but unverified.
Every read error on loading becomes one :class:`DamagedFileError` (a ValueError) naming the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import warnings
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
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


MANIFEST = "manifest.json"
#: What a damaged checkpoint file means for training, said after the reason.
CHECKPOINT_ADVICE = ("the checkpoint cannot be resumed from; training resumes from the newest intact "
                     "checkpoint instead (restore this one from a copy, or move it out of the run folder)")


class DamagedFileError(ValueError):
    """A saved file that cannot be read back: missing, truncated, corrupted, or changed since it
    was written.  ``path`` is the file, ``reason`` what is wrong with it; the message names both
    and says what to do."""

    def __init__(self, path, reason: str, advice: str = "", message: str | None = None):
        self.path = Path(path)
        self.reason = reason
        if message is None:
            message = f"{self.path} is damaged ({reason})" + (f": {advice}" if advice else "")
        super().__init__(message)

    def __reduce__(self):  # picklable, to pass between processes
        return (type(self), (self.path, self.reason, "", str(self)))


def _short(error: BaseException) -> str:
    """A one-line reason from a reader's exception (safetensors, torch.load, json, zipfile)."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    for prefix in ("Error while deserializing header: ",):
        if text.startswith(prefix):
            text = text[len(prefix):]
    if "PytorchStreamReader failed" in text:
        text = text.split(". ")[0]
    if len(text) > 160:
        text = text[:157] + "..."
    return text if text else type(error).__name__


def check_safetensors(path: str | Path, advice: str = "") -> None:
    """Raise :class:`DamagedFileError` unless ``path`` is a safetensors file whose header reads
    back and covers the whole file (cheap: reads the header only)."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            f.keys()
    except Exception as e:  # SafetensorError, OSError, ...
        raise DamagedFileError(path, _short(e), advice) from e


def check_zip(path: str | Path, advice: str = "", *, crc: bool = True) -> None:
    """Raise :class:`DamagedFileError` unless ``path`` (a ``torch.save`` file) is a readable zip
    archive; ``crc``: also read every record and compare it with its CRC-32."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip() if crc else None
    except Exception as e:  # BadZipFile, OSError, EOFError, ...
        raise DamagedFileError(path, f"not a readable torch.save archive: {_short(e)}", advice) from e
    if bad is not None:
        raise DamagedFileError(path, f"record {bad} does not match its CRC-32", advice)


def _read(path: Path, reader, advice: str):
    """``reader(path)``, with any read error turned into one :class:`DamagedFileError`."""
    try:
        return reader(path)
    except DamagedFileError:
        raise
    except Exception as e:
        raise DamagedFileError(path, _short(e), advice) from e


def _read_json(path: Path, advice: str = CHECKPOINT_ADVICE):
    return _read(path, lambda p: json.loads(p.read_text()), advice)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _sha256_all(paths: list[Path]) -> list[str]:
    """The sha256 of each file (hashlib releases the GIL: several files are hashed at once)."""
    if len(paths) <= 1:
        return [_sha256(p) for p in paths]
    with ThreadPoolExecutor(max_workers=min(8, len(paths))) as pool:
        return list(pool.map(_sha256, paths))


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
        try:
            dcp.load(state, checkpoint_id=str(ckpt.path / SHARDS), no_dist=_single_process())
        except Exception as e:  # a shard missing, cut short or unreadable
            raise DamagedFileError(ckpt.path / SHARDS, _short(e), CHECKPOINT_ADVICE) from e
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
    write_manifest(tmp)
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(run)
    _remove_old(run, final, keep_last)
    return final


def _remove_old(run: Path, newest: Path, keep_last: int) -> None:
    """Keep ``newest`` and the newest ``keep_last - 1`` other checkpoints that are intact (a
    quick check: files present, sizes as in the manifest); remove the rest, damaged ones
    included, which could never be resumed from.  An intact older checkpoint is thus never
    removed in favour of a damaged newer one."""
    kept = 1
    for old in reversed(list_checkpoints(run)):
        if old.path == newest:
            continue
        if kept < keep_last:
            try:
                verify_checkpoint(old, full=False)
            except DamagedFileError:
                pass
            else:
                kept += 1
                continue
        shutil.rmtree(old.path, ignore_errors=True)


def write_manifest(folder: str | Path) -> Path:
    """Write ``folder/manifest.json``: the relative path, size and sha256 of every other file
    under ``folder`` (call it once everything else is written)."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() != MANIFEST)
    digests = _sha256_all(files)
    entries = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": d}
               for p, d in zip(files, digests)}
    path = folder / MANIFEST
    _write_json(path, {"version": 1, "files": entries})
    _fsync_file(path)
    return path


def _as_checkpoint(ckpt) -> Checkpoint:
    if isinstance(ckpt, Checkpoint):
        return ckpt
    path = Path(ckpt)
    m = _NAME.match(path.name)
    return Checkpoint(path, int(m.group(1)) if m else -1)


def verify_checkpoint(ckpt: Checkpoint | str | Path, *, full: bool = True) -> bool:
    """Check a checkpoint's files; raise :class:`DamagedFileError` naming the first one that is
    missing or damaged.

    With a manifest: every listed file must be present with the listed size and, when ``full``,
    the listed sha256 (this reads every file).  Without one (written before manifests
    existed): the files must be present, ``meta.json``/``data.json`` must parse, the
    safetensors header must read back and ``trainer.pt`` must be a readable zip archive (and,
    when ``full``, match its CRC-32s); the shards of a sharded checkpoint are not checked.

    Returns True when the checkpoint was checked against its manifest, False when it has none
    (intact as far as can be told, but unverified).
    """
    ckpt = _as_checkpoint(ckpt)
    path = ckpt.path
    if not (path / "meta.json").is_file():
        raise DamagedFileError(path / "meta.json", "missing", "",
                               f"checkpoint {path} lacks meta.json: it is not a complete cyb checkpoint")
    meta = _read_json(path / "meta.json")
    if not isinstance(meta, dict):
        raise DamagedFileError(path / "meta.json", "not a JSON object", CHECKPOINT_ADVICE)
    sharded = meta.get("format", "full") == "sharded"
    weights = f"{SHARDS}/.metadata" if sharded else "model.safetensors"
    for name in (weights, "trainer.pt", "data.json", "meta.json"):
        if not (path / name).is_file():
            raise DamagedFileError(path / name, "missing", "",
                                   f"checkpoint {path} lacks {name}: it is not a complete cyb checkpoint")
    manifest = path / MANIFEST
    if manifest.is_file():
        listed = _read_json(manifest)
        listed = listed.get("files") if isinstance(listed, dict) else None
        if not isinstance(listed, dict) or not all(
                isinstance(e, dict) and isinstance(e.get("size"), int) and isinstance(e.get("sha256"), str)
                for e in listed.values()):
            raise DamagedFileError(manifest, "it does not list the files with their size and sha256",
                                   CHECKPOINT_ADVICE)
        names = sorted(listed)
        for name in names:
            f = path / name
            if not f.is_file():
                raise DamagedFileError(f, "missing: the manifest lists it", CHECKPOINT_ADVICE)
            size, want = f.stat().st_size, listed[name]["size"]
            if size != want:
                what = "truncated" if size < want else "longer than written"
                raise DamagedFileError(f, f"{what}: {size:,} bytes where the manifest says {want:,}",
                                       CHECKPOINT_ADVICE)
        if full:
            for name, digest in zip(names, _sha256_all([path / n for n in names])):
                if digest != listed[name]["sha256"]:
                    raise DamagedFileError(path / name, "its sha256 differs from the manifest: the file "
                                           "changed after it was written", CHECKPOINT_ADVICE)
        return True
    _read_json(path / "data.json")
    if not sharded:
        check_safetensors(path / "model.safetensors", CHECKPOINT_ADVICE)
    check_zip(path / "trainer.pt", CHECKPOINT_ADVICE, crc=full)
    return False


def newest_good_checkpoint(run_dir: str | Path, *, full: bool = True
                           ) -> tuple[Checkpoint | None, list[tuple[Path, str]]]:
    """``(checkpoint, skipped)``: the newest checkpoint in ``run_dir`` that passes
    :func:`verify_checkpoint` (None when none does), and ``(path, reason)`` of each newer one
    that did not, newest first."""
    skipped: list[tuple[Path, str]] = []
    for ckpt in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(ckpt, full=full)
        except DamagedFileError as e:
            try:
                name = e.path.relative_to(ckpt.path).as_posix()
            except ValueError:
                name = str(e.path)
            skipped.append((ckpt.path, f"{name} is {e.reason}" if e.reason == "missing" else
                            f"{name} is damaged ({e.reason})"))
            continue
        return ckpt, skipped
    return None, skipped


def checkpoint_format(ckpt: Checkpoint) -> str:
    """``"full"`` or ``"sharded"`` (checkpoints written before formats existed are full)."""
    return ckpt.meta.get("format", "full")


def load_checkpoint(ckpt: Checkpoint, map_location="cpu") -> tuple[dict | None, dict, dict, dict]:
    """``(model_state, trainer_state, data_state, meta)`` of a checkpoint; ``model_state`` is
    None for a sharded one (load it with :func:`load_sharded_state` once the model is set up).

    Weights load with safetensors and the trainer state with ``torch.load(weights_only=True)``.
    Files are checked against the manifest's sizes first (not its hashes: use
    :func:`verify_checkpoint` or :func:`newest_good_checkpoint` for that); a missing or
    unreadable file raises :class:`DamagedFileError` (a ValueError) naming it.
    """
    verify_checkpoint(ckpt, full=False)
    path = ckpt.path
    meta = _read_json(path / "meta.json")
    sharded = meta.get("format", "full") == "sharded"
    model_state = None if sharded else _read(
        path / "model.safetensors", lambda p: load_file(str(p), device=str(map_location)), CHECKPOINT_ADVICE)
    trainer_state = _read(path / "trainer.pt",
                          lambda p: torch.load(p, map_location=map_location, weights_only=True),
                          CHECKPOINT_ADVICE)
    data_state = _read_json(path / "data.json")
    return model_state, trainer_state, data_state, meta
