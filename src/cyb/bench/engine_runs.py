"""Timing the engine (:mod:`cyb.engine`): its steady decoding rate, and an offline job.

* :func:`engine_rate`: ``B`` prompts in ``B`` slots; once every row decodes, ``timed`` engine
  steps are timed on the host clock (each step launches one decoding step and reads the
  decisions of one, as generation does), captures of new graphs taken out.  The prompts are
  prefilled twice, the first time untimed and aborted, so that the timed prefill replays the
  graphs the first captured (a capture's own time also holds the GPU work queued before it: taken
  out of a timed prefill, it made the rate come out too high).  Rows never finish
  while timed.  ``ms_per_token`` is the time per real token of a row: total time / (real tokens
  decided / B).
* :func:`steady_rates`, :func:`ceiling_tokens_per_s`: the steady step and prefill rate, and
  from them a ceiling of a continuous job (every slot busy in every step).
* :func:`offline_job`: many prompts of mixed lengths, each with its own answer length (no
  EOS), through an engine whose KV cache has a given size (continuous batching), against the
  previous release's static batches of the same memory (:mod:`cyb.bench.static_batches`, one
  batch after another, every row kept until the batch's longest answer ends).
"""

from __future__ import annotations

import time

import torch

from ..engine import Engine, EngineOptions, Request, choose_positions
from ..engine.cache import bytes_per_column
from ..engine.layout import RowLayout
from ..generation.decoders import StepReadout
from ..layout import left_pad
from . import static_batches as sb
from .static_batches import CAPACITY_MULTIPLE
from .timing import sync


def engine_rate(model, prompts: list[list[int]], *, mode: str, positions: str, warmup: int, timed: int,
                cuda_graph: bool | None = None, row_attention: bool | None = None) -> dict:
    """The engine's steady rate on ``prompts`` (see the module docstring; ``row_attention``:
    :class:`~cyb.engine.EngineOptions`)."""
    m = model.vocab.num_steps
    max_new = warmup + timed + 4
    reqs = [Request(tuple(p), max_new, mode=mode) for p in prompts]
    # (without prefix caching: the timed fill writes the prompts the untimed one wrote)
    opts = EngineOptions(positions=positions, cuda_graph=cuda_graph, max_slots=len(prompts),
                         prefill_rows=64, prefill_chunk=2048, row_attention=row_attention, prefix_caching=False)
    engine = Engine.sized_for(model, reqs, options=opts)
    b = len(reqs)
    _end(engine, _fill(engine, reqs))  # an untimed fill captures every graph the timed one replays
    sync(model.device)
    capture0 = engine.runner.capture_ms
    t0 = time.perf_counter()
    _fill(engine, reqs)
    sync(model.device)
    prefill_s = time.perf_counter() - t0 - (engine.runner.capture_ms - capture0) / 1e3
    for _ in range(warmup):
        engine.step()
    sync(model.device)
    capture0, steps0 = engine.runner.capture_ms, engine.stats["steps"]
    tokens = steps_used = 0
    t0 = time.perf_counter()
    for _ in range(timed):
        for e in engine.step():
            tokens += 1
            steps_used += e.steps
    sync(model.device)
    elapsed_ms = (time.perf_counter() - t0) * 1e3 - (engine.runner.capture_ms - capture0)
    steps = engine.stats["steps"] - steps0
    out = {"impl": f"engine_{positions}", "mode": mode, "batch": b, "num_steps": m, "positions_per_step": engine.q,
           "prefill_s": prefill_s, "graphs": len(engine.runner.graphs), "capture_ms": engine.runner.capture_ms,
           "step_ms": elapsed_ms / max(steps, 1), "real_tokens": tokens}
    if tokens:
        out.update(ms_per_token=elapsed_ms / (tokens / b), real_tokens_per_s=tokens * 1e3 / elapsed_ms,
                   steps_per_token=steps_used / tokens, positions_per_token=steps * engine.q * b / tokens)
    return out


def _fill(engine: Engine, reqs: list[Request]) -> list[int]:
    """Submit ``reqs`` to an idle ``engine`` and step until every one decodes; returns their ids."""
    ids = [engine.submit(r) for r in reqs]
    while len(engine.scheduler.decoding) < len(reqs):
        engine.step()
    return ids


def _end(engine: Engine, ids: list[int]) -> None:
    """Abort requests ``ids`` and step until ``engine`` is idle (every slot free again)."""
    for rid in ids:
        engine.abort(rid)
    while engine.busy:
        engine.step()


def steady_rates(model, *, rows: int, mode: str, id_limit: int, prompt_len: int = 256, timed: int = 50,
                 seed: int = 1, row_attention: bool | None = None) -> dict:
    """The engine's steady decoding step with ``rows`` rows and its prefill rate
    (:func:`engine_rate` on ``rows`` random prompts of ``prompt_len`` ids below ``id_limit``; the
    positions per step the engine picks for ``mode`` and ``rows``): ``step_ms``,
    ``positions_per_step``, ``real_tokens_per_s`` and ``prefill_columns_s`` (cache columns
    prefilled per second)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, id_limit, (rows, prompt_len), generator=g).tolist()
    r = engine_rate(model, prompts, mode=mode, positions="auto", warmup=4, timed=timed, row_attention=row_attention)
    columns = RowLayout.of(model.vocab, model.pause_visibility).prefill(prompts[0]).columns
    return {"step_ms": r["step_ms"], "positions_per_step": r["positions_per_step"],
            "real_tokens_per_s": r.get("real_tokens_per_s"), "prefill_columns_s": rows * columns / r["prefill_s"]}


def ceiling_tokens_per_s(model, prompts: list[list[int]], answers: list[int], steady: dict, *,
                         decode_positions: int, slots: int) -> float:
    """A ceiling of a continuous job's real tokens per second: its prompts' prefill columns at
    the steady prefill rate plus its decode steps at the steady step time, as if every one of
    ``slots`` slots were busy in every step (``decode_positions``: the positions the job fed while
    decoding, the engine's ``stats``; ``steady`` from :func:`steady_rates` with ``slots`` rows)."""
    layout = RowLayout.of(model.vocab, model.pause_visibility)
    prefill_columns = sum(layout.prefill(list(p)).columns for p in prompts)
    decode_steps = decode_positions / (slots * steady["positions_per_step"])
    seconds = prefill_columns / steady["prefill_columns_s"] + decode_steps * steady["step_ms"] / 1e3
    return sum(answers) / seconds


def mixed_job(count: int, prompt_range: tuple[int, int], answer_range: tuple[int, int], id_limit: int,
              seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """``count`` random prompts with lengths uniform in ``prompt_range`` and answer lengths
    uniform in ``answer_range`` (inclusive; seeded)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(prompt_range[0], prompt_range[1] + 1, (count,), generator=g).tolist()
    answers = torch.randint(answer_range[0], answer_range[1] + 1, (count,), generator=g).tolist()
    prompts = [torch.randint(0, id_limit, (n,), generator=g).tolist() for n in lengths]
    return prompts, answers


def offline_job(model, prompts: list[list[int]], answers: list[int], *, mode: str, batch: int,
                positions: str = "auto", cuda_graph: bool | None = None) -> dict:
    """Continuous batching of the whole job through one engine whose cache holds what ``batch``
    static rows of the job's longest prompt and answer hold (the previous release's memory for a
    batch of ``batch``): real tokens per second, wall time, slots used."""
    layout = RowLayout.of(model.vocab, model.pause_visibility)
    cache_bytes = batch * static_row_columns(model, prompts, answers) * bytes_per_column(model)
    reqs = [Request(tuple(p), n, mode=mode) for p, n in zip(prompts, answers)]
    capacity = max(layout.columns_needed(len(r.prompt), r.max_new_tokens) for r in reqs)
    opts = EngineOptions(positions=positions, cuda_graph=cuda_graph, cache_bytes=cache_bytes,
                         max_slots=4 * batch)
    q = choose_positions(model, [mode], batch, positions)
    sync(model.device)
    t0 = time.perf_counter()
    engine = Engine(model, capacity=capacity, slots=len(reqs), positions=q, options=opts)
    for r in reqs:
        engine.submit(r)
    tokens = 0
    for _ in engine.run():
        tokens += 1
    sync(model.device)
    seconds = time.perf_counter() - t0
    return {"impl": "engine", "mode": mode, "prompts": len(prompts), "slots": engine.slots,
            "positions_per_step": engine.q, "cache_gib": engine.cache.nbytes / 2**30, "seconds": seconds,
            "real_tokens": tokens, "real_tokens_per_s": tokens / seconds, "steps": engine.stats["steps"],
            "prefill_forwards": engine.stats["prefill_forwards"], "graphs": len(engine.runner.graphs)}


def static_row_columns(model, prompts: list[list[int]], answers: list[int]) -> int:
    """Columns of one row of the previous release's static cache for the job's longest prompt
    and answer (what :func:`offline_static` allocates per row at most)."""
    m, p, n = model.vocab.num_steps, max(len(x) for x in prompts), max(answers)
    if model.pause_visibility == "private":
        needed = p + m - 1 + n + m + 2
    else:
        needed = p * m + (n + 1) * m
    return -(-needed // CAPACITY_MULTIPLE) * CAPACITY_MULTIPLE


def offline_static(model, prompts: list[list[int]], answers: list[int], *, mode: str, batch: int,
                   cuda_graph: bool | None = None) -> dict:
    """The same job in the previous release's static batches of ``batch`` prompts, in order:
    each batch left-padded, decoded until its longest answer, greedy (blocks in adaptive mode)."""
    readout = StepReadout(model.vocab, model.dk_bias)
    sync(model.device)
    t0 = time.perf_counter()
    tokens = steps = 0
    peak = 0.0
    for s in range(0, len(prompts), batch):
        chunk, wanted = prompts[s:s + batch], answers[s:s + batch]
        n = max(wanted)
        with torch.inference_mode():
            ids, mask = left_pad(chunk, model.device)
            if model.pause_visibility == "private":
                dec = sb.StaticPrivateDecoder(model, ids, mask, readout, max_new_tokens=n, cuda_graph=cuda_graph,
                                              mode=mode)
            else:
                cls = sb.StaticFixedDecoder if mode == "fixed" else sb.StaticBlockAdaptiveDecoder
                dec = cls(model, ids, mask, readout, max_new_tokens=n, cuda_graph=cuda_graph)
            dec.start().token.tolist()
            for _ in range(n - 1):
                dec.step().token.tolist()
                steps += 1
            peak = max(peak, sum(t.numel() * t.element_size() for t in dec.cache.keys + dec.cache.values) / 2**30)
        tokens += sum(wanted)
        del dec
    sync(model.device)
    seconds = time.perf_counter() - t0
    return {"impl": "static_batches", "mode": mode, "prompts": len(prompts), "slots": batch,
            "cache_gib": peak, "seconds": seconds, "real_tokens": tokens,
            "real_tokens_per_s": tokens / seconds, "steps": steps}


__all__ = ["engine_rate", "mixed_job", "offline_job", "offline_static"]
