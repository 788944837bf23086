"""The model cache: where fetched and converted models live, and how they are written.

``$CYB_CACHE`` (default ``~/.cache/cyb``) holds ``models/NAME`` for fetched models and
``gguf/KEY`` for converted GGUF files.  Everything in it is written beside its place and
renamed into it when complete, under a lock, so concurrent processes (torchrun ranks) never
see half a folder and convert or fetch only once.  :mod:`cyb.model.sources` says how a
``model.name_or_path`` finds its folder here.
"""


from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from pathlib import Path

CACHE_ENV = "CYB_CACHE"
GGUF_SUFFIX = ".gguf"
#: Written last into a fetched or converted folder: where it came from (and its licence).
SOURCE_FILE = "cyb_source.json"


def cache_dir() -> Path:
    """The cache folder: ``$CYB_CACHE``, else ``$XDG_CACHE_HOME/cyb``, else ``~/.cache/cyb``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache").resolve() / "cyb"


def say(message: str) -> None:
    """One line of progress on stderr (standard output stays the commands' own)."""
    print(message, file=sys.stderr, flush=True)


def is_gguf(name_or_path) -> bool:
    return str(name_or_path).lower().endswith(GGUF_SUFFIX)


def is_complete(folder: Path) -> bool:
    """Whether a fetched or converted folder was finished (its source file is written last)."""
    return (folder / SOURCE_FILE).is_file() and (folder / "config.json").is_file()


def read_source(folder) -> dict | None:
    """``cyb_source.json`` of a fetched or converted folder, or None."""
    try:
        data = json.loads((Path(folder) / SOURCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@contextlib.contextmanager
def locked(target: Path):
    """Hold an exclusive lock on ``target`` (a lock file beside it) while the block runs.

    Other processes asking for the same target wait; where ``fcntl`` is missing (Windows) the
    block runs unlocked (a second writer then loses the final rename and uses the first one's
    folder).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.parent / f".{target.name}.lock"
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(lock, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def temporary_folder(target: Path) -> Path:
    """A fresh, empty folder beside ``target`` to build it in (same file system: the final
    rename is atomic); any left by a killed process for the same target is removed first
    (call it under :func:`locked`)."""
    import shutil

    for stale in target.parent.glob(f".{target.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True)
    return tmp


def file_sha256(path: Path, *, memo: Path | None = None) -> str:
    """The SHA-256 of a file's content (hex).  With ``memo`` (a JSON file), a file whose path,
    size and modification time are unchanged is not read again."""
    path = Path(path).resolve()
    st = path.stat()
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    known = {}
    if memo is not None:
        try:
            known = json.loads(memo.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            known = {}
        if isinstance(known, dict) and isinstance(known.get(key), str):
            return known[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    digest = h.hexdigest()
    if memo is not None:
        from ..files import write_json_atomic

        known = {k: v for k, v in known.items() if not k.startswith(f"{path}|")} if isinstance(known, dict) else {}
        known[key] = digest
        try:
            write_json_atomic(memo, known)
        except OSError:  # a read-only cache still works, it only hashes again
            pass
    return digest


__all__ = ["CACHE_ENV", "GGUF_SUFFIX", "SOURCE_FILE", "cache_dir", "file_sha256", "is_complete", "is_gguf",
           "locked", "read_source", "say", "temporary_folder"]
