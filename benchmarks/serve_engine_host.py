"""The host's share of a served decoding step, on the CPU: ``cyb serve``'s engine process and its
links to the HTTP processes, with the GPU's work replaced by a wait.

    python benchmarks/serve_engine_host.py --out FILE.json [--step-ms 1.8] [--slots 256]
        [--links 1 4] [--seconds 5]

On a GPU a served step takes longer than the same engine's step offline (H200, 134 M, 256
streams: 2.8 ms against 2.0, docs/record/benchmarks/serving.md): the engine's process does host work for each
step (its worker thread groups the step's tokens by job and sends them down each HTTP process's
pipe; its main thread reads new requests from the pipes), and where that work is longer than
the GPU's step the GPU waits.  This measures that work without a GPU.

:class:`HostOnlyEngine` stands in for :class:`cyb.engine.Engine`: a step "runs on the GPU" for
``--step-ms`` (the host does not wait for it when launching, and waits for the one before when
collecting, as the engine's one-step lookahead does), every decoding row emits one token a step,
and a request starts as soon as a slot is free; submitting a request does the host work the
engine's does (its prompt's columns, :meth:`cyb.engine.layout.RowLayout.prefill`, no pauses),
and ``--host-ms`` stands for the rest of the engine's own host work a step (a busy wait).
Requests come from ``--slots`` closed-loop streams (each sends its next request when its last
one ends; prompts of 16-512 tokens, answers of 8-256).  Two
runs for each ``--links``:

* ``alone``: the stand-in engine stepped in a loop in this process, the streams fed in that loop
  (the engine offline's host work);
* ``served``: the stand-in inside ``cyb serve``'s engine process (:mod:`cyb.serve.engine_process`,
  the real worker, pipes and messages), its links' ends in this process, each with a reader
  thread that takes its steps' tokens and sends the next requests (the HTTP processes' side,
  without HTTP).

Each reports steps per second and the host time a step adds to ``--step-ms``
(``1 / steps per second - step``).  Numbers are this CPU's: compare the two runs, not machines.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import sys
import threading
import time
from collections import deque

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from cyb.engine import Request  # noqa: E402
from cyb.engine.layout import RowLayout  # noqa: E402
from cyb.engine.requests import Emitted  # noqa: E402

#: the columns of a model without pauses
NO_PAUSES = RowLayout("shared", 1, False, ())


class HostOnlyEngine:
    """What :class:`cyb.serve.worker.EngineWorker` uses of an engine, with each step's device
    work a wait of ``step_ms`` (see the module docstring)."""

    def __init__(self, slots: int, step_ms: float, host_ms: float = 0.0) -> None:
        self.slots, self.capacity, self.step_s, self.host_s = slots, 1 << 16, step_ms / 1e3, host_ms / 1e3
        self.stats = {"steps": 0, "decode_positions": 0, "prefill_positions": 0, "prefill_forwards": 0}
        self._next_id = 0
        self._waiting: deque = deque()
        self._rows: dict[int, list[int]] = {}  # request id -> [tokens wanted, tokens decided]
        self._gpu_free = 0.0  # when the last launched step ends
        self._pending = None  # (its tokens, when they are ready)

    def warm_up(self) -> None:
        pass

    def submit(self, request: Request) -> int:
        NO_PAUSES.prefill(list(request.prompt))  # (the engine's host work for a new request)
        rid = self._next_id
        self._next_id += 1
        self._waiting.append((rid, request.max_new_tokens))
        return rid

    def abort(self, rid: int, reason: str = "abort") -> None:
        self._rows.pop(rid, None)
        self._waiting = deque(w for w in self._waiting if w[0] != rid)

    @property
    def busy(self) -> bool:
        return bool(self._rows or self._waiting or self._pending)

    @property
    def slots_in_use(self) -> int:
        return len(self._rows)

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def step(self) -> list[Emitted]:
        busy_until = time.perf_counter() + self.host_s  # the engine's own Python, holding the lock
        while time.perf_counter() < busy_until:
            pass
        while self._waiting and len(self._rows) < self.slots:
            rid, wanted = self._waiting.popleft()
            self._rows[rid] = [wanted, 0]
        launched = None
        if self._rows:
            tokens = []
            for rid, row in list(self._rows.items()):
                row[1] += 1
                finished = "length" if row[1] >= row[0] else None
                tokens.append(Emitted(rid, row[1] - 1, 1000 + rid % 1000, 1, (0.0,), None, row[1], finished))
                if finished is not None:
                    del self._rows[rid]
            self._gpu_free = max(time.perf_counter(), self._gpu_free) + self.step_s
            launched = (tokens, self._gpu_free)
            self.stats["steps"] += 1
            self.stats["decode_positions"] += len(tokens)
        out = []
        if self._pending is not None:  # wait for the step before, as a CUDA event would
            tokens, ready = self._pending
            time.sleep(max(0.0, ready - time.perf_counter()))
            out = tokens
        self._pending = launched
        return out


class _Served:
    """What the engine's process reads of a served model (and sends back once, pickled)."""

    device = "cuda"
    default_mode = "fixed"


def _host_only_loader(slots: int, step_ms: float, host_ms: float):
    """The engine process's loader: its worker builds a :class:`HostOnlyEngine`."""
    from cyb.serve import worker

    worker.EngineWorker._build = lambda self: HostOnlyEngine(slots, step_ms, host_ms)
    return _Served()


class Streams:
    """Closed-loop streams: each sends its next request when its last one ends; the requests
    (prompts of 16-512 tokens, answers of 8-256) are drawn once, seeded, and taken in turn."""

    def __init__(self, seed: int, count: int) -> None:
        rng = random.Random(seed)
        self.pool = [Request(tuple(rng.randrange(10, 30000) for _ in range(rng.randint(16, 512))), rng.randint(8, 256))
                     for _ in range(count)]
        self.taken = 0
        self.lock = threading.Lock()

    def request(self) -> Request:
        with self.lock:
            self.taken += 1
            return self.pool[self.taken % len(self.pool)]


class _Job:
    def __init__(self, request: Request) -> None:
        self.requests = [request]


def run_alone(slots: int, step_ms: float, host_ms: float, seconds: float) -> dict:
    engine = HostOnlyEngine(slots, step_ms, host_ms)
    streams = Streams(0, 16 * slots)
    for _ in range(slots):
        engine.submit(streams.request())
    t0 = time.perf_counter()
    steps0 = tokens = 0
    while time.perf_counter() - t0 < seconds:
        for e in engine.step():
            tokens += 1
            if e.finished is not None:
                engine.submit(streams.request())
    wall = time.perf_counter() - t0
    steps = engine.stats["steps"] - steps0
    return _summary("alone", 0, slots, step_ms, host_ms, steps, tokens, wall)


def run_served(slots: int, step_ms: float, host_ms: float, links: int, seconds: float) -> dict:
    from cyb.serve.engine_process import EngineLink, EngineProcess

    proc = EngineProcess(functools.partial(_host_only_loader, slots, step_ms, host_ms), slots=slots, links=links).start(60)
    ends = [proc] + [EngineLink(r, s, served=proc.served, slots=proc.slots, columns=proc.columns).start_reading()
                     for r, s in proc.spare_links]
    streams = Streams(0, 16 * slots)
    counted = [0] * len(ends)
    running = threading.Event()
    running.set()

    def deliverer(k: int, link):
        def deliver(batch) -> None:
            for job, items in batch:
                if not isinstance(items, list):
                    continue
                counted[k] += len(items)
                if items and items[-1][1].finished is not None and running.is_set():
                    link.submit(_Job(streams.request()))
        return deliver

    for k, link in enumerate(ends):
        link.deliver = deliverer(k, link)
    for i in range(slots):
        link = ends[i % len(ends)]
        link.submit(_Job(streams.request()))
    time.sleep(0.5)  # the first requests reach the engine
    steps0, tokens0 = proc.snapshot[2], sum(counted)
    t0 = time.perf_counter()
    time.sleep(seconds)
    steps, tokens = proc.snapshot[2] - steps0, sum(counted) - tokens0
    wall = time.perf_counter() - t0
    in_use = proc.snapshot[0]
    running.clear()
    for link in ends[1:]:
        link.stop()
    proc.stop()
    row = _summary("served", links, slots, step_ms, host_ms, steps, tokens, wall)
    row["slots_in_use_at_end"] = in_use
    return row


def _summary(run: str, links: int, slots: int, step_ms: float, host_ms: float, steps: int, tokens: int,
             wall: float) -> dict:
    per_step_ms = wall * 1e3 / steps if steps else float("nan")
    return {"run": run, "links": links, "slots": slots, "step_ms": step_ms, "engine_host_ms": host_ms, "steps": steps,
            "tokens": tokens,
            "seconds": wall, "steps_per_s": steps / wall, "tokens_per_step": tokens / steps if steps else 0.0,
            "host_ms_per_step": per_step_ms - step_ms}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--step-ms", type=float, default=1.8)
    ap.add_argument("--host-ms", type=float, default=0.0,
                    help="the engine's own host work a step (a busy wait holding the interpreter's lock)")
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--links", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args(argv)
    rows = [run_alone(a.slots, a.step_ms, a.host_ms, a.seconds)]
    print(json.dumps(rows[-1]), flush=True)
    for links in a.links:
        rows.append(run_served(a.slots, a.step_ms, a.host_ms, links, a.seconds))
        print(json.dumps(rows[-1]), flush=True)
    with open(a.out, "w") as f:
        json.dump({"argv": sys.argv[1:], "cpus": os.cpu_count(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
