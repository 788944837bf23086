"""The package's imports: no circle, and no module imports one of a layer above its own (the
layers of docs/concepts/architecture.md, read from its table)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import cyb

PACKAGE = Path(cyb.__file__).parent
ARCHITECTURE = PACKAGE.parent.parent / "docs" / "concepts" / "architecture.md"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports, at the top or inside a function (``from . import
    x`` names the module ``x`` when it is one, else the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "cyb")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "cyb":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {name: _imports(name, path, known) for name, path in mods.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return out


def layers() -> dict[str, int]:
    """``{path prefix: layer number}`` from the table of docs/concepts/architecture.md: a row's modules are
    the backticked names of its second column (``model/`` a package, ``files.py`` a module)."""
    table = ARCHITECTURE.read_text(encoding="utf-8").split("## The modules and what each owns", 1)[1]
    table = table.split("\n## ", 1)[0]  # that section only: later sections have tables of their own
    order: list[str] = []
    out: dict[str, int] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("layer", "---") or set(cells[0]) <= {"-", " "} and cells[0]:
            continue
        if cells[0]:
            order.append(cells[0])
        for name in re.findall(r"`([\w/]+(?:\.py|/))`", cells[1]):
            out.setdefault(name, len(order) - 1)
    return out


def layer_of(module: str, table: dict[str, int]) -> int | None:
    rel = module.split(".", 1)[1] if "." in module else ""
    path = rel.replace(".", "/")
    best = None
    for name, layer in table.items():
        key = name[:-3] if name.endswith(".py") else name.rstrip("/")
        if path == key or path.startswith(key + "/"):
            if best is None or len(key) > len(best[0]):
                best = (key, layer)
    if best is None and path:  # a package named only through its modules: the lowest of their layers
        inner = [layer for name, layer in table.items() if name.startswith(path + "/")]
        return min(inner) if inner else None
    return None if best is None else best[1]


def test_no_module_imports_itself_round_a_circle():
    circles = _circles(import_graph())
    assert not circles, f"import circles (break each by moving what the lower module needs down): {circles}"


def test_the_architecture_table_names_every_module():
    table = layers()
    missing = sorted(m for m in import_graph() if m not in ("cyb", "cyb.__main__") and layer_of(m, table) is None)
    assert not missing, f"modules the layer table of docs/concepts/architecture.md does not name: {missing}"


def test_no_module_imports_one_of_a_higher_layer():
    table = layers()
    up = []
    for module, targets in import_graph().items():
        mine = layer_of(module, table)
        if mine is None:
            continue
        for target in sorted(targets):
            theirs = layer_of(target, table)
            if theirs is not None and theirs > mine:
                up.append(f"{module} -> {target}")
    assert not up, f"imports of a higher layer (docs/concepts/architecture.md): {up}"
