"""Where the engine's long gaps between tokens come from: a timeline of every step of the traffic
job, fed by closed-loop clients, with what each step did.

    python benchmarks/engine_gaps.py --out DIR [--cases none private-adaptive] [--requests 512]
        [--concurrency 256] [--options prefill_rows=8 ...]

The job is ``benchmarks/engine_traffic.py``'s (the 134 M Llama, random weights, bf16, prompts of
16-512 tokens, answers of 8-256, ``C`` closed-loop clients).  For every :meth:`Engine.step` it
records the host's time in each part of the step (admission and prefill, compaction, the
launch, the wait for the step before), CUDA events around the prefill forward and the decoding
step (their GPU time, read after the run: recording them does not make the host wait), the
prefill positions written, the rows started, graph captures, and how many tokens the step
handed out.  The gaps between a request's tokens are then split by what the step that ended
each gap did.  Objects made before the job are frozen out of Python's collector, as in the
server's engine process.  ``--options`` sets :class:`cyb.engine.EngineOptions` fields (``name=int``), to
compare schedules; ``--prefill-probe`` then times single prefill forwards.  Writes ``gaps-<case>.json`` and prints a summary per case.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from cyb.bench.load import percentile  # noqa: E402
from cyb.engine import Engine, EngineOptions, Request, choose_positions  # noqa: E402
from cyb.engine.layout import RowLayout  # noqa: E402
from engine_traffic import TrafficJob  # noqa: E402  (this folder)


#: ``(rows, C)`` of the prefill probe
PROBE_SHAPES = [(1, 512), (8, 512), (16, 512), (32, 512), (8, 64), (64, 64), (256, 64), (32, 256), (64, 256)]


class Timeline:
    """Per-step records of one engine (its methods wrapped on the instance)."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.steps, self.cur = engine, [], None
        cuda = engine.model.device.type == "cuda"
        self._event = (lambda: torch.cuda.Event(enable_timing=True)) if cuda else (lambda: None)
        self._wrap("_admit_and_prefill", "prefill")
        self._wrap("_compact", "compact")
        self._wrap("_launch", "launch")
        self._wrap("_collect", "collect")
        start, capture = engine._start, engine.runner._capture

        def counted_start(ready):
            self.cur["started"] += len(ready)
            return start(ready)

        def counted_capture(key):
            self.cur["captures"] += 1
            return capture(key)

        engine._start, engine.runner._capture = counted_start, counted_capture
        self._gc_t0 = None
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict) -> None:
        """Python's garbage collections of generation 2 during a step, and their time."""
        if info.get("generation") != 2 or self.cur is None:
            return
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif self._gc_t0 is not None:
            self.cur["gc2_ms"] = self.cur.get("gc2_ms", 0.0) + (time.perf_counter() - self._gc_t0) * 1e3
            self._gc_t0 = None

    def unwrap(self) -> None:
        """The engine's own methods again."""
        for name in ("_admit_and_prefill", "_compact", "_launch", "_collect", "_start"):
            del self.engine.__dict__[name]
        del self.engine.runner.__dict__["_capture"]
        gc.callbacks.remove(self._gc)

    def _wrap(self, name: str, label: str) -> None:
        fn = getattr(self.engine, name)

        def timed(*args):
            ev0 = self._event()
            if ev0 is not None:
                ev0.record()
            t0 = time.perf_counter()
            out = fn(*args)
            self.cur[f"{label}_host_ms"] += (time.perf_counter() - t0) * 1e3
            ev1 = self._event()
            if ev1 is not None:
                ev1.record()
                self.cur["events"].append((label, ev0, ev1))
            return out

        setattr(self.engine, name, timed)

    def step(self) -> list:
        e = self.engine
        before = dict(e.stats)
        self.cur = {"t0": time.perf_counter(), "prefill_host_ms": 0.0, "compact_host_ms": 0.0,
                    "launch_host_ms": 0.0, "collect_host_ms": 0.0, "started": 0, "captures": 0, "events": []}
        out = e.step()
        rec = self.cur
        rec["t1"] = time.perf_counter()
        rec["prefill_positions"] = e.stats["prefill_positions"] - before["prefill_positions"]
        rec["prefill_forwards"] = e.stats["prefill_forwards"] - before["prefill_forwards"]
        rec["rows"] = e._roster.n if e._roster is not None else 0
        rec["tokens"] = len(out)
        self.steps.append(rec)
        return out

    def finish(self) -> None:
        """GPU times of the recorded events (after a synchronize)."""
        if self.engine.model.device.type == "cuda":
            torch.cuda.synchronize()
        for rec in self.steps:
            gpu = {}
            for label, a, b in rec.pop("events"):
                gpu[label] = gpu.get(label, 0.0) + a.elapsed_time(b)
            rec.update({f"{k}_gpu_ms": v for k, v in gpu.items()})


def build(pm, items, *, slots: int, mode: str, options: dict) -> Engine:
    layout = RowLayout.of(pm.vocab, pm.pause_visibility)
    capacity = max(layout.columns_needed(len(p), n) for p, n in items)
    engine = Engine(pm, capacity=capacity, slots=slots, positions=choose_positions(pm, [mode], slots),
                    options=EngineOptions(max_slots=slots, **options))
    engine.warm_up()  # as a server's engine does at start
    return engine


def run(engine: Engine, items, *, slots: int, mode: str) -> dict:
    """The job through ``engine`` from ``slots`` closed-loop clients, every step recorded."""
    reqs = [Request(tuple(p), n, mode=mode) for p, n in items]
    tl = Timeline(engine)
    for r in reqs[:slots]:
        engine.submit(r)
    following = iter(reqs[slots:])
    last: dict[int, tuple[float, int]] = {}
    gaps = []  # (ms, index of the step that ended the gap)
    t0 = time.perf_counter()
    while engine.busy:
        events = tl.step()
        now, k = time.perf_counter(), len(tl.steps) - 1
        for ev in events:
            if ev.request in last:
                gaps.append(((now - last[ev.request][0]) * 1e3, k))
            last[ev.request] = (now, k)
            if ev.finished is not None:
                r = next(following, None)
                if r is not None:
                    engine.submit(r)
    wall = time.perf_counter() - t0
    tl.finish()
    tl.unwrap()
    tokens = sum(s["tokens"] for s in tl.steps)
    return {"wall_s": wall, "tokens": tokens, "tok_s": tokens / wall, "steps": tl.steps, "gaps": gaps,
            "capture_ms": engine.runner.capture_ms}


def prefill_probe(engine: Engine, shapes, replays: int = 10) -> list[dict]:
    """GPU time of one prefill forward of first chunks, ``rows x C`` positions (every row a
    whole chunk, written into slots ``0 .. rows-1``), as the engine runs it (from its graph where
    it has one): the median of ``replays`` after 3 warm-ups (the first captures the graph)."""
    runner, out = engine.runner, []
    for rows, c in shapes:
        if rows > engine.slots or c > engine.capacity:
            continue
        ids = torch.randint(0, 100, (rows, c))
        pos = torch.arange(c).expand(rows, c).contiguous()
        times = []
        for i in range(3 + replays):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            runner.prefill(list(range(rows)), ids, pos, pos.clone(), c, fresh=True)
            b.record()
            b.synchronize()
            if i >= 3:
                times.append(a.elapsed_time(b))
        ms = sorted(times)[len(times) // 2]
        out.append({"rows": rows, "chunk": c, "ms": ms, "positions_per_ms": rows * c / ms})
    return out


def histogram(gaps, width: float = 0.5) -> dict:
    """``{lower edge of a bin of width ms: gaps in it}`` of ``(ms, step)`` gaps."""
    out: dict[float, int] = {}
    for g, _ in gaps:
        edge = round(width * int(g // width), 3)
        out[edge] = out.get(edge, 0) + 1
    return dict(sorted(out.items()))


def summary(res: dict) -> dict:
    steps, gaps = res["steps"], res["gaps"]
    ms = [g for g, _ in gaps]
    p50, p99 = percentile(ms, 50), percentile(ms, 99)
    long = [(g, k) for g, k in gaps if g >= p99]

    def kind(k: int) -> str:
        s = steps[k]
        if s["captures"]:
            return "capture"
        if s.get("gc2_ms"):
            return "gc"
        if s["prefill_forwards"]:
            return "prefill"
        if s["started"]:
            return "start"
        return "decode only"

    by_kind: dict[str, list] = {}
    for g, k in gaps:
        by_kind.setdefault(kind(k), []).append(g)
    long_kinds: dict[str, int] = {}
    for _, k in long:
        long_kinds[kind(k)] = long_kinds.get(kind(k), 0) + 1

    def mean(key, sel):
        vals = [s.get(key, 0.0) for s in sel]
        return sum(vals) / len(vals) if vals else None

    parts = {}
    for name in ("capture", "gc", "prefill", "start", "decode only"):
        sel = [s for i, s in enumerate(steps) if kind(i) == name]
        if not sel:
            continue
        parts[name] = {"steps": len(sel), "gap_ms_p50": percentile(by_kind.get(name, []), 50),
                       "gap_ms_p99": percentile(by_kind.get(name, []), 99),
                       **{f"{key}_mean": mean(key, sel) for key in (
                           "prefill_host_ms", "compact_host_ms", "launch_host_ms", "collect_host_ms",
                           "prefill_gpu_ms", "launch_gpu_ms", "compact_gpu_ms", "gc2_ms", "prefill_positions", "rows",
                           "started")}}
    return {"tok_s": res["tok_s"], "wall_s": res["wall_s"], "steps": len(steps), "capture_ms": res["capture_ms"],
            "itl_ms_p50": p50, "itl_ms_p90": percentile(ms, 90), "itl_ms_p99": p99,
            "itl_ms_p999": percentile(ms, 99.9), "p99_over_p50": p99 / p50 if p50 else None,
            "gaps_at_or_above_p99_by_step_kind": long_kinds, "by_step_kind": parts}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", nargs="+", default=["none"])
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--options", nargs="*", default=[], help="EngineOptions fields as name=int")
    ap.add_argument("--prefill-probe", action="store_true",
                    help="then time single prefill forwards of first chunks at a few shapes (CUDA)")
    ap.add_argument("--quick", action="store_true", help="a tiny model on the CPU (a smoke run)")
    a = ap.parse_args(argv)
    options = {k: int(v) for k, v in (o.split("=", 1) for o in a.options)}
    os.makedirs(a.out, exist_ok=True)
    job = TrafficJob(a.requests, a.concurrency, quick=a.quick)
    dev, items = job.device, job.items
    gc.collect()
    gc.freeze()  # as the server's engine process does once its model is loaded
    for case in a.cases:
        pm, mode = job.model(case)
        engine = build(pm, items, slots=a.concurrency, mode=mode, options=options)
        run(engine, items, slots=a.concurrency, mode=mode)  # warm-up: graphs captured, as a server's are
        res = run(engine, items, slots=a.concurrency, mode=mode)
        if a.prefill_probe and dev.type == "cuda":
            res["prefill_probe"] = prefill_probe(engine, PROBE_SHAPES)
            print(case, "prefill", json.dumps(res["prefill_probe"]), flush=True)
        del engine
        summ = summary(res)
        print(case, json.dumps(summ, indent=1), flush=True)
        tag = "-".join(f"{k}{v}" for k, v in options.items())
        name = f"gaps-{case}{'-' + tag if tag else ''}.json"
        with open(os.path.join(a.out, name), "w") as f:
            json.dump({"argv": sys.argv[1:], "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
                       "summary": summ, "prefill_probe": res.get("prefill_probe"), "steps": res["steps"],
                       "gap_histogram_ms": histogram(res["gaps"])}, f)


if __name__ == "__main__":
    main()
