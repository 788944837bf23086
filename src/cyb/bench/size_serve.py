"""A size benchmark job through ``cyb serve`` (``benchmarks/serve_sizes.py --serve``): the pause
model saved to a folder, the server in a child process with ``C`` slots, ``max_model_len`` and the
cache bytes of the offline run, and ``C`` closed-loop streaming clients sending the job's
requests (greedy, EOS ignored), in load processes of
:data:`cyb.bench.load.STREAMS_PER_CLIENT` streams each.

The inter-token gaps are counted per token: an event that brings ``k`` tokens after a gap of
``g`` counts ``k`` gaps of ``g / k``, so that a stream whose tokens come two to an event weighs
as much as one whose tokens come one by one.
"""

from __future__ import annotations

import os
import tempfile

from .load import client_processes, load_from_processes, percentile, summarise

#: requests sent before the timed load (they capture what the server captures under load)
WARM_REQUESTS = 32


def token_gaps(result) -> list[float]:
    """Seconds between a stream's tokens, one per token after its first (see the module docstring)."""
    out, before = [], None
    for t, n in result.events:
        if before is not None and n > 0:
            out += [(t - before) / n] * n
        before = t
    return out


def served_job(pm, items, *, mode: str, max_model_len: int, slots: int, cache_bytes: int, dtype: str,
               device) -> dict:
    """``items`` through ``cyb serve`` on ``pm`` (see the module docstring): what the clients
    saw (:func:`cyb.bench.load.summarise`) and the gaps per token, p50 and p99 in ms."""
    from .serve import ChildServer

    with tempfile.TemporaryDirectory(prefix="cyb-serve-sizes-") as tmp:
        folder = str(pm.save_pretrained(os.path.join(tmp, "model")))
        server = ChildServer(folder, slots=slots, max_model_len=max_model_len, device=device, dtype=dtype,
                             cache_bytes=cache_bytes, mode=mode)
        try:
            procs = client_processes(slots)
            warm = items[:min(WARM_REQUESTS, len(items))]
            load_from_processes(server.url, warm, concurrency=slots, processes=procs, mode=mode)
            results, wall = load_from_processes(server.url, items, concurrency=slots, processes=procs, mode=mode)
        finally:
            server.stop()
    out = summarise(results, wall)
    gaps = [g * 1e3 for r in results if r.ok for g in token_gaps(r)]
    out.update(client_processes=procs, itl_token_ms_p50=percentile(gaps, 50), itl_token_ms_p99=percentile(gaps, 99))
    if out["itl_token_ms_p50"]:
        out["itl_token_p99_over_p50"] = out["itl_token_ms_p99"] / out["itl_token_ms_p50"]
    return out


__all__ = ["served_job", "token_gaps"]
