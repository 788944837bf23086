"""Exact match of a finished task run (``run_suite.py smollm2-arith``), three ways, into RUN/task.json.

    python experiments/task_decoding.py RUN [--limit 500]

* ``teacher_forced``: the greedy readout over the held-out answers (per answer token the greedy
  ``<don't know>`` decision), with E[S] per answer position: which digits the model pauses on.
* ``fixed`` and ``adaptive``: free-running greedy generation from each prompt: every token read
  out at step M, or at the first step that does not answer ``<don't know>``, with the positions
  per generated token each used.

These are ``cyb eval RUN --generate LIMIT``'s task scores (:mod:`cyb.eval.task_scores`), without
the rest of its analyses, in the layout the suite's tables read.

The held-out examples are the run's own (``data.num_valid_examples``, seed ``train.seed + 1``,
disjoint from the training examples).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def task_scores(run: Path, limit: int) -> dict:
    """The run's scores as ``cyb eval RUN --generate LIMIT`` computes them
    (:func:`cyb.eval.task_scores.score_task`), on all its held-out examples."""
    from cyb.eval.evaluate import load_model, resolve_target
    from cyb.eval.task_scores import score_task

    target = resolve_target(run)
    model = load_model(target)
    scores = score_task(model, target.config, model.tokenizer, generate=limit)
    teacher = {k: scores[k] for k in ("exact_match", "token_accuracy", "ppl", "mean_steps", "greedy_steps",
                                      "per_position_accuracy", "per_position_steps")}
    return {"num_examples": scores["num_examples"], "num_steps": model.num_steps,
            "pause_visibility": model.pause_visibility, "teacher_forced": teacher,
            **scores.get("generation", {})}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a finished run folder of a task (config.yaml, final/)")
    p.add_argument("--limit", type=int, default=500, help="prompts generated free-running (default 500)")
    args = p.parse_args(argv)
    try:
        scores = task_scores(args.run, args.limit)
    except (FileNotFoundError, ValueError) as e:  # not a finished run: say so in one line
        p.error(str(e))
    (args.run / "task.json").write_text(json.dumps(scores, indent=1) + "\n")
    forced = scores["teacher_forced"]
    line = f"{args.run.name}: exact match {forced['exact_match']:.1%} (teacher-forced, E[S] {forced['mean_steps']:.2f})"
    for mode in ("fixed", "adaptive"):
        if mode in scores:
            line += f", {mode} {scores[mode]['exact_match']:.1%} at {scores[mode]['positions_per_token']:.2f} positions/token"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
