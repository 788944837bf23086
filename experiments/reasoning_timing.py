"""Decode time per answer of the reasoning suite's runs, each measured alone on its GPU, and
their answers with the pauses removed, or all taken, at inference.

    python experiments/reasoning_timing.py outputs/reasoning [--gpus 0,1] [--repeats 5] [--deadline S]

``cyb eval`` times each run's decoding while the suite trains other runs on the same GPU, so
those times say more about the neighbours than about the model.  This pass decodes the 256
held-out answers of every finished run again (``cyb.eval.reasoning_scores.score_reasoning``,
the same engine, batch and greedy answers), one run at a time per GPU, ``--repeats`` timed
decodings after a warm-up, and writes ``RUN/eval/timing.json``: the median ``seconds_per_answer``,
every timing, the exact share (checked against the eval's: the same greedy answers) and the GPU.
A pause model (``M`` > 1) then answers twice more, every token read out at its first step and
at its last (``EngineOptions(read_at=...)``): ``RUN/eval/ablations.json`` holds both scores
(``without_pauses``, ``every_pause``), which say how much of a pause row's score its pauses at
inference carry, and what pausing everywhere would give.
Runs that already have a ``timing.json`` or lack their final model are skipped; at
``--deadline`` seconds the workers are stopped (what they finished is kept).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TIMING_FILE = "timing.json"
ABLATIONS_FILE = "ablations.json"


def pending(out: Path) -> list[Path]:
    """The suite's runs in ``out`` with a final model and the verifier's scores, not yet timed."""
    runs = []
    for run in sorted(Path(out).glob("rg-*")):
        final, scored = run / "final" / "model.safetensors", run / "eval" / "metrics.json"
        if final.is_file() and scored.is_file() and not (run / "eval" / TIMING_FILE).is_file():
            runs.append(run)
    return runs


def time_run(run: Path, repeats: int) -> dict:
    """Decode ``run``'s held-out answers ``repeats`` times (after a warm-up) and write
    ``eval/timing.json``; returns what it wrote."""
    import torch

    from cyb.eval.evaluate import load_model, resolve_target
    from cyb.eval.reasoning_scores import score_reasoning

    target = resolve_target(run)
    model = load_model(target)
    cfg = target.config
    scores = score_reasoning(model, cfg, model.tokenizer, max_rows=cfg.data.num_valid_examples, repeats=repeats)
    rows = scores.pop("rows")
    before = json.loads((run / "eval" / "metrics.json").read_text()).get("reasoning_gym", {})
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    timing = {"seconds_per_answer": scores["seconds_per_answer"], "seconds_all": scores["seconds_all"],
              "num_examples": scores["num_examples"], "max_batch": scores["max_batch"], "repeats": repeats,
              "exact": scores["exact"], "same_as_eval": before.get("exact") == scores["exact"],
              "mean_steps": scores["mean_steps"], "positions_per_token": scores["positions_per_token"],
              "device": gpu, "alone": True}
    (run / "eval" / TIMING_FILE).write_text(json.dumps(timing, indent=2) + "\n")
    if model.num_steps > 1:  # the ablations: the same model reading out at its first, or last, step
        ablations = {}
        for key, step in (("without_pauses", 1), ("every_pause", model.num_steps)):
            forced = score_reasoning(model, cfg, model.tokenizer, max_rows=cfg.data.num_valid_examples, read_at=step)
            answers = forced.pop("rows")
            ablations[key] = {"read_at": step, "exact": forced["exact"], "mean_score": forced["mean_score"],
                              "mean_steps": forced["mean_steps"], "num_examples": forced["num_examples"],
                              "changed_answers": sum(a["generated"] != b["generated"] for a, b in zip(answers, rows))}
        (run / "eval" / ABLATIONS_FILE).write_text(json.dumps(ablations, indent=2) + "\n")
        timing["ablations"] = ablations
    return timing


def worker(runs: list[str], repeats: int) -> int:
    for run in runs:
        t = time_run(Path(run), repeats)
        a = t.get("ablations")
        print(f"{Path(run).name:48s} {t['seconds_per_answer'] * 1e3:7.2f} ms per answer "
              f"(median of {repeats}; exact {t['exact']:.1%}, as the eval: {t['same_as_eval']})"
              + (f"; without pauses {a['without_pauses']['exact']:.1%}, every pause {a['every_pause']['exact']:.1%}"
                 if a else ""), flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="the suite's folder (outputs/reasoning)")
    p.add_argument("--gpus", default="0", help="comma-separated GPU indices: one worker each, one run at a time")
    p.add_argument("--repeats", type=int, default=5, help="timed decodings per run (the median is kept)")
    p.add_argument("--deadline", type=float, default=None, help="seconds from now after which the workers stop")
    p.add_argument("--worker", nargs="+", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.worker:
        return worker(args.worker, args.repeats)
    runs = pending(args.out)
    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    if not runs:
        print(f"{args.out}: every finished run is timed")
        return 0
    print(f"timing {len(runs)} runs alone on GPU(s) {', '.join(gpus)}, {args.repeats} decodings each", flush=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    procs = []
    for i, gpu in enumerate(gpus):
        share = [str(r) for r in runs[i::len(gpus)]]
        if share:
            cmd = [sys.executable, __file__, str(args.out), "--repeats", str(args.repeats), "--worker", *share]
            procs.append(subprocess.Popen(cmd, env=dict(env, CUDA_VISIBLE_DEVICES=gpu), start_new_session=True))
    end = time.time() + args.deadline if args.deadline else float("inf")
    while any(q.poll() is None for q in procs):
        if time.time() > end:
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, 9)
            print("timing: deadline reached; the runs not timed yet are timed by the next call")
            break
        time.sleep(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
