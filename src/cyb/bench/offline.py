"""The serve benchmark's work without a server: the engine offline (every request submitted at
once, or from closed-loop clients), and :func:`cyb.generation.generate` in static batches, each
timed without the CUDA graph captures it makes (``cyb bench serve``, ``benchmarks/engine_traffic.py``)."""

from __future__ import annotations

import contextlib
import time

from .load import percentile
from .timing import sync


def offline_engine(model, items, *, slots: int, mode: str, capacity: int, cache_bytes: int | None = None,
                   refill: int = 0, refill_wait: int | None = None, clients: int | None = None,
                   prefill_rows: int | None = None, row_attention: bool | None = None,
                   warm: list[tuple[list[int], int]] | None = None, options: dict | None = None) -> dict:
    """The engine with the server's options (the positions per step of a server whose default
    mode is ``mode``; ``refill``, ``refill_wait``: :class:`~cyb.engine.EngineOptions`, None its
    default; ``prefill_rows`` and ``row_attention`` likewise; ``options``: further fields) and ``slots`` slots.  Every request is submitted at once,
    or with ``clients``, as that many closed-loop clients send them: each its next request when its
    last one ends (the load the serve benchmark's clients bring, without HTTP).  The inter-token
    latency is the time between a request's tokens as the engine hands them out.

    The time the CUDA graph captures of the timed run took is left out (``capture_s``; a capture
    also waits for the work queued before it, so that figure holds a little of the run's own GPU
    time, one step or prefill forward at most a capture).  Without ``warm`` the engine is built
    inside the timed run and captures every graph there.  With ``warm`` (prompts and answer
    lengths) it is readied as a server's is before the timed run: :meth:`Engine.warm_up`, then
    ``warm`` decoded to the end; the timed run then captures only the graphs that readying did not
    reach (a server captures those under load: submitted at once, the warm-up requests start
    together and skip some row counts that requests arriving over HTTP reach).  ``stats`` counts
    the timed run only."""
    from ..engine import Engine, EngineOptions, Request, choose_positions

    reqs = [Request(tuple(p), n, mode=mode) for p, n in items]
    given = {"refill_wait": refill_wait, "prefill_rows": prefill_rows, **(options or {})}
    opts = EngineOptions(max_slots=slots, cache_bytes=cache_bytes, refill=refill, row_attention=row_attention,
                         **{k: v for k, v in given.items() if v is not None})

    def build():
        return Engine(model, capacity=capacity, slots=slots, positions=choose_positions(model, [mode], slots),
                      options=opts)

    engine = None
    if warm is not None:
        engine = build()
        engine.warm_up()
        for p, n in warm:
            engine.submit(Request(tuple(p), n, mode=mode))
        for _ in engine.run():
            pass
    stats0 = dict(engine.stats) if engine is not None else {}
    capture0 = engine.runner.capture_ms if engine is not None else 0.0
    sync(model.device)
    t0 = time.perf_counter()
    if engine is None:
        engine = build()
    first = len(reqs) if clients is None else clients
    for r in reqs[:first]:
        engine.submit(r)
    following = iter(reqs[first:])
    tokens = steps = 0
    last: dict[int, float] = {}
    gaps: list[float] = []
    for e in engine.run():
        now = time.perf_counter()
        tokens += 1
        steps += e.steps
        if e.request in last:
            gaps.append((now - last[e.request]) * 1e3)
        last[e.request] = now
        if e.finished is not None:
            r = next(following, None)
            if r is not None:
                engine.submit(r)
    sync(model.device)
    capture_s = (engine.runner.capture_ms - capture0) / 1e3
    seconds = time.perf_counter() - t0 - capture_s
    return {"seconds": seconds, "capture_s": capture_s, "real_tokens": tokens, "real_tokens_per_s": tokens / seconds,
            "mean_steps": steps / tokens if tokens else None, "slots": engine.slots,
            "stats": {k: v - stats0.get(k, 0) for k, v in engine.stats.items()},
            "graphs": len(engine.runner.graphs), "warmed": warm is not None, "clients": clients,
            "itl_ms_p50": percentile(gaps, 50), "itl_ms_p99": percentile(gaps, 99)}


@contextlib.contextmanager
def engine_runners_made():
    """While inside, every :class:`cyb.engine.runner.Runner` built (by any engine, one per
    :func:`cyb.generation.generate` call) is added to the yielded list, so that the time their
    CUDA graph captures took (``capture_ms``) can be read after."""
    from ..engine import runner as runner_module

    made = []
    init = runner_module.Runner.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    runner_module.Runner.__init__ = recording
    try:
        yield made
    finally:
        runner_module.Runner.__init__ = init


def static_generate(model, items, *, batch: int, mode: str, engine_options=None) -> dict:
    """:func:`cyb.generation.generate` on batches of ``batch`` prompts, one after another, each
    to its longest answer; the tokens counted are the answers' lengths.  Each call builds an
    engine and captures its CUDA graphs: ``real_tokens_per_s`` leaves that capture time out (as
    :func:`offline_engine` does, so the two compare batching alone), ``with_captures_tokens_per_s``
    keeps it (what a user's one-off calls take)."""
    from ..generation import generate

    sync(model.device)
    t0 = time.perf_counter()
    with engine_runners_made() as runners:
        for s in range(0, len(items), batch):
            part = items[s:s + batch]
            generate(model, [p for p, _ in part], mode=mode, max_new_tokens=max(n for _, n in part),
                     eos_token_ids=(), max_batch=batch, engine_options=engine_options)
    sync(model.device)
    wall = time.perf_counter() - t0
    capture_s = sum(r.capture_ms for r in runners) / 1e3
    seconds = wall - capture_s
    tokens = sum(n for _, n in items)
    return {"seconds": seconds, "capture_s": capture_s, "real_tokens": tokens, "real_tokens_per_s": tokens / seconds,
            "with_captures_tokens_per_s": tokens / wall}


__all__ = ["engine_runners_made", "offline_engine", "static_generate"]
