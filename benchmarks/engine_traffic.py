"""The engine under traffic on one GPU: the continuous engine offline against static batches of
the same engine on the serve benchmark's workload, with a profile of where the time goes.

    python benchmarks/engine_traffic.py --out DIR [--cases none shared-fixed private-adaptive]
        [--concurrency 256] [--requests 512] [--profile] [--closed-waits 0 16]

For each case (the 134 M Llama, random weights, bf16, M = 4 for pause cases): prompts of 16-512
tokens and answers of 8-256 (seeded, no EOS), ``C`` slots:

* ``continuous``: one engine with ``C`` slots, every request submitted at once (continuous
  batching; graph captures taken out, as the server captures its own in a warm-up);
* ``closed_loop_wait{W}`` (with ``--closed-waits``): the same engine fed by ``C`` closed-loop
  clients, as the serve benchmark's clients feed the server, with ``refill_wait=W``;
* ``static``: :func:`cyb.generation.generate` on batches of ``C`` prompts, one after another
  (each call's graph captures taken out likewise, and reported beside);
* ``steady``: the engine's steady decoding step at ``C`` rows (the positions per step the
  continuous run used), and its prefill rate, from which a ceiling of the job follows: its
  prefill columns at the prefill rate plus its decode steps (the positions it fed over ``C``
  rows, every slot busy) at the steady step time (:func:`cyb.bench.engine_runs.steady_rates`,
  :func:`cyb.bench.engine_runs.ceiling_tokens_per_s`).

``--row-attention off`` runs every engine of the job with ``EngineOptions(row_attention=False)``
(attention through the mask up to the batch's bucketed limit) rather than the default.
``--options prefill_chunk=2048 prefill_rows=2`` sets further :class:`cyb.engine.EngineOptions`
fields (``name=int``) of every engine, continuous and static (the file's name then carries them).

``--profile`` runs the first case's continuous job once more under :mod:`torch.profiler` and
writes the GPU's kernel time, host-device copies, synchronisations and kernel launches; the
busy share of the GPU is its kernel time over the wall time of the unprofiled run (the
profiler slows the host: it traces every kernel of every graph).
Writes ``traffic.json`` (after every case) and prints one line per measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from cyb.bench.engine_runs import ceiling_tokens_per_s, mixed_job, steady_rates  # noqa: E402
from cyb.bench.models import SHAPE_134M, SHAPE_TINY, adaptive_fixture, build_hf_model, random_ids  # noqa: E402
from cyb.bench.models import real_ids_limit, spread_weights, wrap  # noqa: E402
from cyb.bench.offline import offline_engine, static_generate  # noqa: E402
from cyb.engine.layout import RowLayout  # noqa: E402


class TrafficJob:
    """The job of the serve benchmark's workload: the 134 M Llama (random weights, bf16, on CUDA;
    with ``quick`` a tiny one in float32 on the CPU), ``requests`` seeded prompts of 16-512 tokens
    with answers of 8-256 (:attr:`items`), and each case's pause model (:meth:`model`)."""

    def __init__(self, requests: int, concurrency: int, *, quick: bool = False) -> None:
        self.device = torch.device("cpu" if quick else "cuda")
        self.m, vocab = 4, (256 if quick else 32768)
        shape = SHAPE_TINY if quick else SHAPE_134M
        dtype = torch.float32 if quick else torch.bfloat16
        self.hf = build_hf_model(shape, vocab, dtype=dtype, device=self.device,
                                 max_positions=(512 + 256 + 8) * self.m + 64, seed=0).eval()
        spread_weights(self.hf, 0)
        self.limit = real_ids_limit(vocab, self.m)
        self.items = list(zip(*mixed_job(requests, (16, 512), (8, 256), self.limit, seed=concurrency)))
        self.calib = random_ids(64, 64, self.limit, seed=0).to(self.device)

    def model(self, case: str):
        """``(pause model, mode)`` of a case: ``none`` (no pauses, fixed) or ``VISIBILITY-MODE``
        (a 10% dk prior on the calibration prompts)."""
        if case == "none":
            return wrap(self.hf, "baseline", 1), "fixed"
        vis, mode = case.split("-")
        return adaptive_fixture(self.hf, self.m, self.calib, 0.1, vis)[0], mode


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


#: EngineOptions.row_attention of every engine in the run, by --row-attention
ROW_ATTENTION = {"auto": None, "off": False, "on": True}


def continuous(pm, items, *, slots, mode, refill=0, refill_wait=None, clients=None, prefill_rows=None,
               row_attention=None, options=None):
    """The continuous engine offline (graph captures taken out): every request submitted at once,
    or by ``clients`` closed-loop clients (:func:`cyb.bench.offline.offline_engine`)."""
    layout = RowLayout.of(pm.vocab, pm.pause_visibility)
    capacity = max(layout.columns_needed(len(p), n) for p, n in items)
    return offline_engine(pm, items, slots=slots, mode=mode, capacity=capacity, refill=refill,
                          refill_wait=refill_wait, clients=clients, prefill_rows=prefill_rows,
                          row_attention=row_attention, options=options)


def static(pm, items, *, batch, mode, row_attention=None, options=None):
    """:func:`cyb.bench.offline.static_generate` (graph captures taken out, and reported beside)."""
    from cyb.engine import EngineOptions

    return static_generate(pm, items, batch=batch, mode=mode,
                           engine_options=EngineOptions(row_attention=row_attention, **(options or {})))


def profile(pm, items, *, slots, mode, refill=0, row_attention=None, options=None):
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof_ctx

    with prof_ctx(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        res = continuous(pm, items, slots=slots, mode=mode, refill=refill, row_attention=row_attention,
                         options=options)
    events = prof.events()
    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
    busy, cur_s, cur_e = 0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    wall_us = (spans[-1][1] - spans[0][0]) if spans else 0
    counts = {}
    for e in prof.key_averages():
        for key in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpyAsync",
                    "cudaLaunchKernel", "cudaGraphLaunch", "aten::linear", "aten::copy_", "aten::to",
                    "aten::_local_scalar_dense", "cudaHostAlloc", "cudaStreamWaitEvent"):
            if e.key == key:
                counts[key] = {"count": e.count, "cpu_ms": e.cpu_time_total / 1e3}
    top = [(e.key, e.count, round(e.self_cpu_time_total / 1e3, 1)) for e in
           sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:25]]
    return {"wall_s": res["seconds"], "gpu_busy_share": busy / wall_us if wall_us else None,
            "gpu_busy_s": busy / 1e6, "counts": counts, "top_self_cpu": top}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", nargs="+", default=["none", "shared-fixed", "private-adaptive"])
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-static", action="store_true")
    ap.add_argument("--refill", type=int, nargs="+", default=[0, 1],
                    help="EngineOptions.refill values of the continuous runs (0: groups of an eighth of the "
                         "slots; 1: each prompt as soon as a slot is free)")
    ap.add_argument("--closed-waits", type=int, nargs="*", default=[],
                    help="EngineOptions.refill_wait values of continuous runs whose requests come from C "
                         "closed-loop clients (each sends its next request when its last one ends), as the "
                         "serve benchmark's clients send them")
    ap.add_argument("--closed-prefill-rows", type=int, nargs="*", default=[],
                    help="EngineOptions.prefill_rows values of further closed-loop runs (refill_wait at its "
                         "default): the prefill forward's size against the latency it adds")
    ap.add_argument("--row-attention", choices=sorted(ROW_ATTENTION), default="auto",
                    help="EngineOptions.row_attention of every engine (auto: the default)")
    ap.add_argument("--options", nargs="*", default=[], help="further EngineOptions fields of every engine, as name=int")
    ap.add_argument("--quick", action="store_true", help="a tiny model on the CPU (a smoke run)")
    a = ap.parse_args(argv)
    row_attention = ROW_ATTENTION[a.row_attention]
    try:
        options = {k: int(v) for k, v in (o.split("=", 1) for o in a.options)}
    except ValueError:
        ap.error(f"--options takes name=int pairs, got {a.options}")
    eng = {"row_attention": row_attention, "options": options}
    os.makedirs(a.out, exist_ok=True)
    job = TrafficJob(a.requests, a.concurrency, quick=a.quick)
    dev, items, limit = job.device, job.items, job.limit
    result = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
              "row_attention": a.row_attention, "options": options,
              "concurrency": a.concurrency, "requests": a.requests, "cases": {}}
    for case in a.cases:
        pm, mode = job.model(case)
        row = {}
        continuous(pm, items[:8], slots=a.concurrency, mode=mode, **eng)  # warm-up
        for refill in a.refill:
            cont = continuous(pm, items, slots=a.concurrency, mode=mode, refill=refill, **eng)
            row[f"continuous_refill{refill}"] = cont
            print(case, f"continuous refill={refill}", json.dumps(cont), flush=True)
        for wait in a.closed_waits:
            closed = continuous(pm, items, slots=a.concurrency, mode=mode, refill_wait=wait, clients=a.concurrency,
                                **eng)
            row[f"closed_loop_wait{wait}"] = closed
            print(case, f"closed loop refill_wait={wait}", json.dumps(closed), flush=True)
        for rows in a.closed_prefill_rows:
            closed = continuous(pm, items, slots=a.concurrency, mode=mode, clients=a.concurrency, prefill_rows=rows,
                                **eng)
            row[f"closed_loop_prefill_rows{rows}"] = closed
            print(case, f"closed loop prefill_rows={rows}", json.dumps(closed), flush=True)
        cont = max((row[f"continuous_refill{r}"] for r in a.refill), key=lambda c: c["real_tokens_per_s"])
        if not a.no_static:
            row["static"] = static(pm, items, batch=a.concurrency, mode=mode, **eng)
            print(case, "static", json.dumps(row["static"]), flush=True)
            row["continuous_vs_static"] = cont["real_tokens_per_s"] / row["static"]["real_tokens_per_s"]
        st = steady_rates(pm, rows=a.concurrency, mode=mode, id_limit=limit, row_attention=row_attention)
        row["steady"] = st
        row["ceiling_tok_s"] = ceiling_tokens_per_s(pm, [p for p, _ in items], [n for _, n in items], st,
                                                    decode_positions=cont["stats"]["decode_positions"],
                                                    slots=a.concurrency)
        row["continuous_vs_ceiling"] = cont["real_tokens_per_s"] / row["ceiling_tok_s"]
        print(case, "steady", json.dumps(st), "ceiling", round(row["ceiling_tok_s"]), flush=True)
        if a.profile and case == a.cases[0]:
            row["profile"] = profile(pm, items, slots=a.concurrency, mode=mode, refill=a.refill[0], **eng)
            # the profiler slows the host (every kernel of a graph is traced): the GPU's kernel time
            # over the wall time of the same job unprofiled
            wall = row[f"continuous_refill{a.refill[0]}"]["seconds"]
            row["gpu_busy_share_unprofiled"] = row["profile"]["gpu_busy_s"] / wall
            print(case, "profile", json.dumps(row["profile"]), flush=True)
        result["cases"][case] = row
        tag = ("" if a.row_attention == "auto" else "-row-" + a.row_attention) + "".join(
            f"-{k}{v}" for k, v in options.items())
        with open(os.path.join(a.out, f"traffic{tag}.json"), "w") as f:
            json.dump(result, f, indent=1)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
