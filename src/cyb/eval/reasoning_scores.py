"""Generated answers judged by the task's own verifier (``cyb eval`` of a ``reasoning-gym:NAME`` run).

The model generates an answer to each held-out question (the prompt exactly as training wrote
it, greedy, through one :class:`cyb.engine.Engine` of ``max_batch`` slots, CUDA graphs on CUDA)
in adaptive mode (a pause only after ``<don't know>``; models without dk read out at step
``M`` as always) or fixed mode, and reasoning-gym's ``score_answer(answer, entry)`` scores the
text, stripped of surrounding white space.  Reported: the mean score, the share of answers
scored 1 (``exact``), the steps per generated token (the end-of-sequence token included), the
positions that went through the network per generated token, and the measured wall time of the
decoding, in total and per answer: from the engine's set-up to the last token, the first
capture of each CUDA graph taken out (as ``cyb bench decode`` does; reported apart), after a
short warm-up decoding on CUDA.  Every row goes to
``reasoning_gym.jsonl`` beside ``metrics.json``.

Answers may be at most as long as the longest held-out answer, plus the end-of-sequence token:
a model that runs on past its answer is cut there, and the verifier judges what it wrote.
"""

from __future__ import annotations

import copy
import statistics
import time
from pathlib import Path

import torch

#: Per-row file of ``cyb eval``'s output folder.
ROWS_FILE = "reasoning_gym.jsonl"
MODES = ("adaptive", "fixed")
#: Rows decoding at once (the engine's slots).
MAX_BATCH = 256


def _decode(model, prompts: list[list[int]], mode: str, max_new_tokens: int, max_batch: int,
            read_at: int | None = None) -> dict:
    """Greedy answers to ``prompts`` through one engine (``max_batch`` slots, CUDA graphs on
    CUDA): ``{"rows", "seconds", "capture_seconds"}``, ``rows`` per prompt ``{"tokens", "steps",
    "positions", "stop"}`` (the generated ids, EOS included, the steps of each, the positions of
    the row, prompt included, and ``"eos"`` or ``"length"``), then the wall time of the whole
    decoding and of the CUDA-graph captures in it."""
    from ..engine import Engine, EngineOptions, Request
    from ..generation.api import default_eos_ids

    eos = frozenset(default_eos_ids(model))
    requests = [Request(tuple(p), max_new_tokens, mode=mode, eos=eos) for p in prompts]
    cuda = model.device.type == "cuda"
    t0 = time.perf_counter()
    with torch.inference_mode():
        engine = Engine.sized_for(model, requests, options=EngineOptions(max_slots=max_batch, cuda_graph=cuda,
                                                                          read_at=read_at))
    index = {engine.submit(r): i for i, r in enumerate(requests)}
    rows = [{"tokens": [], "steps": [], "positions": 0, "stop": None} for _ in prompts]
    for e in engine.run():
        row = rows[index[e.request]]
        row["tokens"].append(int(e.token))
        row["steps"].append(int(e.steps))
        row["positions"], row["stop"] = int(e.positions), e.finished or row["stop"]
    if cuda:
        torch.cuda.synchronize()
    return {"rows": rows, "seconds": time.perf_counter() - t0, "capture_seconds": engine.runner.capture_ms / 1e3}


def score_reasoning(model, config, tokenizer, *, max_rows: int | None = None, mode: str = "adaptive",
                    max_batch: int = MAX_BATCH, repeats: int = 1, read_at: int | None = None) -> dict:
    """Generate and score the answers to the held-out questions of ``config``'s reasoning-gym
    task (the first ``max_rows``); with ``repeats`` > 1 the timed decoding runs that many times
    and ``seconds`` is the median (``seconds_all`` every one; the answers are the first's).
    ``read_at``: the ablation that reads every token out at that step (1: the pauses removed at
    inference, ``M``: every pause taken; :class:`cyb.engine.EngineOptions`).

    Returns ``{"task", "settings", "mode", "num_examples", "mean_score", "exact",
    "mean_steps", "positions_per_token", "tokens", "seconds", "seconds_per_answer",
    "seconds_all", "capture_seconds", "max_new_tokens", "max_batch", "device", "rows"}``: ``mean_steps`` the
    steps per generated token (1..M), ``seconds`` the wall time of the whole decoding without
    the CUDA-graph captures (``capture_seconds``), ``rows`` one dict per
    question (``index``, ``question``, ``answer``: the reference, ``generated``, ``score``,
    ``exact``, ``tokens``, ``steps``, ``positions``, ``stop_reason``)."""
    from ..generation.text import decode_fn
    from ..run_data import task_split

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    cfg = copy.deepcopy(config)
    if max_rows is not None:  # the first rows of a longer draw are the rows of a shorter one
        cfg.data.num_valid_examples = max(1, min(cfg.data.num_valid_examples, int(max_rows)))
    valid = task_split(cfg, tokenizer, "test")
    prompts = [valid.prompt_ids(i) for i in range(valid.num_examples)]
    longest = int((valid.lengths - valid.answer_start).max())  # the completion and end-of-sequence
    was_training = model.training
    model.eval()
    if model.device.type == "cuda":  # kernels, allocations and the first graphs: not timed
        _decode(model, prompts, mode, min(2, longest), max_batch, read_at)
    out = _decode(model, prompts, mode, longest, max_batch, read_at)
    timings = [out["seconds"] - out["capture_seconds"]]
    for _ in range(repeats - 1):
        again = _decode(model, prompts, mode, longest, max_batch, read_at)
        timings.append(again["seconds"] - again["capture_seconds"])
    model.train(was_training)
    decode = decode_fn(tokenizer or model.tokenizer)
    rows = []
    for i, r in enumerate(out["rows"]):
        text = decode(r["tokens"]).strip()
        score = valid.score(i, text)
        rows.append({"index": i, "question": valid.entries[i]["question"], "answer": valid.entries[i]["answer"],
                     "generated": text, "score": score, "exact": score == 1.0, "tokens": len(r["tokens"]),
                     "steps": r["steps"], "positions": r["positions"], "stop_reason": r["stop"]})
    tokens = sum(len(r["steps"]) for r in rows)
    used = sum(len(r["steps"]) * model.num_steps if mode == "fixed" else sum(r["steps"]) for r in rows)
    n = len(rows)
    decoding = statistics.median(timings)
    return {"task": valid.task, "settings": dict(valid.settings), "mode": mode, "read_at": read_at,
            "num_examples": n,
            "mean_score": sum(r["score"] for r in rows) / n, "exact": sum(r["exact"] for r in rows) / n,
            "mean_steps": sum(sum(r["steps"]) for r in rows) / max(tokens, 1),
            "positions_per_token": used / max(tokens, 1), "tokens": tokens, "seconds": decoding,
            "seconds_per_answer": decoding / n, "seconds_all": timings, "capture_seconds": out["capture_seconds"],
            "max_new_tokens": longest, "max_batch": max_batch, "device": str(model.device), "rows": rows}


def write_rows(scores: dict, out_dir) -> str:
    """Write ``scores["rows"]`` as JSON lines into ``out_dir`` (atomically); returns the file name."""
    import json

    from ..files import write_text_atomic

    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in scores["rows"])
    write_text_atomic(Path(out_dir) / ROWS_FILE, text)
    return ROWS_FILE


def format_reasoning(scores: dict) -> str:
    """One summary line."""
    return (f"{scores['task']}: mean score {scores['mean_score']:.3f}, exact {scores['exact']:.1%} on "
            f"{scores['num_examples']} held-out questions ({scores['mode']} decoding"
            + (f", every token read out at step {scores['read_at']}" if scores.get("read_at") else "")
            + f", {scores['mean_steps']:.2f} "
            f"steps per answer token, {scores['seconds_per_answer'] * 1e3:.1f} ms per answer at "
            f"{min(scores['max_batch'], scores['num_examples'])} rows at once on {scores['device']})")


__all__ = ["MODES", "ROWS_FILE", "format_reasoning", "score_reasoning", "write_rows"]
