"""mkdocs hooks (mkdocs.yml): a page links a file of the repository outside docs/ (a figure in
results/, a config) by its relative path, as GitHub shows it; the site gets a copy of each such
file under ``_repo/`` and the link points at the copy, so the strict build checks that it exists."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

#: [text](target) and ![alt](target), with an optional title
LINK = re.compile(r"(!?\[[^\]]*\]\(\s*<?)([^)\s>]+)(>?(?:\s+\"[^\"]*\")?\s*\))")
PREFIX = "_repo"


def _root(config) -> Path:
    return Path(config.config_file_path).resolve().parent


def _outside(page_uri: str, target: str, config) -> str | None:
    """The repository path of ``target`` (relative to the page ``page_uri``) when it is a file
    outside docs/, else None."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return None
    docs = Path(config.docs_dir).resolve()
    path = (docs / posixpath.dirname(page_uri) / target.partition("#")[0]).resolve()
    if path == docs or docs in path.parents or not path.is_file():
        return None
    try:
        return path.relative_to(_root(config)).as_posix()
    except ValueError:
        return None


def on_files(files, config):
    for page in [f for f in files if f.is_documentation_page()]:
        for _, target, _ in LINK.findall(page.content_string):
            rel = _outside(page.src_uri, target, config)
            if rel and files.get_file_from_path(f"{PREFIX}/{rel}") is None:
                copy = File.generated(config, f"{PREFIX}/{rel}", abs_src_path=str(_root(config) / rel))
                copy.inclusion = InclusionLevel.NOT_IN_NAV
                files.append(copy)
    return files


def on_page_markdown(markdown, page, config, files):
    def point(m: re.Match) -> str:
        rel = _outside(page.file.src_uri, m.group(2), config)
        if rel is None:
            return m.group(0)
        anchor = m.group(2).partition("#")[2]
        target = posixpath.relpath(f"{PREFIX}/{rel}", posixpath.dirname(page.file.src_uri) or ".")
        return m.group(1) + target + (f"#{anchor}" if anchor else "") + m.group(3)

    return LINK.sub(point, markdown)
