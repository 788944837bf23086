"""``cyb bench loss``: runs ``benchmarks/bench_loss.py`` (readout + loss, forward and backward).

The script lives beside the package in a source checkout (it is not installed with it); its
result gains ``kind = "loss"`` and the command line that produced it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .timing import write_json

SCRIPT = Path("benchmarks") / "bench_loss.py"

#: ``--quick``: a tiny float32 CPU run (the script's own ``--quick`` fixes larger sizes).
QUICK_ARGS = ["--device", "cpu", "--dtype", "fp32", "--vocab", "256", "--positions", "64", "128",
              "--hidden", "16", "--repeats", "1", "--check-size", "64", "256", "16"]


def script_path() -> Path:
    """``benchmarks/bench_loss.py`` of the source checkout holding this package, or of the
    working directory."""
    candidates = [Path(__file__).resolve().parents[3] / SCRIPT, Path.cwd() / SCRIPT]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"cannot find {SCRIPT} (looked in {', '.join(str(c.parent.parent) for c in candidates)}); "
        "the loss benchmark runs from a source checkout of cyb")


def _load(path: Path):
    spec = importlib.util.spec_from_file_location("cyb_benchmarks_bench_loss", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(argv: list[str], *, out: str | None, command: str) -> dict:
    """Run the script's ``main(argv)`` (``--out`` is added from ``out``); returns its result
    with ``kind`` and ``command`` added (and rewrites ``out`` with them)."""
    module = _load(script_path())
    full = list(argv) + (["--out", str(out)] if out is not None else [])
    result = module.main(full)
    result["kind"] = "loss"
    result["command"] = command
    write_json(out, result)
    return result
