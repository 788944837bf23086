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
from experiments.run_suite import data_dir, smollm2_model, write_in_distribution  # noqa: E402
from experiments.suite_runner import Job, close, finished, gpu_slots, schedule  # noqa: E402

SUITE = "data-regime"
KEPT = REPO / "results" / "experiments" / SUITE  # what earlier sessions finished
SCALE = dict(block_len=256, batch=32, lr=1e-4, warmup=50, compile=True)

#: Seconds of a cell before its steps are measured (``time``): from the one-epoch SmolLM2 runs, a
#: baseline step about 0.1 s beside other runs; the other rows by their ``step_cost``.
DEFAULT_TIMING = {"rows": {r.key: {"startup_s": 90.0, "step_s": 0.1 * r.step_cost, "eval_s": 5.0 * r.step_cost,
                                   "save_s": 10.0} for r in dc.ROWS},
                  "tokenise_chars_per_s": 2.0e6, "corpus_chars": 43_225_862, "load": {}, "measured": False}


def prepare(out: Path) -> dict:
    """The held-out file's in-distribution part (the rows every cell is scored on), written once
    into ``out/data``; the paths as the configs hold them (relative to the working folder)."""
    files = {"train": data_dir() / "train.jsonl.gz", "valid": data_dir() / "valid.jsonl.gz",
             "valid_in": out / "data" / "valid-in-distribution.jsonl.gz"}
    if not files["valid_in"].is_file():
        files["valid_in"].parent.mkdir(parents=True, exist_ok=True)
        write_in_distribution(files["train"], files["valid"], files["valid_in"])
    return {k: os.path.relpath(v) for k, v in files.items()}


def cell_config(cell: dc.Cell, files: dict, out: Path, *, steps: int | None = None) -> dict:
    """The ``cyb train`` config of a cell (``steps``: a fixed number of steps instead of its
    passes, for timing)."""
    share = dc.share(cell.regime)
    data = {"source": files["train"], "valid_source": files["valid_in"], "block_len": SCALE["block_len"],
            "shuffle": "corpus"}
    if share < 1:
        data["fraction"] = share
    nominal = cell.nominal_steps
    train = {"out_dir": str(out / cell.name), "steps": steps or nominal, "epochs": 0.0 if steps else float(cell.epochs),
             "batch_size": SCALE["batch"], "eval_every": 0, "eval_batches": 0,
             "save_every": 0 if steps else max(100, nominal // 4), "keep_last": 1, "log_every": 10 if steps else 20,
             "seed": cell.seed, "progress": False, "compile": SCALE["compile"]}
    return {"model": {"name_or_path": smollm2_model()}, "method": dict(cell.row.method), "data": data,
            "optim": {"lr": SCALE["lr"], "warmup_steps": SCALE["warmup"]}, "train": train}


# ----------------------------------------------------------------------------- the plan


def planned(done: report.Cells, seeds: list[int], best: str | None = None) -> list[tuple[dc.Cell, int]]:
    """Every cell of the study as it stands, with its group's priority: the figure's cells of
    each seed (the first seed first), the convergence cells of the baseline and of ``best`` (by
    default the CYB row best at 1x3, once known), and a third seed wherever the report asks."""
    out: list[tuple[dc.Cell, int]] = []
    for rank, seed in enumerate(seeds):
        out += [(dc.Cell(row, g, seed), 400 - 10 * rank) for row in dc.ROWS for g in row.regimes]
    best = best or report.best_cyb(done, seeds)
    for key in [dc.BASELINE] + ([best] if best else []):
        regimes = report.convergence_regimes(done, key, seeds)
        out += [(dc.Cell(dc.BY_KEY[key], g, seed), 200) for g in regimes for seed in seeds]
    extra = max(seeds) + 1
    out += [(dc.Cell(dc.BY_KEY[row], g, extra), 100) for row, g in report.third_seed(done)]
    return out


def load_timing(*folders: Path) -> dict:
    """The first ``timing.json`` found in ``folders`` (``time`` writes it), else the defaults."""
    for folder in folders:
        path = Path(folder) / "timing.json"
        if path.is_file():
            measured = json.loads(path.read_text())
            rows = {**DEFAULT_TIMING["rows"], **measured.get("rows", {})}
            return {**DEFAULT_TIMING, **measured, "rows": rows}
    return DEFAULT_TIMING


def expected_seconds(cell: dc.Cell, timing: dict) -> float:
    """A cell's seconds alone on a GPU: start-up (the model, compiling), tokenising its share of
    the text, its steps, the held-out evaluation and the saves."""
    t = timing["rows"][cell.row.key]
    tokenise = dc.share(cell.regime) * timing["corpus_chars"] / timing["tokenise_chars_per_s"]
    return t["startup_s"] + tokenise + cell.nominal_steps * t["step_s"] + t["eval_s"] + 5 * t["save_s"]


def jobs(cells: list[tuple[dc.Cell, int]], files: dict, out: Path, timing: dict) -> list[Job]:
    return [Job(cell.name, SUITE, f"{cell.row.label} [{cell.regime}]", cell.seed, cell_config(cell, files, out),
                cost=expected_seconds(cell, timing), priority=priority, whole_file=False,
                command=f"python experiments/data_regime.py run --seeds {cell.seed} --only {cell.name} --out {out}")
            for cell, priority in cells]


def estimate(cells: list[tuple[dc.Cell, int]], timing: dict, done: set[str], *, hold_s: float = 1500,
             per_gpu: int = 1) -> str:
    """The plan's GPU time by row (alone on a GPU, from ``timing``), what is left, and how many
    machine holds of ``hold_s`` seconds on one GPU it takes with ``per_gpu`` cells at a time
    (each slowed by the measured load factor, else by ``per_gpu``)."""
    load = float(timing.get("load", {}).get(str(per_gpu), per_gpu))
    lines = [f"timing: {'measured' if timing.get('measured') else 'assumed (run `time` first)'}"
             + (f" on {timing['device']}" if timing.get("device") else ""),
             "| row | cells | steps | GPU minutes | left | longest cell (min) |", "|---|---:|---:|---:|---:|---:|"]
    total = left = 0.0
    longest = 0.0
    for row in dc.ROWS:
        mine = [c for c, _ in cells if c.row.key == row.key]
        if not mine:
            continue
        secs = [expected_seconds(c, timing) for c in mine]
        rest = sum(s for c, s in zip(mine, secs) if c.name not in done)
        total, left, longest = total + sum(secs), left + rest, max(longest, max(secs))
        lines.append(f"| {row.label} | {len(mine)} | {sum(c.nominal_steps for c in mine):,} | {sum(secs) / 60:.0f} | "
                     f"{rest / 60:.0f} | {max(secs) / 60:.1f} |")
    wall = left * load / per_gpu
    if not any(c.row.cyb and c.regime.endswith("x3") and c.regime != "1x3" for c, _ in cells):
        lines.append("| (not counted) | the best CYB row's convergence cells: known once every CYB row has 1x3 |"
                     " | | | |")
    lines.append(f"| all | {len(cells)} | {sum(c.nominal_steps for c, _ in cells):,} | {total / 60:.0f} | "
                 f"{left / 60:.0f} | {longest / 60:.1f} |")
    lines.append(f"\nleft: {left / 3600:.1f} GPU-hours alone; with {per_gpu} cell(s) per GPU (each {load:.2f}x slower) "
                 f"{wall / 3600:.1f} hours of one GPU, about {wall / hold_s:.1f} holds of {hold_s / 60:.0f} minutes "
                 f"(fewer on a machine of several GPUs). The longest cell takes {longest * load / 60:.0f} minutes "
                 f"at that load, {longest / 60:.0f} alone: " + (
                     "it fits one hold." if longest * load <= hold_s else "it fits one hold alone only (--per-gpu 1)."
                     if longest <= hold_s else "it does not fit one hold even alone (its checkpoints do not outlive "
                     "the machine): it needs a faster or a second GPU."))
    return "\n".join(lines)


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
