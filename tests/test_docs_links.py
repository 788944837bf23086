"""The docs point at files that exist: every relative Markdown link of README.md, the pages under
docs/ and results/README.md, and every script or test named in them (``experiments/run_suite.py``,
``bash benchmarks/run_gpu.sh``, ``tests/test_bench.py``...)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "results" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
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


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_install_commands_name_the_clone_not_the_package_index(page):
    """cyb is not on the package index: an extra is installed into the clone's .venv
    (``.venv/bin/pip install -e '.[lora]'`` or ``CYB_EXTRAS=lora bash scripts/setup.sh``)."""
    text = page.read_text(encoding="utf-8")
    assert not re.search(r"pip install[^\n`]*cyb\[", text), f"{page.relative_to(ROOT)} installs cyb[...] from the index"
    assert not re.search(r"(?m)^\s*pip install", text), f"{page.relative_to(ROOT)} runs a bare pip outside .venv"


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_the_readme_is_read_in_two_minutes():
    """At most 150 lines; the quick start's two commands as .ci/run and new users call them; one
    table of what holds (at most 8 rows, each linking its page); every section names its extras."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    sections = _sections(text)
    assert list(sections)[:3] == ["Quick start", "What the demo shows", "What holds"]
    quick = sections["Quick start"]
    assert "\nbash scripts/demo.sh " in quick and "\nbash scripts/test.sh " in quick
    rows = [line for line in sections["What holds"].splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert 1 <= len(rows) <= 8
    for row in rows:
        assert re.search(r"\]\((docs/[\w./-]+\.md)(#[\w-]+)?\)", row), row
    for name, body in sections.items():
        assert "extra" in body.lower(), f"the README's section {name!r} does not say which extras it needs"


def test_each_number_of_the_readmes_findings_is_on_the_page_it_links():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = [line for line in _sections(text)["What holds"].splitlines() if line.startswith("| ") and "](docs/" in line]
    for row in rows:
        measured = row.split(" | ")[1]
        page = re.search(r"\]\((docs/[\w./-]+\.md)", row).group(1)
        body = " ".join((ROOT / page).read_text(encoding="utf-8").split())
        for number in re.findall(r"\d[\d,.]*\d|\d", measured):
            assert number in body, f"{number} ({measured}) is not on {page}"


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub (and the site, mkdocs.yml's slugify) gives the headings of ``page``."""
    seen: dict[str, int] = {}
    out = set()
    text = re.sub(r"(?ms)^```.*?^```", "", page.read_text(encoding="utf-8"))
    for heading in re.findall(r"(?m)^#{1,6} (.+)$", text):
        plain = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", plain.strip().lower()).replace(" ", "-")
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def test_the_anchor_finder():
    page = ROOT / "docs" / "record" / "benchmarks" / "loss.md"
    assert "readout--loss-forward-and-backward-lossjson" in _anchors(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_into_a_page_name_one_of_its_headings(page):
    """README.md links into the guide and the record by anchors, which the site's strict build
    does not see (it checks the pages under docs/ only)."""
    text = page.read_text(encoding="utf-8")
    missing = []
    for target in LINK.findall(text):
        path, _, anchor = target.partition("#")
        if not anchor or not path.endswith(".md") or re.match(r"[a-z][a-z0-9+.-]*:", path):
            continue
        if anchor not in _anchors(page.parent / path):
            missing.append(target)
    assert not missing, f"{page.relative_to(ROOT)} links to headings that do not exist: {missing}"


CONFIG = re.compile(r"(?<![\w./-])(configs/[\w./-]+\.yaml)\b")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_configs_exist(page):
    missing = sorted({c for c in CONFIG.findall(page.read_text(encoding="utf-8")) if not (ROOT / c).is_file()})
    assert not missing, f"{page.relative_to(ROOT)} names configs that do not exist: {missing}"
