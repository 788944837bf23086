"""Where a model comes from: ``model.name_or_path`` resolved to something ``transformers`` loads.

``model.name_or_path`` (and ``PauseModel.from_pretrained``, ``cyb generate``, ``cyb eval``)
takes any of:

* a **local folder** (a Hugging Face checkpoint, a saved cyb model or run's ``final/``): used
  as it is;
* a **GGUF file** (``*.gguf``): converted once into a plain model folder in the cache
  (:func:`cyb.model.gguf_convert.cached_conversion`, keyed by the file's content) and that
  folder is used from then on;
* a **known model's short name** (``smollm2-135m``; :mod:`cyb.model.zoo`), when no file or
  folder of that name exists: the folder ``cyb fetch`` wrote, fetched on first use;
* anything else, a **hub id** (``HuggingFaceTB/SmolLM2-135M-Instruct``): left to
  ``transformers``.

The cache is ``$CYB_CACHE`` (default ``~/.cache/cyb``): ``models/NAME`` for fetched models,
``gguf/KEY`` for converted GGUF files.  Everything in it is written beside its place and
renamed into it when complete, under a lock, so concurrent processes (torchrun ranks) never
see half a folder and convert or fetch only once.
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


def resolve_model_source(name_or_path, *, fetch: bool = True):
    """What ``transformers`` should load for ``name_or_path`` (see the module docstring).

    Returns a folder path (as a string) for GGUF files and known short names, else
    ``name_or_path`` unchanged (a folder, a hub id, None).  With ``fetch=False`` a known model
    that was not fetched yet, or a GGUF file not converted yet, is returned unchanged (nothing is
    fetched or converted).

    Raises FileNotFoundError for a ``.gguf`` path that does not exist, and ValueError
    (:class:`~cyb.model.zoo.FetchError`) when a known model has to be fetched and neither of
    its sources can be reached.
    """
    if name_or_path is None:
        return None
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_file() and is_gguf(text):
        from .gguf_convert import cached_conversion, cached_folder

        if not fetch:
            folder = cached_folder(path)
            return str(folder) if is_complete(folder) else name_or_path
        return str(cached_conversion(path))
    if path.exists():
        return name_or_path
    if is_gguf(text):
        raise FileNotFoundError(f"GGUF file {text} does not exist")
    from . import zoo

    known = zoo.find(text)
    if known is None:
        return name_or_path
    folder = zoo.model_dir(known.name)
    if is_complete(folder):
        return str(folder)
    if not fetch:
        return name_or_path
    say(f"{known.name} is not in the cache yet: fetching it once into {folder} (as `cyb fetch {known.name}` does)")
    return str(zoo.fetch(known.name))


def plain_model_kwargs(folder) -> dict:
    """``{"num_steps": 1}`` for a folder that holds a plain Hugging Face model (a config, weights
    and no pause settings), so that commands that load a saved cyb model also take a base model, as a no-pause
    baseline; ``{}`` otherwise."""
    from .settings import SETTINGS_FILE

    folder = Path(folder)
    if not folder.is_dir() or (folder / SETTINGS_FILE).is_file() or not (folder / "config.json").is_file():
        return {}
    weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
    return {"num_steps": 1} if any((folder / w).is_file() for w in weights) else {}


__all__ = ["CACHE_ENV", "SOURCE_FILE", "cache_dir", "file_sha256", "is_complete", "locked",
           "plain_model_kwargs", "read_source", "resolve_model_source", "temporary_folder"]
