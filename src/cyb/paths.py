"""Paths that travel: what a run or model folder writes down is absolute, and a relative path
read back from such a folder is taken relative to that folder.

A *spec* is what a configuration field holds: a local file, folder or glob, or something that
is not a path at all (``hf:NAME`` and ``builtin:NAME`` data sources, a hub model id such as
``HuggingFaceTB/SmolLM2-135M``).  Only a spec that names something that exists locally (a glob:
that matches a file) is changed; everything else is left as written, so hub ids keep working.
"""

from __future__ import annotations

import glob
import os
import re

#: Prefixes of data sources that are not paths.
SCHEMES = ("hf:", "builtin:")
_GLOB_CHARS = re.compile(r"[*?\[]")


def _is_scheme(spec: str) -> bool:
    return spec.startswith(SCHEMES)


def _exists(path: str) -> bool:
    if _GLOB_CHARS.search(path):
        return bool(glob.glob(path, recursive=True))
    return os.path.exists(path)


def looks_like_path(spec: str) -> bool:
    """Whether ``spec`` can only be a local path (not a hub id ``NAME`` or ``ORG/NAME``):
    absolute, starting with ``.`` or ``~``, with more than one ``/``, a backslash or a glob."""
    s = str(spec)
    return (s.startswith((".", "~", "/")) or os.path.isabs(s) or s.count("/") > 1 or "\\" in s
            or bool(_GLOB_CHARS.search(s)))


def local(spec: str | os.PathLike | None, base: str | os.PathLike | None = None) -> str | None:
    """``spec`` as an absolute path when it names something local relative to ``base`` (default:
    the working folder), else ``spec`` unchanged.

    ``~`` is expanded; symbolic links are kept (the path is made absolute, not resolved).
    """
    if spec is None:
        return None
    s = str(spec)
    if not s or _is_scheme(s):
        return s
    expanded = os.path.expanduser(s)
    if os.path.isabs(expanded):
        return os.path.normpath(expanded) if _exists(expanded) else s
    root = os.path.abspath(base) if base is not None else os.getcwd()
    candidate = os.path.normpath(os.path.join(root, expanded))
    return candidate if _exists(candidate) else s


def absolute(path: str | os.PathLike) -> str:
    """``path`` made absolute against the working folder, whether or not it exists yet (a run
    folder about to be written)."""
    return os.path.normpath(os.path.abspath(os.path.expanduser(str(path))))


def in_folder(spec: str | os.PathLike | None, folder: str | os.PathLike) -> str | None:
    """A spec read back from ``folder`` (a run or model folder): relative paths that exist
    there are taken from there; anything else is returned unchanged (an absolute path, a hub
    id, a path relative to the working folder written by an older version)."""
    if spec is None:
        return None
    s = str(spec)
    expanded = os.path.expanduser(s)
    if not s or _is_scheme(s) or os.path.isabs(expanded):
        return s
    candidate = os.path.normpath(os.path.join(os.path.abspath(folder), expanded))
    return candidate if _exists(candidate) else s


__all__ = ["SCHEMES", "absolute", "in_folder", "local", "looks_like_path"]
