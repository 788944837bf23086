"""The rows of the reasoning-gym suites of ``experiments/run_suite.py`` (prepared, not run yet).

SmolLM2-135M fine-tuned on reasoning-gym tasks (``data.task: reasoning-gym:NAME``), each run
then scored by ``cyb eval``: the answers to its 256 held-out questions generated in adaptive
mode through the engine (256 rows at once) and judged by the task's own verifier, with the
steps per answer token and the measured decode time per answer (docs/how-to/evaluate.md).

* ``reasoning-pilot``: the fine-tuned baseline (seed 0) on every candidate task of
  :data:`TASKS`; :func:`choose` then keeps the first three (in the order of :data:`TASKS`)
  whose exact share lies in :data:`PILOT_RANGE` (20-80%: room above and below), and writes the
  choice to ``OUT/reasoning-choice.json``.
* ``reasoning``: on the chosen tasks (``--tasks``, else that file), 3 seeds of: the baseline,
  the baseline given the pause rows' training compute (4x the steps over the same questions:
  4 epochs; and 4x the steps over 4x as many questions: one epoch), TBYS 3 pauses private, CYB
  3 pauses private and gated, CYB-decoupled 3 pauses private, and CYB 3 pauses private with
  pause-step adapters (rank 16, the rest fully fine-tuned).  The
  pilot's baseline runs are the suite's seed-0 baseline runs (the same names): they are not run
  twice.

The candidate tasks are arithmetic and counting generators whose questions SmolLM2 writes in
20-60 tokens, with settings chosen so that a fine-tuned 135M model is neither at 0 nor at 100%
(a guess the pilot checks): sums of two to four 2-3 digit numbers, short expressions with the
four operations, legs of a few animals, products of two 1-2 digit numbers, GCDs below 200 and
the 1 bits of numbers below 1,000.
"""

from __future__ import annotations

import json
from pathlib import Path

#: Candidate tasks in order of preference: ``{name: generator settings}``.
TASKS = {
    "chain_sum": {"min_terms": 2, "max_terms": 4, "min_digits": 2, "max_digits": 3},
    "basic_arithmetic": {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 2},
    "leg_counting": {"min_animals": 2, "max_animals": 4, "max_instances": 5},
    "products": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
    "gcd": {"min_value": 1, "max_value": 200},
    "count_bits": {"min_n": 1, "max_n": 1000},
}
#: The baseline's exact share a chosen task must land in.
PILOT_RANGE = (0.2, 0.8)
CHOSEN = 3
CHOICE_FILE = "reasoning-choice.json"


def rows() -> list[tuple[str, str, dict, float, int, int]]:
    """``(label, short name, method fields, cost, steps multiplier, questions multiplier)`` of
    every row of the suite."""
    private, gated = {"pause_visibility": "private"}, {"pause_visibility": "gated"}
    adapters = {"pause_visibility": "private", "pause_adapter_rank": 16, "pause_adapter_alpha": 32.0}
    return [
        ("Baseline", "baseline", {"name": "baseline"}, 0.4, 1, 1),
        ("Baseline, 4x the steps (compute-matched)", "baseline-4xsteps", {"name": "baseline"}, 1.6, 4, 1),
        ("Baseline, 4x the steps and the questions (compute-matched)", "baseline-4xdata", {"name": "baseline"},
         1.6, 4, 4),
        ("TBYS 3 pauses, private", "tbys-p3-private", {"name": "tbys", **private}, 0.6, 1, 1),
        ("CYB 3 pauses, private", "cyb-p3-private", {"name": "cyb", **private}, 0.6, 1, 1),
        ("CYB 3 pauses, gated", "cyb-p3-gated", {"name": "cyb", **gated}, 0.8, 1, 1),
        ("CYB-decoupled 3 pauses, private", "cyb_decoupled-p3-private", {"name": "cyb_decoupled", **private},
         0.6, 1, 1),
        ("CYB 3 pauses, private, pause adapters r16", "cyb-p3-private-adapters16", {"name": "cyb", **adapters},
         0.7, 1, 1),
    ]


def run_name(task: str, short: str, seed: int) -> str:
    """``rg-chain_sum-cyb-p3-private-s0``."""
    return f"rg-{task}-{short}-s{seed}"


def task_config(task: str, s: dict, data_times: int = 1) -> dict:
    """The ``data`` section of a run on ``task`` at scale ``s`` (``data_times`` as many training
    questions; the held-out ones stay the same)."""
    return {"task": f"reasoning-gym:{task}", "task_kwargs": dict(TASKS[task]),
            "num_train_examples": data_times * s["train_examples"], "num_valid_examples": s["valid_examples"]}


def tasks_of(out: Path, given: str | None) -> list[str]:
    """The suite's tasks: ``given`` (comma-separated), else the pilot's choice in ``out``, else
    the first three candidates."""
    if given:
        names = [t.strip() for t in given.split(",") if t.strip()]
        unknown = [t for t in names if t not in TASKS]
        if unknown:
            raise ValueError(f"--tasks: {unknown} are not candidates of the suite ({', '.join(TASKS)})")
        return names
    choice = Path(out) / CHOICE_FILE
    if choice.is_file():
        return json.loads(choice.read_text())["chosen"]
    return list(TASKS)[:CHOSEN]


def choose(summary: list[dict]) -> dict:
    """The pilot's choice from the rows of ``summary.jsonl``: ``{"chosen", "exact", "rule",
    "missing"}``.  The first :data:`CHOSEN` candidates whose seed-0 baseline answered an exact
    share within :data:`PILOT_RANGE`; when fewer do, the rest are the measured ones closest to
    50%, and ``rule`` says so."""
    exact = {}
    for row in summary:
        judged = row.get("reasoning_gym")
        for task in TASKS:
            if row.get("name") == run_name(task, "baseline", 0) and judged:
                exact[task] = judged["exact"]
    lo, hi = PILOT_RANGE
    chosen = [t for t in TASKS if t in exact and lo <= exact[t] <= hi][:CHOSEN]
    rule = f"the first {CHOSEN} candidates whose baseline answers {lo:.0%}-{hi:.0%} exactly"
    if len(chosen) < CHOSEN:
        rest = sorted((t for t in exact if t not in chosen), key=lambda t: abs(exact[t] - 0.5))
        chosen += rest[:CHOSEN - len(chosen)]
        rule += f"; only {len([t for t in chosen if lo <= exact[t] <= hi])} did, the others are the closest to 50%"
    return {"chosen": chosen, "exact": exact, "rule": rule, "missing": [t for t in TASKS if t not in exact]}


def write_choice(out: Path, summary: list[dict]) -> dict | None:
    """Write ``OUT/reasoning-choice.json`` once every candidate's pilot run has a score; returns
    the choice (None while some are missing)."""
    choice = choose(summary)
    if choice["missing"]:
        return None
    (Path(out) / CHOICE_FILE).write_text(json.dumps(choice, indent=2) + "\n")
    return choice


__all__ = ["CHOICE_FILE", "PILOT_RANGE", "TASKS", "choose", "rows", "run_name", "task_config", "tasks_of",
           "write_choice"]
