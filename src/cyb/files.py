"""Writing files so that a reader never sees half of one: a temporary file beside the target,
renamed into place. One home for the write-then-rename, for JSON that strict parsers read
(non-finite floats become null), and for the check, before long work, that its output path can
be written (:func:`unwritable`)."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any


def _temporary(path: Path, suffix: str = "") -> Path:
    return path.with_name(f"{path.stem}.tmp-{os.getpid()}{suffix or path.suffix}")


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically, creating its folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def unwritable(path: str | os.PathLike, *, folder: bool = False) -> str | None:
    """Why ``path`` could not be written, checked before the work whose results go there; None
    when it can (folders missing on the way are made when it is written).

    ``folder``: ``path`` is a folder to write files into, else a file.  The reasons:
    ``"runs/x is a file, not a folder"`` (``path`` or a folder on its way), ``"runs/x is a
    folder"`` (a file's path), ``"no permission to write in runs"`` (the nearest folder that
    exists)."""
    target = Path(path).expanduser()
    if folder and target.exists() and not target.is_dir():
        return f"{target} is a file, not a folder"
    if not folder and target.is_dir():
        return f"{target} is a folder"
    start = target if folder else target.parent
    nearest = start if str(start) else Path(".")
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    if not nearest.is_dir():
        return f"{nearest} is a file, not a folder"
    writable = target if folder and target.is_dir() else nearest
    if not os.access(writable, os.W_OK | os.X_OK):
        return f"no permission to write in {writable}"
    return None


def jsonable(x: Any) -> Any:
    """``x`` for strict JSON: non-finite floats as None; paths, dtypes, devices and other
    objects JSON does not know as their ``str``; tuples as lists; keys as strings."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if x is None or isinstance(x, (str, int, bool)):
        return x
    return str(x)


def write_json_atomic(path: str | os.PathLike, data: Any, *, indent: int | None = 1) -> Path:
    """Write ``data`` as strict JSON (see :func:`jsonable`) to ``path`` atomically."""
    return write_text_atomic(path, json.dumps(jsonable(data), indent=indent) + "\n")


def save_atomic(path: str | os.PathLike, save) -> Path:
    """Call ``save(tmp)`` on a temporary path beside ``path`` (same suffix), then rename it into
    place: for writers that take a file name (figures, tensors)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    save(tmp)
    os.replace(tmp, path)
    return path


def replace_dir(tmp: str | os.PathLike, target: str | os.PathLike) -> Path:
    """Put the finished folder ``tmp`` in the place of ``target`` (an older ``target`` is
    removed first; the rename itself is atomic)."""
    target = Path(target)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return target


__all__ = ["jsonable", "replace_dir", "save_atomic", "unwritable", "write_json_atomic", "write_text_atomic"]
