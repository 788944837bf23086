"""The engine at real model sizes: one job offline, what it would take at best, batch 1 against
the card's memory, and whether preemption changes tokens (``benchmarks/serve_sizes.py``).

* :func:`engine_job`: a job through one :class:`cyb.engine.Engine` whose rows may hold
  ``max_model_len`` tokens, with ``C`` closed-loop clients (each sends its next request when its
  last one ends, as the serve benchmark's clients do).  It counts the slots in use after every
  step, the time to first token, and the gaps between a request's tokens, one gap per token (the
  engine hands out one token per row per step; a token that paused took several steps and its gap
  holds them all).  CUDA graph captures are made before the timed run, or taken out of it.
* :func:`today_slots`: how many rows the engine of one slot per request of ``max_model_len``
  columns fits in the same cache bytes.
* :func:`steady` and :func:`ceiling`: the job's real tokens per second if every one of ``rows``
  rows were busy in every step: the run's prefill positions at the steady prefill rate, and its
  decoding positions at the steady step time of ``rows`` rows of the job's mean length.
* :func:`batch_one`, :func:`copy_bandwidth`, :func:`weight_bytes`: the time per token at batch 1
  against the time to read the weights once at the card's copy bandwidth.
* :func:`preemption_check`: a few requests with a cache too small for them all, against the same
  requests with a large cache (and the large cache at half the rows, the noise of a different
  batch alone).
"""

from __future__ import annotations

import time

import torch

from .engine_features import STATS, engine_options, prefix_hit_rate
from .load import percentile
from .timing import sync


def _capacity(pm, max_model_len: int) -> int:
    """Cache columns of a request of ``max_model_len`` real tokens, laid out for ``pm``'s pauses."""
    from ..engine.layout import RowLayout

    return RowLayout.of(pm.vocab, pm.pause_visibility).columns_needed(1, max_model_len - 1)


def _multiple() -> int:
    """Columns a whole row is rounded up to (the engine's ``capacity_multiple``; 128 where it has none)."""
    from ..engine import EngineOptions

    return getattr(EngineOptions(), "capacity_multiple", 128)


def today_slots(pm, max_model_len: int, cache_bytes: int, positions: int) -> int:
    """Rows of ``max_model_len`` real tokens that ``cache_bytes`` hold when every row is allocated
    whole, as the engine of one slot per request sizes them (``positions``: per row per step)."""
    from ..engine.cache import bytes_per_column

    mult = _multiple()
    capacity = -(-(_capacity(pm, max_model_len) + 2 * positions) // mult) * mult
    return int(cache_bytes // ((capacity + positions) * bytes_per_column(pm)))


def engine_job(pm, items, *, mode: str, max_model_len: int | None, slots: int, cache_bytes: int,
               clients: int | None = None, options: dict | None = None, capacity: int | None = None,
               deadline: float | None = None, keep_tokens: bool = False) -> dict:
    """``items`` (``(prompt ids, answer length)``, EOS ignored) through an engine of ``slots``
    slots and ``cache_bytes`` of cache whose rows hold ``max_model_len`` tokens (or ``capacity``
    columns; ``today_slots`` is then None), fed by ``clients`` closed-loop clients (None: every
    request at once); ``options``: further :class:`~cyb.engine.EngineOptions` fields (those this
    engine lacks are named in ``dropped_options``).  Past ``deadline`` (``time.perf_counter``) every request is
    aborted and ``stopped_early`` set.  Times in ms; ``tokens`` (with ``keep_tokens``): each
    request's tokens, in the items' order."""
    from ..engine import Engine, Request, choose_positions

    opts, dropped = engine_options(max_slots=slots, cache_bytes=int(cache_bytes), **(options or {}))
    q = choose_positions(pm, [mode], slots)
    engine = Engine(pm, capacity=capacity or _capacity(pm, max_model_len), slots=slots, positions=q, options=opts)
    engine.warm_up()
    reqs = [Request(tuple(p), n, mode=mode) for p, n in items]
    n = len(reqs)
    index: dict[int, int] = {}
    sent = [0.0] * n
    tokens: list[list[int]] = [[] for _ in range(n)]
    ttft: list[float] = []
    last: dict[int, float] = {}
    gaps: list[float] = []
    step_gaps: list[float] = []
    ended: list[str | None] = [None] * n
    in_use: list[int] = []
    queued: list[int] = []
    steps_taken = 0
    stopped = False

    def send(i: int) -> None:
        index[engine.submit(reqs[i])] = i
        sent[i] = time.perf_counter()

    sync(pm.device)
    stats0, capture0 = dict(engine.stats), engine.runner.capture_ms
    t0 = time.perf_counter()
    following = n if clients is None else min(clients, n)
    for i in range(following):
        send(i)
    while engine.busy:
        events = engine.step()
        now = time.perf_counter()
        in_use.append(engine.slots_in_use)
        queued.append(engine.queued)
        for e in events:
            i = index[e.request]
            tokens[i].append(e.token)
            steps_taken += e.steps
            if i in last:
                gap = (now - last[i]) * 1e3
                gaps.append(gap)
                step_gaps.append(gap / e.steps)
            else:
                ttft.append((now - sent[i]) * 1e3)
            last[i] = now
            if e.finished is not None:
                ended[i] = e.finished
                if following < n and not stopped:
                    send(following)
                    following += 1
        if deadline is not None and not stopped and now > deadline:
            stopped = True
            for rid, i in index.items():
                if ended[i] is None:
                    engine.abort(rid)
    sync(pm.device)
    capture_s = (engine.runner.capture_ms - capture0) / 1e3
    seconds = time.perf_counter() - t0 - capture_s
    done = [i for i in range(n) if ended[i] is not None]
    wrong = [i for i in done if ended[i] != "length" or len(tokens[i]) != reqs[i].max_new_tokens]
    real = sum(len(t) for t in tokens)
    stats = {k: v - stats0.get(k, 0) if isinstance(v, (int, float)) else v for k, v in engine.stats.items()}
    busy = [s for s, w in zip(in_use, queued) if w > 0]
    out = {
        "seconds": seconds, "capture_s": capture_s, "requests": n, "finished": len(done), "failed": len(wrong),
        "stopped_early": stopped, "real_tokens": real, "real_tokens_per_s": real / seconds if seconds > 0 else None,
        "mean_steps": steps_taken / real if real else None, "slots": engine.slots, "positions_per_step": engine.q,
        "cache_gib": getattr(engine.cache, "nbytes", 0) / 2**30, "cache_budget_gib": cache_bytes / 2**30,
        "slots_in_use_peak": max(in_use, default=0),
        "slots_in_use_mean": sum(in_use) / len(in_use) if in_use else None,
        "slots_in_use_mean_queued": sum(busy) / len(busy) if busy else None,
        "today_slots": today_slots(pm, max_model_len, cache_bytes, engine.q) if max_model_len else None,
        "ttft_ms_p50": percentile(ttft, 50), "ttft_ms_p99": percentile(ttft, 99),
        "itl_ms_p50": percentile(gaps, 50), "itl_ms_p99": percentile(gaps, 99),
        "itl_step_ms_p50": percentile(step_gaps, 50), "itl_step_ms_p99": percentile(step_gaps, 99),
        "stats": stats, "dropped_options": dropped, "options": {k: v for k, v in (options or {}).items()},
    }
    for name in STATS:
        out[name] = stats.get(name)
    out["prefix_hit_rate"] = prefix_hit_rate(stats)
    if out["itl_ms_p50"]:
        out["itl_p99_over_p50"] = out["itl_ms_p99"] / out["itl_ms_p50"]
    if keep_tokens:
        out["tokens"] = tokens
    del engine
    return out


# --------------------------------------------------------------------------- the ceiling


def steady(pm, *, rows: int, mode: str, prompt_len: int, id_limit: int, timed: int = 50, seed: int = 1) -> dict:
    """The engine's steady decoding step over ``rows`` rows of ``prompt_len`` tokens and its
    prefill rate (:func:`cyb.bench.engine_runs.engine_rate` on random prompts; fewer rows where
    the engine's default cache holds fewer): ``step_ms``, ``positions_per_step``, ``rows`` and
    ``prefill_columns_s``."""
    from ..engine.cache import bytes_per_column
    from ..engine.engine import default_cache_bytes
    from ..engine.layout import RowLayout
    from .engine_runs import engine_rate

    # engine_rate's engine has the default cache and waits until every row decodes: no more rows
    # than that cache holds (as the engine sizes a row: its columns and slack, rounded up)
    layout, m, mult = RowLayout.of(pm.vocab, pm.pause_visibility), pm.vocab.num_steps, _multiple()
    row = (-(-(layout.columns_needed(prompt_len, timed + 8) + 2 * m) // mult) * mult + m) * bytes_per_column(pm)
    rows = max(1, min(rows, int(default_cache_bytes(pm.device) // row)))
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, id_limit, (rows, prompt_len), generator=g).tolist()
    r = engine_rate(pm, prompts, mode=mode, positions="auto", warmup=4, timed=timed)
    columns = layout.prefill(prompts[0]).columns
    return {"step_ms": r["step_ms"], "positions_per_step": r["positions_per_step"], "rows": r["batch"],
            "prompt_len": prompt_len, "prefill_columns_s": r["batch"] * columns / r["prefill_s"]}


def ceiling_rows(pm, job_summary: dict, *, concurrency: int, cache_bytes: int) -> tuple[int, int]:
    """``(rows, prompt_len)`` of the ceiling: the rows of the job's mean length (its mean prompt
    and half its mean answer) that ``cache_bytes`` hold, at most ``concurrency``."""
    from ..engine.cache import bytes_per_column
    from ..engine.layout import RowLayout

    length = int(job_summary["mean_prompt"] + job_summary["mean_answer"] / 2)
    columns = RowLayout.of(pm.vocab, pm.pause_visibility).columns_needed(length, 1)
    return max(1, min(concurrency, int(cache_bytes // (columns * bytes_per_column(pm))))), length


def ceiling(run: dict, steady_rates: dict) -> float:
    """Real tokens per second of ``run`` (:func:`engine_job`) had its prefill positions gone at
    the steady prefill rate and its decoding positions in steps of every one of the steady
    ``rows`` rows busy, at the steady step time."""
    s = run["stats"]
    decode_steps = s["decode_positions"] / (steady_rates["rows"] * steady_rates["positions_per_step"])
    seconds = s["prefill_positions"] / steady_rates["prefill_columns_s"] + decode_steps * steady_rates["step_ms"] / 1e3
    return run["real_tokens"] / seconds


# --------------------------------------------------------------------------- batch 1


def weight_bytes(hf_model) -> int:
    """Bytes of the model's parameters and buffers, tied matrices counted once."""
    params = {id(p): p for p in hf_model.parameters()}.values()
    return sum(t.numel() * t.element_size() for t in params)


def copy_bandwidth(device, nbytes: int = 1 << 30, repeats: int = 10) -> dict:
    """The card's device-to-device copy: ``bytes_per_s`` counts the bytes read and written, the
    median of ``repeats`` copies of ``nbytes`` (CUDA events); None off CUDA."""
    device = torch.device(device)
    if device.type != "cuda":
        return {"bytes_per_s": None, "nbytes": nbytes}
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    del a, b
    return {"bytes_per_s": 2 * nbytes / times[len(times) // 2], "nbytes": nbytes, "repeats": repeats}


def batch_one(pm, *, mode: str, id_limit: int, prompt_len: int = 256, timed: int = 64) -> dict:
    """Time per real token of one request (:func:`cyb.bench.engine_runs.engine_rate`, the
    positions per step the engine picks for one row)."""
    from .engine_runs import engine_rate

    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, id_limit, (prompt_len,), generator=g).tolist()
    r = engine_rate(pm, [prompt], mode=mode, positions="auto", warmup=8, timed=timed)
    return {"ms_per_token": r.get("ms_per_token"), "steps_per_token": r.get("steps_per_token"),
            "positions_per_step": r["positions_per_step"], "prompt_len": prompt_len, "timed_steps": timed}


# --------------------------------------------------------------------------- preemption


def preemption_check(pm, items, *, mode: str, slots: int, small_fraction: float = 0.25,
                     options: dict | None = None) -> dict:
    """``items`` through ``slots`` slots three times: with a cache that holds every row at its
    longest (the reference), the same at half the slots (a different batch alone), and with
    ``small_fraction`` of the reference's bytes (at least one row's), where a paged engine must
    preempt.  ``changed``: requests whose tokens differ from the reference's; ``noise``: those
    that differ at half the slots; ``failed``: requests that did not end with their length."""
    from ..engine.cache import bytes_per_column
    from ..engine.layout import RowLayout

    layout = RowLayout.of(pm.vocab, pm.pause_visibility)
    needed = sorted((layout.columns_needed(len(p), n) for p, n in items), reverse=True)
    capacity, m = needed[0], pm.vocab.num_steps
    per_column = bytes_per_column(pm)
    mult = _multiple()
    row_bytes = (-(-(capacity + 2 * m) // mult) * mult + m) * per_column  # one whole row, as the engine sizes it
    large = max(sum(needed[:slots]) * per_column, row_bytes * slots)
    small = max(int(large * small_fraction), row_bytes)
    kw = dict(mode=mode, max_model_len=None, capacity=capacity, options=options, keep_tokens=True)
    ref = engine_job(pm, items, slots=slots, cache_bytes=large, **kw)
    half = engine_job(pm, items, slots=max(1, slots // 2), cache_bytes=large, **kw)
    tight = engine_job(pm, items, slots=slots, cache_bytes=small, **kw)
    changed = sum(a != b for a, b in zip(ref["tokens"], tight["tokens"]))
    noise = sum(a != b for a, b in zip(ref["tokens"], half["tokens"]))
    keep = ("slots", "slots_in_use_peak", "preemptions", "failed", "finished", "real_tokens_per_s", "cache_gib")
    return {"requests": len(items), "slots": slots, "large_gib": large / 2**30, "small_gib": small / 2**30,
            "reference": {k: ref[k] for k in keep}, "half_slots": {k: half[k] for k in keep},
            "small_cache": {k: tight[k] for k in keep}, "preemptions": tight["preemptions"],
            "changed": changed, "noise": noise, "failed": ref["failed"] + half["failed"] + tight["failed"],
            "dtype": str(next(pm.parameters()).dtype).removeprefix("torch.")}


__all__ = ["batch_one", "ceiling", "ceiling_rows", "copy_bandwidth", "engine_job", "preemption_check", "steady",
           "today_slots", "weight_bytes"]
