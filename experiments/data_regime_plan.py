"""The data-regime study's plan (``experiments/data_regime.py`` runs it): each cell's ``cyb train``
config, every cell with its priority, a cell's expected seconds from the measured (or assumed)
timing, and the estimate of what is left.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # imported from a script: the repository root holds experiments/
    sys.path.insert(0, str(REPO))

from experiments import data_regime_cells as dc  # noqa: E402
from experiments import data_regime_report as report  # noqa: E402
from experiments.run_suite import data_dir, smollm2_model, write_in_distribution  # noqa: E402

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


#: seconds of a cell's decoding through the engine after training (experiments/text_decoding.py: a
#: process of its own, the model loaded again, 64 prompts x 64 tokens); assumed, not timed by ``time``
DECODE_S = 20.0


def expected_seconds(cell: dc.Cell, timing: dict) -> float:
    """A cell's seconds alone on a GPU: start-up (the model, compiling), tokenising its share of
    the text, its steps, the held-out evaluation, the saves and the decoding through the engine."""
    t = timing["rows"][cell.row.key]
    tokenise = dc.share(cell.regime) * timing["corpus_chars"] / timing["tokenise_chars_per_s"]
    return (t["startup_s"] + tokenise + cell.nominal_steps * t["step_s"] + t["eval_s"] + 5 * t["save_s"]
            + t.get("decode_s", DECODE_S))


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
