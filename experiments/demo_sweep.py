"""Run the demo pipeline over a grid of tasks, sizes and seeds, in parallel worker processes.

Each job is one ``cyb demo`` run (baseline, TBYS and CYB from one shared initialisation) with
the grid row's settings and a seed.  Jobs are taken seed by seed (every row at seed 0 first),
so a run cut short by ``--budget`` still covers every row.  One JSON line per finished job goes
to ``OUT/results.jsonl``; ``--summary`` prints mean and spread per row and method::

    python experiments/demo_sweep.py cpu --seeds 0,1,2 --cpu-workers 14 --out results/demo-sweep
    python experiments/demo_sweep.py gpu --seeds 0,1,2 --gpu-workers 6 --out results/demo-gpu
    python experiments/demo_sweep.py --summary results/demo-sweep/results.jsonl

Grids: ``cpu`` holds settings that fit the demo's CPU budget (a 2-core machine, minutes);
``gpu`` the same tasks harder, with wider models and more steps (one H100/H200); ``smoke``
a seconds-long check of the script.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: name -> demo settings (fields of cyb.demo.DemoSettings) that differ from the defaults.
GRIDS: dict[str, dict[str, dict]] = {
    "cpu": {
        "mul3x1-M4": {"task": "multiplication", "task_kwargs": {"digits": 3, "digits_b": 1}},
        "add3-M4": {"task": "addition", "task_kwargs": {"digits": 3}},
        "add3-M2": {"task": "addition", "task_kwargs": {"digits": 3}, "num_steps": 2},
        "add3-M3": {"task": "addition", "task_kwargs": {"digits": 3}, "num_steps": 3},
        "mul3x1-M2": {"task": "multiplication", "task_kwargs": {"digits": 3, "digits_b": 1},
                      "num_steps": 2},
        "add4-M4": {"task": "addition", "task_kwargs": {"digits": 4}},
        "add3-M4-3000x32": {"task": "addition", "task_kwargs": {"digits": 3},
                            "train_steps": 3000, "batch_size": 32},
        "add3-M4-3layers": {"task": "addition", "task_kwargs": {"digits": 3}, "num_layers": 3},
        "add3-M4-h32": {"task": "addition", "task_kwargs": {"digits": 3}, "hidden_size": 32},
        "add3-M4-psi0.5": {"task": "addition", "task_kwargs": {"digits": 3}, "psi_dk": 0.5},
        "parity10-M4": {"task": "parity", "task_kwargs": {"length": 10}},
        "lookup3-M4": {"task": "lookup", "task_kwargs": {"hops": 3, "distractor_chains": 2}},
    },
    "gpu": {
        "add8-M4": {"task": "addition", "task_kwargs": {"digits": 8}},
        "mul4x2-M4": {"task": "multiplication", "task_kwargs": {"digits": 4, "digits_b": 2}},
        "3sum-n8d2-M4": {"task": "3sum", "task_kwargs": {"n": 8, "d": 2}},
        "lookup4-M4": {"task": "lookup", "task_kwargs": {"hops": 4, "distractor_chains": 3}},
    },
    "smoke": {"add2-M2": {"task": "addition", "task_kwargs": {"digits": 2}, "num_steps": 2}},
}
#: Settings every row of a grid shares (before the row's own).
GRID_DEFAULTS = {
    "cpu": {"precision": "fp32"},
    "gpu": {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "train_steps": 3000,
            "batch_size": 256, "lr": 1e-3, "warmup_steps": 200, "num_train_examples": 200000,
            "num_test_examples": 2000, "precision": "bf16"},
    "smoke": {"hidden_size": 16, "num_layers": 1, "num_heads": 1, "train_steps": 4, "batch_size": 4,
              "warmup_steps": 1, "num_train_examples": 64, "num_test_examples": 16},
}


def run_job(job: dict) -> dict:
    """Train and score one grid row at one seed; returns the JSON line written."""
    import torch

    torch.set_num_threads(1)
    from cyb.demo import DemoSettings, run_demo

    out = Path(job["out"])
    settings = DemoSettings.from_dict({**job["settings"], "seed": job["seed"], "device": job["device"],
                                       "out_dir": str(out), "progress": False,
                                       "num_examples_shown": 12})
    log = out.with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        with log.open("w") as fh:
            metrics = run_demo(settings, echo=lambda text: print(text, file=fh, flush=True))
    except Exception as exc:  # a failed row is reported, the sweep goes on
        return {"name": job["name"], "seed": job["seed"], "error": repr(exc)}
    shutil.rmtree(out / "init", ignore_errors=True)
    for final in out.glob("runs/*/final"):
        shutil.rmtree(final, ignore_errors=True)
    keep = ("exact_match", "token_accuracy", "ppl", "mean_steps", "greedy_steps", "train_seconds",
            "per_position_steps", "per_position_accuracy")
    return {"name": job["name"], "seed": job["seed"], "device": job["device"],
            "settings": job["settings"], "seconds": time.perf_counter() - start,
            "methods": {m: {k: r[k] for k in keep} for m, r in metrics["methods"].items()}}


def _worker(device: str, jobs, results) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    while True:
        job = jobs.get()
        if job is None:
            return
        results.put(run_job({**job, "device": device}))


def sweep(grid: str, seeds: list[int], out: Path, cpu_workers: int, gpu_workers: int,
          budget: float, rows: list[str] | None) -> None:
    chosen = {k: v for k, v in GRIDS[grid].items() if rows is None or k in rows}
    jobs = [{"name": name, "seed": seed, "settings": {**GRID_DEFAULTS[grid], **row},
             "out": str(out / "runs" / f"{name}-s{seed}")}
            for seed in seeds for name, row in chosen.items()]
    ctx = mp.get_context("spawn")
    queue, results = ctx.Queue(), ctx.Queue()
    for job in jobs:
        queue.put(job)
    workers = [ctx.Process(target=_worker, args=(d, queue, results), daemon=True)
               for d in ["cpu"] * cpu_workers + ["cuda"] * gpu_workers]
    for w in workers:
        queue.put(None)
        w.start()
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + budget
    done = 0
    with (out / "results.jsonl").open("a") as fh:
        while done < len(jobs) and time.monotonic() < deadline:
            try:
                line = results.get(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            except Exception:
                continue
            done += 1
            fh.write(json.dumps(line) + "\n")
            fh.flush()
            print(f"[{done}/{len(jobs)}] {_one_line(line)}", flush=True)
    for w in workers:
        w.terminate()
    print(f"{done} of {len(jobs)} jobs finished")


def _one_line(line: dict) -> str:
    if "error" in line:
        return f"{line['name']} s{line['seed']}: ERROR {line['error']}"
    parts = [f"{m} {r['exact_match']:.1%} (E[S] {r['mean_steps']:.2f})" for m, r in line["methods"].items()]
    return f"{line['name']} s{line['seed']} ({line['seconds']:.0f} s): " + ", ".join(parts)


def summary_table(paths: list[Path]) -> str:
    """Markdown: per grid row, exact match of each method per seed, its mean, and CYB's E[S]."""
    by_row: dict[str, list[dict]] = {}
    for path in paths:
        for text in path.read_text().splitlines():
            line = json.loads(text)
            if "error" not in line:
                by_row.setdefault(line["name"], []).append(line)
    lines = ["| setting | seeds | baseline | TBYS | CYB | CYB E[S] | seconds per seed |",
             "|---|---|---|---|---|---|---:|"]
    for name, runs in by_row.items():
        runs.sort(key=lambda r: r["seed"])
        cells = []
        for method in ("baseline", "tbys", "cyb"):
            vals = [r["methods"][method]["exact_match"] for r in runs if method in r["methods"]]
            if not vals:
                cells.append("-")
                continue
            each = ", ".join(f"{100 * v:.0f}" for v in vals)
            cells.append(f"{each} (mean {100 * statistics.mean(vals):.1f}%)")
        es = [r["methods"]["cyb"]["mean_steps"] for r in runs if "cyb" in r["methods"]]
        secs = statistics.mean(r["seconds"] for r in runs)
        lines.append(f"| {name} | {','.join(str(r['seed']) for r in runs)} | {' | '.join(cells)} "
                     f"| {statistics.mean(es):.2f} | {secs:.0f} |" if es else
                     f"| {name} | {','.join(str(r['seed']) for r in runs)} | {' | '.join(cells)} | - "
                     f"| {secs:.0f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("grid", nargs="?", choices=sorted(GRIDS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--rows", default=None, help="comma-separated grid rows (default: all)")
    p.add_argument("--out", type=Path, default=Path("results/demo-sweep"))
    p.add_argument("--cpu-workers", type=int, default=0)
    p.add_argument("--gpu-workers", type=int, default=0)
    p.add_argument("--budget", type=float, default=float("inf"), help="stop after SECONDS")
    p.add_argument("--summary", nargs="+", type=Path, help="print the table of results.jsonl files")
    args = p.parse_args()
    if args.summary:
        print(summary_table(args.summary))
        return 0
    if args.grid is None or args.cpu_workers + args.gpu_workers < 1:
        p.error("give a grid and at least one worker (--cpu-workers / --gpu-workers)")
    sys.path.insert(0, str(REPO / "src"))
    rows = args.rows.split(",") if args.rows else None
    sweep(args.grid, [int(s) for s in args.seeds.split(",")], args.out, args.cpu_workers,
          args.gpu_workers, args.budget, rows)
    print(summary_table([args.out / "results.jsonl"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
