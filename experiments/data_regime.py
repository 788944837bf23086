"""Does pausing pay? The paper's data-regime figure on SmolLM2-135M, and what is left at convergence.

    python experiments/data_regime.py plan                                    # the cells, what finished, the estimate
    python experiments/data_regime.py time --out outputs/data-regime-time    # a step's time per row (a GPU)
    python experiments/data_regime.py run --out outputs/data-regime --gpus 0 --per-gpu 2 \\
        --deadline 1500 --pack OUT/data-regime.tar.gz                          # the cells not finished yet

A cell is a row in a regime with a seed (``dr-ROW-REGIME-sSEED``, ``experiments/data_regime_cells.py``):
rows Baseline, TBYS 3 pauses private, CYB 3 pauses private, CYB 3 pauses private with pause-step
adapters (rank 16), and Baseline 4xseq (four times the context for the regime's steps: compute-matched,
four passes over the regime's documents) in 1x1 and 1x3 only; regimes 1x1 (a seeded third of
techdocs' training documents, one pass), 2x1 (two passes over that third), 1x2 (two thirds, which
hold that third) and 1x3 (all of it).  Past 1x3 the baseline and the CYB row best at 1x3 run 2x3,
3x3, and one more pass each time the last one improved (``data_regime_report.convergence_regimes``).

Every cell fine-tunes SmolLM2-135M (``$CYB_SMOLLM2``, else ``cyb fetch smollm2-135m``'s folder) on
techdocs (``$CYB_DATA``) as the ``smollm2-epoch`` scale of ``run_suite.py`` does (blocks of 256 real
tokens, batch 32, lr 1e-4 with 50 warmup steps, bf16 autocast, compiled decoder layers), for
``train.epochs`` passes over ``data.fraction`` of the training documents (the choice seeded by the
cell's seed, which also sets the data order), so each has its own schedule to its own end.  It is
evaluated once, at its end, on the in-distribution part of the held-out file (the same rows in
every cell).  Seed 0 of every figure cell runs first, then seed 1, then the convergence cells,
then the third seeds the report asks for (two seeds further apart than a third of the gap read
there); within each group the longest first.  ``summary.jsonl`` gets a row per finished cell (the
command that reruns it beside it) and ``--pack`` a ``.tar.gz`` of the results (no weights) after
each; finished cells are skipped, and a cell cut by ``--deadline`` resumes from its checkpoint (a
quarter of its steps) while the machine keeps ``--out``.  ``experiments/data_regime_gpu.sh`` runs
this on the GPU machine; ``experiments/data_regime_report.py`` makes the tables and the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the repository root holds experiments/
    sys.path.insert(0, str(REPO))

from experiments import data_regime_cells as dc  # noqa: E402
from experiments import data_regime_report as report  # noqa: E402
from experiments.data_regime_plan import (cell_config, estimate, expected_seconds, load_timing,  # noqa: E402
                                          planned, prepare)
from experiments.suite_runner import Job, close, finished, gpu_slots, schedule  # noqa: E402

SUITE = "data-regime"
KEPT = REPO / "results" / "experiments" / SUITE  # what earlier sessions finished
def jobs(cells: list[tuple[dc.Cell, int]], files: dict, out: Path, timing: dict) -> list[Job]:
    return [Job(cell.name, SUITE, f"{cell.row.label} [{cell.regime}]", cell.seed, cell_config(cell, files, out),
                cost=expected_seconds(cell, timing), priority=priority, whole_file=False, decode=True,
                command=f"python experiments/data_regime.py run --seeds {cell.seed} --only {cell.name} --out {out}")
            for cell, priority in cells]


def _done_names(folder: Path) -> set[str]:
    path = folder / "summary.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    return {r["name"] for r in rows if finished(r)}


def _select(cells, args) -> list:
    rows = set(args.rows.split(",")) if args.rows else None
    regimes = set(args.regimes.split(",")) if args.regimes else None
    return [(c, p) for c, p in cells if (rows is None or c.row.key in rows) and (regimes is None or c.regime in regimes)
            and (not args.only or any(part in c.name for part in args.only))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("plan", "time", "run"))
    p.add_argument("--out", type=Path, default=Path("outputs") / SUITE)
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds of every cell")
    p.add_argument("--rows", default=None, help=f"only these rows ({', '.join(r.key for r in dc.ROWS)})")
    p.add_argument("--regimes", default=None, help="only these regimes, e.g. 1x1,1x3")
    p.add_argument("--only", nargs="+", default=None, metavar="PART", help="only the cells whose name holds a part")
    p.add_argument("--best", default=None, help="the CYB row to run to convergence (default: the best at 1x3)")
    p.add_argument("--gpus", default="0", help="comma-separated GPU indices, or cpu")
    p.add_argument("--per-gpu", type=int, default=1, help="cells at a time on each GPU")
    p.add_argument("--deadline", type=float, default=None, help="seconds from now: then running cells are killed "
                   "(they resume from their checkpoint) and no cell starts that would not end before it")
    p.add_argument("--grace", type=float, default=60.0, help="seconds past the deadline for a cell in its evaluation")
    p.add_argument("--pack", type=Path, default=None, help="a .tar.gz of the results after every finished cell")
    p.add_argument("--steps", type=int, default=40, help="time: steps per row")
    p.add_argument("--concurrent", type=int, default=0, help="time: also run this many CYB cells at once on GPU 0 "
                   "(the load factor of several cells per GPU)")
    p.add_argument("--hold", type=float, default=1500, help="plan: seconds of GPU work one machine hold gives")
    args = p.parse_args(argv)
    seeds = [int(x) for x in args.seeds.split(",")]
    out = Path(os.path.relpath(args.out.resolve()))
    known = out if (out / "summary.jsonl").is_file() else KEPT  # a fresh machine starts from the kept cells
    cells = _select(planned(report.cells_of(report.load(known)), seeds, args.best), args)
    if args.action == "time":
        from experiments import data_regime_timing

        return data_regime_timing.main(args, cells, prepare(out))
    timing = load_timing(out, KEPT)
    done = _done_names(known)
    if args.action == "plan":
        for cell, priority in sorted(cells, key=lambda c: (-c[1], -expected_seconds(c[0], timing))):
            state = "finished" if cell.name in done else f"{expected_seconds(cell, timing) / 60:5.1f} min"
            print(f"{cell.name:28s} {cell.epochs:>2} pass(es) {cell.nominal_steps:>6,} steps  {state}")
        print(estimate(cells, timing, done, hold_s=args.hold, per_gpu=args.per_gpu))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "summary.jsonl").is_file() and (KEPT / "summary.jsonl").is_file():  # a fresh machine
        (out / "summary.jsonl").write_text((KEPT / "summary.jsonl").read_text())
    files = prepare(out)
    slots = gpu_slots(args.gpus, args.per_gpu)
    load = float(timing.get("load", {}).get(str(args.per_gpu), args.per_gpu)) if args.gpus != "cpu" else 1.0
    deadline = time.time() + args.deadline if args.deadline else float("inf")
    rows = schedule(jobs(cells, files, out, timing), out, slots, deadline, args.pack, load, files["valid"], SUITE,
                    (), args.grace)
    close(rows, {c.name for c, _ in cells}, out, args.pack, "cells")
    return 0


if __name__ == "__main__":
    sys.exit(main())
