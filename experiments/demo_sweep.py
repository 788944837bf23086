"""Run the demo pipeline over a grid of tasks, sizes and seeds, in parallel worker processes.

Each job is one ``cyb demo`` run of ONE method of a grid row at one seed (``--methods`` of the
row, each from the initialisation the row's seed draws, so the jobs of a row and seed are the
methods of one demo run, trained side by side).  Jobs are taken seed by seed (every row at seed 0
first), longest first within a seed, so a run cut short by ``--budget`` still covers every row.
One JSON line per finished job goes to ``OUT/results.jsonl`` as it finishes (exact match,
per-answer-position E[S] and accuracy, fixed/adaptive decoding for dk methods); ``--summary``
merges the methods of each row and seed and prints exact match per seed, and for every method
with dk how many seeds meet the demo criterion (docs/concepts/demo.md, docs/record/demo.md)::

    python experiments/demo_sweep.py cpu --seeds 0,1,2 --cpu-workers 14 --out outputs/demo-sweep
    python experiments/demo_sweep.py demo14 --seeds 0,1,2,3,4 --cpu-workers 56 --budget 420 \
        --grace 150 --out outputs/demo14
    python experiments/demo_sweep.py gpu --seeds 0,1,2 --gpu-workers 6 --out outputs/demo-gpu
    python experiments/demo_sweep.py --summary outputs/demo-sweep/results.jsonl
    python experiments/demo_sweep.py demo14 --seeds 0,1,2,3,4 --dry-run   # jobs and estimated cost

Grids: ``cpu`` holds settings that fit the demo's CPU budget (a 2-core machine, minutes);
``demo14`` the search for a setting where pauses pay (issue 14: narrower models, fewer pauses,
least-significant-digit-first multiplication, 3SUM, parity, and the recipes cyb_decoupled and
cyb_ponder next to plain CYB); ``gpu`` the same tasks harder, with wider models and more steps
(one H100/H200); ``smoke`` a seconds-long check of the script.
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
    # Issue 14's search (docs/record/demo.md, "The search for a demo where pausing pays").  Every row
    # trains GRID_DEFAULTS["demo14"]["methods"]; a row's psi_dk applies to every dk method.
    "demo14": {
        # 3-digit addition, most-significant digit first: psi 0.5 learned it in the only seed
        # tried (CYB 93% against 1%), narrower models favoured TBYS (h32: 88% against 1%)
        "add3-M4-psi0.5": {"task": "addition", "task_kwargs": {"digits": 3}, "psi_dk": 0.5},
        "add3-M3-psi0.5": {"task": "addition", "task_kwargs": {"digits": 3}, "num_steps": 3, "psi_dk": 0.5},
        "add3-M4-h32": {"task": "addition", "task_kwargs": {"digits": 3}, "hidden_size": 32},
        "add3-M4-h32-psi0.5": {"task": "addition", "task_kwargs": {"digits": 3}, "hidden_size": 32,
                               "psi_dk": 0.5},
        "add3-M3-h32-psi0.5": {"task": "addition", "task_kwargs": {"digits": 3}, "hidden_size": 32,
                               "num_steps": 3, "psi_dk": 0.5},
        "add3-M2-h32-psi0.5": {"task": "addition", "task_kwargs": {"digits": 3}, "hidden_size": 32,
                               "num_steps": 2, "psi_dk": 0.5},
        "add3-M4-h32-3000x32-psi0.5": {"task": "addition", "task_kwargs": {"digits": 3}, "hidden_size": 32,
                                       "train_steps": 3000, "batch_size": 32, "psi_dk": 0.5},
        "add3-M4-h32-1000x64-psi0.5": {"task": "addition", "task_kwargs": {"digits": 3}, "hidden_size": 32,
                                       "train_steps": 1000, "psi_dk": 0.5},
        "add4-M4-h32-psi0.5": {"task": "addition", "task_kwargs": {"digits": 4}, "hidden_size": 32,
                               "psi_dk": 0.5},
        # multiplication least-significant digit first: each digit's carry is local, but a digit
        # needs several digit products at once (parallel work, which pauses add)
        "mul2x2lsb-M4-psi0.5": {"task": "multiplication", "psi_dk": 0.5,
                                "task_kwargs": {"digits": 2, "digits_b": 2, "lsb_first": True}},
        "mul2x2lsb-M3-psi0.5": {"task": "multiplication", "num_steps": 3, "psi_dk": 0.5,
                                "task_kwargs": {"digits": 2, "digits_b": 2, "lsb_first": True}},
        "mul2x2lsb-M4-h32-psi0.5": {"task": "multiplication", "hidden_size": 32, "psi_dk": 0.5,
                                    "task_kwargs": {"digits": 2, "digits_b": 2, "lsb_first": True}},
        "mul3x1lsb-M4-h32-psi0.5": {"task": "multiplication", "hidden_size": 32, "psi_dk": 0.5,
                                    "task_kwargs": {"digits": 3, "digits_b": 1, "lsb_first": True}},
        "mul3x1-M4-h32-psi0.5": {"task": "multiplication", "hidden_size": 32, "psi_dk": 0.5,
                                 "task_kwargs": {"digits": 3, "digits_b": 1}},
        # one answer token that needs many comparisons at once (3SUM) or every bit (parity)
        "3sum-n5d2-M4-h32-psi0.5": {"task": "3sum", "task_kwargs": {"n": 5, "d": 2}, "hidden_size": 32,
                                    "psi_dk": 0.5},
        "parity6-M4-h32-psi0.5": {"task": "parity", "task_kwargs": {"length": 6}, "hidden_size": 32,
                                  "psi_dk": 0.5},
    },
    "gpu": {
        "add8-M4": {"task": "addition", "task_kwargs": {"digits": 8}},
        "mul4x2-M4": {"task": "multiplication", "task_kwargs": {"digits": 4, "digits_b": 2}},
        "3sum-n8d2-M4": {"task": "3sum", "task_kwargs": {"n": 8, "d": 2}},
        "lookup4-M4": {"task": "lookup", "task_kwargs": {"hops": 4, "distractor_chains": 3}},
    },
    "smoke": {"add2-M2": {"task": "addition", "task_kwargs": {"digits": 2}, "num_steps": 2}},
    # issue 22: the default demo with each pause visibility (the baseline trains once)
    "visibility": {
        "add3-shared": {"pause_visibility": "shared",
                        "methods": ["baseline", "tbys", "cyb", "cyb_decoupled"]},
        "add3-private": {"pause_visibility": "private", "methods": ["tbys", "cyb", "cyb_decoupled"]},
        "add3-gated": {"pause_visibility": "gated", "methods": ["tbys", "cyb", "cyb_decoupled"]},
        # the gates open at the start (bias 0: the shared layout), free to close
        "add3-gated-open": {"pause_visibility": "gated", "methods": ["tbys", "cyb", "cyb_decoupled"],
                            "method_options": {m: {"pause_gate_init": 0.0} for m in ("tbys", "cyb", "cyb_decoupled")}},
        # the gates opened on a schedule, from -8 to 0 over the first 10% or 50% of training
        "add3-gated-anneal300": {"pause_visibility": "gated", "methods": ["tbys", "cyb", "cyb_decoupled"],
                                 "method_options": {m: {"pause_gate_anneal_steps": 300}
                                                    for m in ("tbys", "cyb", "cyb_decoupled")}},
        "add3-gated-anneal1500": {"pause_visibility": "gated", "methods": ["tbys", "cyb", "cyb_decoupled"],
                                  "method_options": {m: {"pause_gate_anneal_steps": 1500}
                                                     for m in ("tbys", "cyb", "cyb_decoupled")}},
        # the gates held at their start (-8, not learned): is it the learning or the faint channel?
        "add3-gated-frozen": {"pause_visibility": "gated", "methods": ["tbys", "cyb", "cyb_decoupled"],
                              "method_options": {m: {"pause_gate_lr": 0.0} for m in ("tbys", "cyb", "cyb_decoupled")}},
    },
}
#: The demo's defaults when the cpu and demo14 grids ran (the default demo has changed since):
#: the rows' names and results are relative to these.
SEARCH_BASE = {"hidden_size": 64, "train_steps": 1500, "batch_size": 64, "psi_dk": 0.9,
               "methods": ["baseline", "tbys", "cyb"]}
#: Settings every row of a grid shares (before the row's own).
GRID_DEFAULTS = {
    "cpu": {**SEARCH_BASE, "precision": "fp32"},
    "demo14": {**SEARCH_BASE, "precision": "fp32",
               "methods": ["baseline", "tbys", "cyb", "cyb_decoupled", "cyb_ponder"],
               "method_options": {"cyb_ponder": {"ponder_cost": -0.005}}},
    "gpu": {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "train_steps": 3000,
            "batch_size": 256, "lr": 1e-3, "warmup_steps": 200, "num_train_examples": 200000,
            "num_test_examples": 2000, "precision": "bf16", "psi_dk": 0.9,
            "methods": ["baseline", "tbys", "cyb"]},
    "visibility": {"precision": "fp32"},  # the default demo otherwise (hidden 32, 3000 steps)
    "smoke": {"methods": ["baseline", "tbys", "cyb"], "hidden_size": 16, "num_layers": 1, "num_heads": 1, "train_steps": 4, "batch_size": 4,
              "warmup_steps": 1, "num_train_examples": 64, "num_test_examples": 16},
}


#: Seconds per position of a training row at hidden 64 and 2 layers on one CPU core (single
#: thread), measured on a 2-core machine: the cost model behind job order and ``--dry-run``.
SECONDS_PER_POSITION = 20e-6
#: Seconds per job besides training (initial weights, scoring, decoding).
JOB_OVERHEAD_S = 6.0


def estimated_seconds(settings: dict) -> float:
    """Rough single-core seconds of one job (one method): optimiser steps x batch x positions per
    row (tokens x M, 1 for the baseline) x a per-position cost scaled by width and depth."""
    from cyb import methods
    from cyb.data.synthetic import make_task

    s = {**_demo_defaults(), **settings}
    task = make_task(s["task"], **s["task_kwargs"])
    (method,) = s["methods"]
    m = methods.spec(method).model_steps(s["num_steps"])
    per_position = SECONDS_PER_POSITION * (s["hidden_size"] / 64) * (s["num_layers"] / 2)
    return JOB_OVERHEAD_S + s["train_steps"] * s["batch_size"] * task.max_len * m * per_position


def _demo_defaults() -> dict:
    from cyb.demo import DemoSettings

    return DemoSettings().to_dict()


def run_job(job: dict) -> dict:
    """Train and score one grid row at one seed (the methods of ``job["settings"]``); returns the
    JSON line written.  A job whose ``deadline`` (``time.time()``) has passed is not started."""
    if time.time() > job.get("deadline", float("inf")):
        return {"name": job["name"], "seed": job["seed"], "skipped": "budget"}
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
    for weights in [*out.glob("runs/*/final"), *out.glob("runs/*/ckpt-*")]:
        shutil.rmtree(weights, ignore_errors=True)
    keep = ("exact_match", "token_accuracy", "ppl", "mean_steps", "greedy_steps", "train_seconds",
            "per_position_steps", "per_position_accuracy", "decoding", "pause_gates", "foreign_attention")
    return {"name": job["name"], "seed": job["seed"], "device": job["device"],
            "settings": job["settings"], "seconds": time.perf_counter() - start,
            "methods": {m: {k: r[k] for k in keep if k in r} for m, r in metrics["methods"].items()}}


def _worker(device: str, jobs, results) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    while True:
        job = jobs.get()
        if job is None:
            return
        results.put(run_job({**job, "device": device}))


def make_jobs(grid: str, seeds: list[int], out: Path, rows: list[str] | None,
              only_methods: list[str] | None = None) -> list[dict]:
    """One job per row, seed and method (of ``only_methods`` when given), seed by seed and
    longest first within a seed; each with its ``estimate`` in single-core seconds."""
    chosen = {k: v for k, v in GRIDS[grid].items() if rows is None or k in rows}
    unknown = sorted(set(rows or ()) - set(chosen))
    if unknown:
        raise SystemExit(f"unknown rows {unknown} of grid {grid}; known: {sorted(GRIDS[grid])}")
    jobs = []
    for seed in seeds:
        wave = []
        for name, row in chosen.items():
            settings = {**GRID_DEFAULTS[grid], **row}
            for method in settings.get("methods") or _demo_defaults()["methods"]:
                if only_methods and method not in only_methods:
                    continue
                options = (settings.get("method_options") or {}).get(method)
                one = {**settings, "methods": [method],
                       "method_options": {method: options} if options else {}}
                wave.append({"name": name, "seed": seed, "settings": one,
                             "out": str(out / "runs" / f"{name}-s{seed}-{method}"),
                             "estimate": estimated_seconds(one)})
        jobs += sorted(wave, key=lambda j: -j["estimate"])
    return jobs


def sweep(grid: str, seeds: list[int], out: Path, cpu_workers: int, gpu_workers: int,
          budget: float, grace: float, rows: list[str] | None, only_methods: list[str] | None = None) -> None:
    """Run the jobs on the workers, appending each finished job's line to ``out/results.jsonl``.
    No job starts after ``budget`` seconds; jobs still running ``grace`` seconds later are
    stopped (and lost)."""
    jobs = make_jobs(grid, seeds, out, rows, only_methods)
    deadline = time.time() + budget
    ctx = mp.get_context("spawn")
    queue, results = ctx.Queue(), ctx.Queue()
    for job in jobs:
        queue.put({**job, "deadline": deadline})
    workers = [ctx.Process(target=_worker, args=(d, queue, results), daemon=True)
               for d in ["cpu"] * cpu_workers + ["cuda"] * gpu_workers]
    for w in workers:
        queue.put(None)
        w.start()
    out.mkdir(parents=True, exist_ok=True)
    hard_stop = deadline + grace
    done = skipped = 0
    with (out / "results.jsonl").open("a") as fh:
        while done + skipped < len(jobs) and time.time() < hard_stop:
            try:
                line = results.get(timeout=max(0.1, min(5.0, hard_stop - time.time())))
            except Exception:
                continue
            if "skipped" in line:
                skipped += 1
                continue
            done += 1
            fh.write(json.dumps(line) + "\n")
            fh.flush()
            print(f"[{done}/{len(jobs)}] {_one_line(line)}", flush=True)
    for w in workers:
        w.terminate()
    print(f"{done} of {len(jobs)} jobs finished, {skipped} not started (budget), "
          f"{len(jobs) - done - skipped} stopped")


def _one_line(line: dict) -> str:
    if "error" in line:
        return f"{line['name']} s{line['seed']}: ERROR {line['error']}"
    parts = [f"{m} {r['exact_match']:.1%} (E[S] {r['mean_steps']:.2f})" for m, r in line["methods"].items()]
    return f"{line['name']} s{line['seed']} ({line['seconds']:.0f} s): " + ", ".join(parts)


def merged_runs(paths: list[Path]) -> dict[str, dict[int, dict]]:
    """``{row: {seed: {"methods": {method: result}, "seconds": total}}}`` from results files
    (the one-method lines of a row and seed merged; a later line for a method wins, its time too)."""
    by_row: dict[str, dict[int, dict]] = {}
    seconds: dict[tuple, float] = {}
    for path in paths:
        for text in path.read_text().splitlines():
            line = json.loads(text)
            if "error" in line or "skipped" in line:
                continue
            run = by_row.setdefault(line["name"], {}).setdefault(line["seed"], {"methods": {}, "seconds": 0.0})
            run["methods"].update(line["methods"])
            for method in line["methods"]:
                seconds[line["name"], line["seed"], method] = line["seconds"] / len(line["methods"])
    for (name, seed, _), s in seconds.items():
        by_row[name][seed]["seconds"] += s
    return by_row


def hard_easy_steps(run: dict, method: str) -> tuple[float, float] | None:
    """:func:`cyb.demo.hard_easy_steps` of one merged run."""
    from cyb.demo import hard_easy_steps as of_results

    return of_results(run["methods"], method)


def meets_criterion(run: dict, method: str) -> bool:
    """:func:`cyb.demo.meets_criterion` of one merged run."""
    from cyb.demo import meets_criterion as of_results

    return of_results(run["methods"], method)


def summary_table(paths: list[Path]) -> str:
    """Markdown: per grid row, exact match of each method per seed and its mean, CYB's E[S];
    then, per row and method with dk, E[S] at the hard and easy positions and the seeds that
    meet the demo criterion (:func:`meets_criterion`)."""
    from cyb import methods as registry

    by_row = merged_runs(paths)
    order = [m for m in registry.NAMES if any(m in run["methods"] for runs in by_row.values()
                                              for run in runs.values())]
    labels = {"baseline": "baseline", "tbys": "TBYS", "cyb": "CYB"}
    lines = ["| setting | seeds | " + " | ".join(labels.get(m, m) for m in order)
             + " | CYB E[S] | seconds per seed |",
             "|---|---|" + "---|" * len(order) + "---|---:|"]
    for name, runs in by_row.items():
        seeds = sorted(runs)
        cells = []
        for method in order:
            vals = [runs[s]["methods"][method]["exact_match"] for s in seeds if method in runs[s]["methods"]]
            if not vals:
                cells.append("-")
                continue
            each = ", ".join(f"{100 * v:.0f}" for v in vals)
            cells.append(f"{each} (mean {100 * statistics.mean(vals):.1f}%)")
        es = [runs[s]["methods"]["cyb"]["mean_steps"] for s in seeds if "cyb" in runs[s]["methods"]]
        secs = statistics.mean(runs[s]["seconds"] for s in seeds)
        lines.append(f"| {name} | {','.join(map(str, seeds))} | {' | '.join(cells)} "
                     f"| {f'{statistics.mean(es):.2f}' if es else '-'} | {secs:.0f} |")
    crit = ["", "Demo criterion per seed (exact match above the baseline, at least TBYS's, and "
            "mean E[S] on the hard answer positions at least 0.1 above the easy ones; "
            "hard: token accuracy over all methods below its mean over the positions):", "",
            "| setting | method | seeds meeting it | E[S] hard / easy per seed | mean E[S] "
            "| fixed decoding exact | adaptive decoding exact (positions per token) |",
            "|---|---|---|---|---:|---:|---:|"]
    for name, runs in by_row.items():
        seeds = sorted(runs)
        for method in order:
            if not registry.spec(method).has_dk or not any(method in runs[s]["methods"] for s in seeds):
                continue
            have = [s for s in seeds if method in runs[s]["methods"]]
            met = [s for s in have if meets_criterion(runs[s], method)]
            pairs = []
            for s in have:
                he = hard_easy_steps(runs[s], method)
                pairs.append("-" if he is None else f"{he[0]:.2f}/{he[1]:.2f}")
            es = statistics.mean(runs[s]["methods"][method]["mean_steps"] for s in have)
            dec = [runs[s]["methods"][method]["decoding"] for s in have if "decoding" in runs[s]["methods"][method]]
            if dec:
                fixed = f"{100 * statistics.mean(d['fixed']['exact_match'] for d in dec):.1f}%"
                adaptive = (f"{100 * statistics.mean(d['adaptive']['exact_match'] for d in dec):.1f}% "
                            f"({statistics.mean(d['adaptive']['positions_per_token'] for d in dec):.2f})")
            else:
                fixed = adaptive = "-"
            crit.append(f"| {name} | {method} | {len(met)} of {len(have)} ({','.join(map(str, met)) or '-'}) "
                        f"| {', '.join(pairs)} | {es:.2f} | {fixed} | {adaptive} |")
    return "\n".join(lines + crit)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("grid", nargs="?", choices=sorted(GRIDS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--rows", default=None, help="comma-separated grid rows (default: all)")
    p.add_argument("--methods", default=None, help="comma-separated methods of those rows (default: each row's)")
    p.add_argument("--out", type=Path, default=Path("outputs/demo-sweep"))
    p.add_argument("--cpu-workers", type=int, default=0)
    p.add_argument("--gpu-workers", type=int, default=0)
    p.add_argument("--budget", type=float, default=float("inf"),
                   help="start no job after SECONDS (default: no limit)")
    p.add_argument("--grace", type=float, default=float("inf"),
                   help="stop jobs still running SECONDS after the budget (default: wait for them)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the jobs with their estimated single-core seconds, run nothing")
    p.add_argument("--summary", nargs="+", type=Path, help="print the table of results.jsonl files")
    args = p.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    if args.summary:
        print(summary_table(args.summary))
        return 0
    rows = args.rows.split(",") if args.rows else None
    only_methods = args.methods.split(",") if args.methods else None
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.grid is not None and args.dry_run:
        jobs = make_jobs(args.grid, seeds, args.out, rows, only_methods)
        for job in jobs:
            print(f"{job['name']} s{job['seed']} {job['settings']['methods'][0]}: ~{job['estimate']:.0f} s")
        total = sum(j["estimate"] for j in jobs)
        workers = max(1, args.cpu_workers)
        print(f"{len(jobs)} jobs, ~{total:.0f} single-core seconds in all, ~{total / workers / 60:.1f} min "
              f"on {workers} worker(s) (cost model measured on a 2-core machine)")
        return 0
    if args.grid is None or args.cpu_workers + args.gpu_workers < 1:
        p.error("give a grid and at least one worker (--cpu-workers / --gpu-workers)")
    sweep(args.grid, seeds, args.out, args.cpu_workers, args.gpu_workers, args.budget, args.grace, rows,
          only_methods)
    table = summary_table([args.out / "results.jsonl"])
    (args.out / "summary.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
