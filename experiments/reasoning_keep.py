"""Fold what a GPU call of the reasoning suite returned into the results kept in the repository.

    python experiments/reasoning_keep.py PACK.tar.gz [...] [--into results/experiments/reasoning]

Each pack (``reasoning.tar.gz`` of ``experiments/reasoning_gpu.sh``, or an unpacked suite
folder) adds its runs to ``--into``: the rows of ``summary.jsonl`` (per run the newest finished
row wins; a failed row is kept only while the run has none), the pilot's choice, and of each run
the small files that say what it did (its configuration, training curve, final metrics, the
eval's summary, the decode time measured alone, and the generated answers, gzipped); then the
tables and the figure are made again (``experiments/reasoning_report.py``).  The next GPU call
starts from this summary (``experiments/reasoning_gpu.sh`` copies it when its machine has none),
so finished runs are not run twice across sessions.  (The folding itself is
``experiments/keep_pack.py``'s, which keeps whole run folders for the other suites.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = str(Path(__file__).resolve().parents[1])
if REPO_ROOT not in sys.path:  # run as a script: the repository root holds experiments/
    sys.path.insert(0, REPO_ROOT)

from experiments.keep_pack import fold, unpacked  # noqa: E402

#: Files of a run kept in the repository (beside the gzipped answers).
KEEP = ("config.yaml", "metrics.jsonl", "final_metrics.json", "run.json", "eval/summary.txt",
        "eval/pause_stats.md", "eval/timing.json", "eval/ablations.json")
ANSWERS = "eval/reasoning_gym.jsonl"


def keep(folder: Path, into: Path) -> int:
    """Fold the suite folder ``folder`` into ``into``; returns the number of runs copied."""
    return fold(folder, into, runs="rg-*", files=KEEP + (ANSWERS,), gzipped=(ANSWERS,), logs=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("packs", nargs="+", type=Path, help="reasoning.tar.gz files or unpacked suite folders")
    p.add_argument("--into", type=Path, default=Path("results/experiments/reasoning"))
    args = p.parse_args(argv)
    for pack in args.packs:
        with unpacked(pack) as folder:
            n = keep(folder, args.into)
        print(f"{pack}: {n} finished runs kept in {args.into}")
    from experiments import reasoning_report

    return reasoning_report.main([str(args.into)])


__all__ = ["ANSWERS", "KEEP", "keep", "main"]

if __name__ == "__main__":
    sys.exit(main())
