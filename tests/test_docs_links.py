"""The docs point at files that exist: every relative Markdown link of README.md, docs/*.md and
results/README.md, and every script or test named in them (``experiments/run_suite.py``,
``bash benchmarks/run_gpu.sh``, ``tests/test_bench.py``...)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "results" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) and ![alt](target); a target ends at whitespace or the closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCRIPT = re.compile(r"(?<![\w./-])((?:experiments|benchmarks|scripts|tests)/[\w./-]+\.(?:py|sh))\b")


def links(text: str) -> list[str]:
    """Relative link targets of a Markdown text, without their #anchors (code blocks included)."""
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http:, mailto:, an anchor on the same page
        out.append(target.split("#", 1)[0])
    return out


def test_the_link_finder():
    text = "[a](docs/x.md#part) ![b](../y.png) [c](https://e.org) [d](#here) [e](<z.md>) `[f](g.md)`"
    assert links(text) == ["docs/x.md", "../y.png", "z.md", "g.md"]
    assert SCRIPT.findall("run `python experiments/run_suite.py` or bash benchmarks/a_b.sh; "
                          "not results/experiments/x.py") == ["experiments/run_suite.py", "benchmarks/a_b.sh"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    text = page.read_text(encoding="utf-8")
    missing = [t for t in links(text) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_scripts_exist(page):
    text = page.read_text(encoding="utf-8")
    missing = sorted({s for s in SCRIPT.findall(text) if not (ROOT / s).is_file()})
    assert not missing, f"{page.relative_to(ROOT)} names scripts that do not exist: {missing}"
