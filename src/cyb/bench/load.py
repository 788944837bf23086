"""The load of ``cyb bench serve``: streamed requests from closed-loop or Poisson clients, in one
process or spread over several, a probe of the server's gauges while they run, and the
statistics of what the clients saw."""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time

#: the model name the benchmark's server answers to
NAME = "bench"


# --------------------------------------------------------------------------- statistics


def percentile(values, q: float) -> float | None:
    """The ``q``-th percentile (linear interpolation), None when empty."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def step_gaps(result) -> list[float]:
    """Seconds between consecutive events of a :class:`cyb.serve.client.StreamResult`, each
    divided by the decoding steps of the tokens the later event carries (a token that paused
    takes several steps: its gap is several steps long by design)."""
    out, at, before = [], 0, None
    for t, n in result.events:
        if before is not None:
            out.append((t - before) / max(1, sum(result.steps[at:at + n])))
        before, at = t, at + n
    return out


def summarise(results, wall_s: float) -> dict:
    """Throughput and latencies (ms) of a load's :class:`cyb.serve.client.StreamResult` list;
    ``itl_step_ms_*``: the gaps between events a decoding step (:func:`step_gaps`)."""
    ok = [r for r in results if r.ok]
    tokens = sum(r.tokens for r in ok)
    steps = sum(sum(r.steps) for r in ok)
    ttft = [r.ttft * 1e3 for r in ok if r.ttft is not None]
    gaps = [g * 1e3 for r in ok for g in r.gaps()]
    per_step = [g * 1e3 for r in ok for g in step_gaps(r)]
    tpot = [(r.events[-1][0] - r.events[0][0]) * 1e3 / (r.tokens - 1) for r in ok if r.tokens > 1 and r.events]
    events = sum(len(r.events) for r in ok)
    errors = [r.error or f"HTTP {r.status}" for r in results if not r.ok]
    return {"requests": len(results), "errors": len(errors), "first_error": errors[0] if errors else None,
            "seconds": wall_s, "real_tokens": tokens, "real_tokens_per_s": tokens / wall_s if wall_s else None,
            "requests_per_s": len(ok) / wall_s if wall_s else None,
            "mean_steps": steps / tokens if tokens else None, "tokens_per_event": tokens / events if events else None,
            "ttft_ms_p50": percentile(ttft, 50), "ttft_ms_p99": percentile(ttft, 99),
            "itl_ms_p50": percentile(gaps, 50), "itl_ms_p99": percentile(gaps, 99),
            "itl_step_ms_p50": percentile(per_step, 50), "itl_step_ms_p99": percentile(per_step, 99),
            "tpot_ms_p50": percentile(tpot, 50), "tpot_ms_p99": percentile(tpot, 99)}


# --------------------------------------------------------------------------- load


async def load(url: str, items, *, concurrency: int, arrivals: str = "closed", rate: float | None = None,
               mode: str, seed: int = 0, take=None):
    """Send ``items`` (``(prompt ids, answer length)``) as streamed completions; returns the
    results in order and the wall time from the first send to the last end.  Closed-loop
    clients take the next item from ``take()`` (an index, None when none is left; default: each
    item in turn), so that several processes can share one list: the items another process
    took stay None in the results."""
    from ..serve.client import stream

    results = [None] * len(items)

    def body(i: int) -> dict:
        prompt, answer = items[i]
        return {"model": NAME, "prompt": prompt, "max_tokens": answer, "ignore_eos": True, "temperature": 0,
                "mode": mode}

    async def one(i: int) -> None:
        results[i] = await stream(url, "/v1/completions", body(i))

    t0 = time.perf_counter()
    if arrivals == "closed":
        if take is None:
            order = iter(range(len(items)))
            take = lambda: next(order, None)  # noqa: E731

        async def client() -> None:
            while (i := take()) is not None:
                await one(i)

        await asyncio.gather(*(client() for _ in range(min(concurrency, len(items)))))
    else:
        rng = random.Random(seed)
        gate = asyncio.Semaphore(concurrency)
        tasks, at = [], 0.0

        async def gated(i: int) -> None:
            async with gate:
                await one(i)

        for i in range(len(items)):
            at += rng.expovariate(rate)
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(gated(i)))
        await asyncio.gather(*tasks)
    wall = max((r.end for r in results if r is not None), default=t0) - t0
    return results, wall


#: streams one load process drives at most: one Python process reads the events of 256 streams
#: (about 28,000 a second at 256 streams on an H200) near the rate of one core, so the load is
#: spread and the client is never the limit.  Against a server of one HTTP process (two tokens per
#: event) four processes measured the same as one; against four HTTP processes (one token per
#: event, 40-55k events a second) eight gave 41.5k tokens/s where four gave 33.3k, so 32
STREAMS_PER_CLIENT = 32


def client_processes(concurrency: int, wanted: int | None = None) -> int:
    """Load processes for ``concurrency`` streams (``wanted``, else one per
    :data:`STREAMS_PER_CLIENT`, at most 8), never more than the streams."""
    n = wanted or min(8, -(-concurrency // STREAMS_PER_CLIENT))
    return max(1, min(n, concurrency))


def load_from_processes(url: str, items, *, concurrency: int, processes: int, arrivals: str = "closed",
                        rate: float | None = None, mode: str, seed: int = 0):
    """:func:`load` spread over ``processes`` processes, started together: closed-loop clients
    take the next item of one shared list (a counter in shared memory), as the clients of one
    process do, so that no process idles while another still has a backlog; Poisson arrivals
    take every ``processes``-th item at ``rate / processes`` each (a Poisson stream together).
    Returns the results in the items' order and the wall time from the first send to the last
    end (``time.perf_counter`` is one clock across processes)."""
    if processes <= 1:
        return asyncio.run(load(url, items, concurrency=concurrency, arrivals=arrivals, rate=rate, mode=mode,
                                seed=seed))
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    go, answers = ctx.Event(), ctx.Queue()
    shared = arrivals == "closed"
    counter = ctx.Value("q", 0) if shared else None
    workers = []
    for i in range(processes):
        share = concurrency // processes + (i < concurrency % processes)
        shard = items if shared else items[i::processes]
        args = (url, shard, share, arrivals, rate / processes if rate else None, mode, seed + i, go, answers, i,
                counter)
        workers.append(ctx.Process(target=_load_shard, args=args, daemon=True))
    for w in workers:
        w.start()
    for _ in workers:
        answers.get(timeout=300)  # ready
    go.set()
    results = [None] * len(items)
    for _ in workers:
        i, part = answers.get()
        if isinstance(part, str):
            raise RuntimeError(f"load process {i} failed: {part}")
        if shared:
            results = [r if r is not None else mine for r, mine in zip(results, part)]
        else:
            results[i::processes] = part
    for w in workers:
        w.join(30)
    wall = max(r.end for r in results) - min(r.start for r in results)
    return results, wall


def _load_shard(url, items, concurrency, arrivals, rate, mode, seed, go, answers, index, counter) -> None:
    """One load process of :func:`load_from_processes` (``counter``: the next item of the shared
    list, or None for a shard of its own)."""
    take = None
    if counter is not None:
        def take():
            with counter.get_lock():
                i = counter.value
                if i >= len(items):
                    return None
                counter.value = i + 1
            return i

    answers.put(("ready", index))
    go.wait()
    try:
        results, _ = asyncio.run(load(url, items, concurrency=concurrency, arrivals=arrivals, rate=rate, mode=mode,
                                      seed=seed, take=take))
        answers.put((index, results))
    except Exception as e:  # noqa: BLE001 - said by the parent
        answers.put((index, f"{type(e).__name__}: {e}"))


class ServerProbe:
    """Reads the server's ``/metrics`` every ``period`` seconds in a thread, while a load runs:
    the engine's slots in use, its queue, the requests in flight, its steps, and how long the
    server took to answer (the event loop's lag under the load)."""

    GAUGES = ("cyb_slots_in_use", "cyb_queue_length", "cyb_requests_in_flight", "cyb_engine_steps_total")

    def __init__(self, url: str, period: float = 0.1) -> None:
        self.url, self.period = url + "/metrics", period
        self.samples: list[tuple] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "ServerProbe":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        import urllib.request

        while not self._stop.wait(self.period):
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url, timeout=10) as r:
                    text = r.read().decode()
            except OSError:
                continue
            t1 = time.perf_counter()
            values = {}
            for line in text.splitlines():
                name, _, value = line.partition(" ")
                if name in self.GAUGES:
                    values[name] = float(value)
            self.samples.append((t1, (t1 - t0) * 1e3, *(values.get(g, math.nan) for g in self.GAUGES)))

    def summary(self, start: float = -math.inf, end: float = math.inf) -> dict:
        """Means over the samples taken between ``start`` and ``end`` (``time.perf_counter``),
        the engine's steps per second and the answer time p50 / p99."""
        s = [x for x in self.samples if start <= x[0] <= end]
        if len(s) < 2:
            return {}
        mean = lambda i: sum(x[i] for x in s) / len(s)  # noqa: E731
        return {"samples": len(s), "slots_in_use_mean": mean(2), "queued_mean": mean(3),
                "in_flight_mean": mean(4), "engine_steps_per_s": (s[-1][5] - s[0][5]) / (s[-1][0] - s[0][0]),
                "metrics_ms_p50": percentile([x[1] for x in s], 50),
                "metrics_ms_p99": percentile([x[1] for x in s], 99)}


def job(count: int, prompt_lengths, answer_lengths, limit: int, seed: int) -> list[tuple[list[int], int]]:
    """``count`` seeded ``(prompt ids, answer length)`` pairs, lengths uniform in the ranges."""
    from .engine_runs import mixed_job

    prompts, answers = mixed_job(count, tuple(prompt_lengths), tuple(answer_lengths), limit, seed=seed)
    return list(zip(prompts, answers))


__all__ = ["NAME", "STREAMS_PER_CLIENT", "ServerProbe", "client_processes", "job", "load", "load_from_processes",
           "percentile", "step_gaps", "summarise"]
