"""The server's counters and gauges, rendered as Prometheus text (``GET /metrics``).

Counters are updated on the event loop's thread; the engine's gauges come from the worker's
last snapshot.  Names start with ``cyb_``.  With several HTTP processes (``cyb serve
--http-processes N``) each counts its own requests and shares them every
:data:`SHARE_PERIOD_S` (:meth:`Metrics.shareable`); ``/metrics`` on any of them reports the
sums, the other processes' part as of their last share.
"""

from __future__ import annotations

import time
from collections import Counter, deque

#: upper bounds of the time-to-first-token histogram, in seconds
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: seconds over which tokens per second is measured
RATE_WINDOW_S = 10.0
#: seconds between two shares of an HTTP process's counters with the others
SHARE_PERIOD_S = 0.5
#: what the engine worker's snapshot holds, in order (:func:`engine_snapshot`)
SNAPSHOT = ("slots_in_use", "queued", "steps", "decode_positions", "prefill_positions", "prefix_hit_blocks",
            "prefix_lookup_blocks", "prefix_hit_columns", "preemptions", "cache_blocks", "free_blocks")


def engine_snapshot(engine) -> tuple:
    """The :data:`SNAPSHOT` of a :class:`cyb.engine.Engine` now."""
    stats = engine.stats
    return (engine.slots_in_use, engine.queued, *(stats.get(name, 0) for name in SNAPSHOT[2:9]),
            getattr(engine, "num_blocks", 0), getattr(engine, "free_blocks", 0))


class Metrics:
    """What the server counts (see :meth:`render` for the names)."""

    def __init__(self) -> None:
        self.started = time.time()
        self._t0 = time.monotonic()
        self.responses: Counter = Counter()  # (route, status) -> count
        self.in_flight = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.steps = 0
        self.finish: Counter = Counter()
        self.rejected: Counter = Counter()  # reason -> count
        self.ttft_counts = [0] * (len(TTFT_BUCKETS) + 1)
        self.ttft_sum = 0.0
        self._recent: deque = deque()  # (time, tokens)

    def response(self, route: str, status: int) -> None:
        self.responses[(route, status)] += 1

    def tokens(self, count: int, steps: int) -> None:
        self.completion_tokens += count
        self.steps += steps
        now = time.monotonic()
        self._recent.append((now, count))
        while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
            self._recent.popleft()

    def first_token(self, seconds: float) -> None:
        self.ttft_sum += seconds
        for i, bound in enumerate(TTFT_BUCKETS):
            if seconds <= bound:
                self.ttft_counts[i] += 1
                return
        self.ttft_counts[-1] += 1

    def choice_finished(self, reason: str) -> None:
        self.finish[reason] += 1

    def tokens_per_second(self) -> float:
        """New tokens per second over the last :data:`RATE_WINDOW_S` seconds."""
        now = time.monotonic()
        while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
            self._recent.popleft()
        span = min(RATE_WINDOW_S, max(now - self._t0, 1e-9))
        return sum(n for _, n in self._recent) / span

    def shareable(self) -> dict:
        """Everything :meth:`render` counts, as plain data (what another HTTP process adds to its own)."""
        return {"responses": dict(self.responses), "in_flight": self.in_flight, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "steps": self.steps, "finish": dict(self.finish),
                "rejected": dict(self.rejected), "ttft_counts": list(self.ttft_counts), "ttft_sum": self.ttft_sum,
                "tokens_per_second": self.tokens_per_second()}

    @staticmethod
    def total(parts) -> dict:
        """The sum of several :meth:`shareable` dicts."""
        out = {"responses": Counter(), "in_flight": 0, "prompt_tokens": 0, "completion_tokens": 0, "steps": 0,
               "finish": Counter(), "rejected": Counter(), "ttft_counts": [0] * (len(TTFT_BUCKETS) + 1),
               "ttft_sum": 0.0, "tokens_per_second": 0.0}
        for part in parts:
            for key, value in part.items():
                if isinstance(out[key], Counter):
                    out[key].update(value)
                elif isinstance(out[key], list):
                    out[key] = [a + b for a, b in zip(out[key], value)]
                else:
                    out[key] += value
        return out

    def render(self, worker, slots: int, draining: bool, peers=()) -> str:
        """Prometheus text exposition of everything counted, with the engine's gauges; ``peers``:
        the other HTTP processes' :meth:`shareable` counters, added to this one's."""
        snap = dict(zip(SNAPSHOT, worker.snapshot))
        in_use, queued, steps, decode_pos, prefill_pos = (snap.get(k, 0) for k in SNAPSHOT[:5])
        c = self.total([self.shareable(), *peers])
        lines: list[str] = []

        def metric(name: str, kind: str, text: str, samples) -> None:
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                label = "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else ""
                lines.append(f"{name}{label} {_num(value)}")

        metric("cyb_requests_total", "counter", "HTTP responses by route and status code.",
               [((("route", r), ("code", str(c))), n) for (r, c), n in sorted(c["responses"].items())])
        metric("cyb_requests_in_flight", "gauge", "Requests being handled now.", [((), c["in_flight"])])
        metric("cyb_requests_rejected_total", "counter", "Requests refused before any work, by reason.",
               [((("reason", r),), n) for r, n in sorted(c["rejected"].items())])
        metric("cyb_slots", "gauge", "Engine slots (requests that decode at once).", [((), slots)])
        metric("cyb_slots_in_use", "gauge", "Engine slots holding a request.", [((), in_use)])
        metric("cyb_queue_length", "gauge", "Engine requests waiting for a slot.", [((), queued)])
        metric("cyb_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", [((), c["prompt_tokens"])])
        metric("cyb_completion_tokens_total", "counter", "New tokens generated.", [((), c["completion_tokens"])])
        metric("cyb_token_steps_total", "counter", "Steps of the new tokens (1 + pauses each).", [((), c["steps"])])
        mean = c["steps"] / c["completion_tokens"] if c["completion_tokens"] else 0.0
        metric("cyb_mean_steps_per_token", "gauge", "Mean steps per new token since the start (1: no pause).",
               [((), mean)])
        metric("cyb_tokens_per_second", "gauge", f"New tokens per second over the last {RATE_WINDOW_S:g} s.",
               [((), c["tokens_per_second"])])
        metric("cyb_engine_steps_total", "counter", "Engine decoding steps.", [((), steps)])
        metric("cyb_positions_total", "counter", "Positions through the network, by phase.",
               [((("phase", "prefill"),), prefill_pos), ((("phase", "decode"),), decode_pos)])
        lookups, hits = snap.get("prefix_lookup_blocks", 0), snap.get("prefix_hit_blocks", 0)
        metric("cyb_prefix_cache_lookup_blocks_total", "counter",
               "Full blocks of prompt columns looked up in the prefix cache.", [((), lookups)])
        metric("cyb_prefix_cache_hit_blocks_total", "counter", "Of those, blocks found cached.", [((), hits)])
        metric("cyb_prefix_cache_hit_rate", "gauge", "Prefix cache hits per block looked up since the start.",
               [((), hits / lookups if lookups else 0.0)])
        metric("cyb_prefix_cache_hit_columns_total", "counter",
               "Prompt columns found cached (not computed again).", [((), snap.get("prefix_hit_columns", 0))])
        metric("cyb_preemptions_total", "counter",
               "Rows preempted when the KV cache ran out of blocks (computed again later).",
               [((), snap.get("preemptions", 0))])
        metric("cyb_cache_blocks", "gauge", "Blocks of the engine's KV cache.", [((), snap.get("cache_blocks", 0))])
        metric("cyb_cache_blocks_free", "gauge", "Blocks of the KV cache no request holds (cached prefixes included).",
               [((), snap.get("free_blocks", 0))])
        metric("cyb_choices_finished_total", "counter", "Choices finished, by finish reason.",
               [((("reason", r),), n) for r, n in sorted(c["finish"].items())])
        lines.append("# HELP cyb_time_to_first_token_seconds Time from a request's start to its first token.")
        lines.append("# TYPE cyb_time_to_first_token_seconds histogram")
        total = 0
        for bound, n in zip((*TTFT_BUCKETS, float("inf")), c["ttft_counts"]):
            total += n
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            lines.append(f'cyb_time_to_first_token_seconds_bucket{{le="{le}"}} {total}')
        lines.append(f"cyb_time_to_first_token_seconds_sum {_num(c['ttft_sum'])}")
        lines.append(f"cyb_time_to_first_token_seconds_count {total}")
        metric("cyb_engine_failures_total", "counter", "Engine failures (each answered its requests with 500).",
               [((), worker.failures)])
        metric("cyb_draining", "gauge", "1 after SIGTERM: no new requests are accepted.", [((), int(draining))])
        metric("cyb_uptime_seconds", "gauge", "Seconds since the server started.", [((), time.time() - self.started)])
        return "\n".join(lines) + "\n"


def _num(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


__all__ = ["Metrics", "RATE_WINDOW_S", "SHARE_PERIOD_S", "SNAPSHOT", "TTFT_BUCKETS", "engine_snapshot"]
