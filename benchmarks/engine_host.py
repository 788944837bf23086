"""The engine's own host work on the jobs of issue 65, measured on the CPU with the network taken out.

    python benchmarks/engine_host.py --out FILE.json [--jobs fewshot mixed eval]
        [--cases none private-adaptive shared-fixed] [--repeats 3] [--requests N]

On a GPU a step's network runs from CUDA graphs while the host does the engine's bookkeeping for
the next one: admitting requests (their prompt's columns, the prefix keys of its blocks, the
blocks it takes), writing block tables, reading a step's decisions, ending rows.  Where that
work is longer than the GPU's step, the GPU waits: a small model (134M: ~2 ms a step) on a job of
many short requests that share a prefix (the few-shot job: 2,000 requests of ~1,700 tokens) is
then bound by the host.  This measures that work without a GPU.

Each job (:mod:`cyb.bench.jobs`, at its full size: ``max_model_len`` 4,096, C = 256 closed-loop
clients, EOS ignored) runs through a real :class:`cyb.engine.Engine` on the CPU whose model is a
tiny Llama (hidden size 32, two layers) with its decoder's forward replaced by zeros: nothing of
the network runs, everything of the engine does.  Cases: no pauses (``none``), private pauses in
adaptive mode and shared pauses in fixed mode (M = 4; with the network out, every decision reads
zero logits).  Reported per case, the median of ``--repeats`` runs:

* ``request_us``: building the job's :class:`cyb.engine.Request` objects, per request (a server
  builds one per request it receives);
* ``engine_ms``: the job's wall time through the engine, less the time inside the runner's
  ``decode`` / ``prefill`` / ``mixed`` (what a GPU does, or, on CUDA, what replays its graphs);
  ``engine_us_per_request`` and ``engine_us_per_step`` divide it;
* ``runner_ms``: the time inside the runner (on the CPU its eager masks and readout: not what a
  GPU host spends there).

Numbers are this CPU's: compare runs of the same machine (two versions of the engine run one
after the other), not machines.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from cyb.bench import models as bm  # noqa: E402
from cyb.bench.jobs import JOBS, make_job  # noqa: E402
from cyb.engine import Engine, EngineOptions, Request, choose_positions  # noqa: E402
from cyb.engine import runner as runner_module  # noqa: E402
from cyb.engine.layout import RowLayout  # noqa: E402

#: ``case -> (method, M, visibility, mode)``
CASES = {"none": ("baseline", 1, "shared", "fixed"), "private-adaptive": ("cyb", 4, "private", "adaptive"),
         "shared-fixed": ("cyb", 4, "shared", "fixed")}
#: the tiny Llama whose forward is taken out (positions up to the longest job's)
TINY = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=32768, tie_word_embeddings=True)


def tiny_model(case: str):
    """The case's :class:`cyb.PauseModel` over a tiny Llama (float32, CPU) and its request mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    method, m, visibility, mode = CASES[case]
    torch.manual_seed(0)
    hf_model = LlamaForCausalLM(LlamaConfig(use_cache=False, **TINY)).eval()
    return bm.wrap(hf_model, method, m, visibility), mode


class _Timed:
    """The runner's forwards replaced by zeros, and the time inside its calls summed."""

    CALLS = ("decode", "prefill", "mixed")

    def __init__(self, hidden: int) -> None:
        self.hidden, self.seconds, self._saved = hidden, 0.0, {}

    def __enter__(self) -> "_Timed":
        cls = runner_module.Runner
        self._saved = {name: cls.__dict__[name] for name in ("_forward", *self.CALLS)}
        cls._forward = lambda runner, ids, pos, mask, **extra: torch.zeros(ids.shape + (self.hidden,))
        for name in self.CALLS:
            cls_fn = self._saved[name]

            @functools.wraps(cls_fn)
            def timed(*args, _fn=cls_fn, **kwargs):
                t0 = time.perf_counter()
                try:
                    return _fn(*args, **kwargs)
                finally:
                    self.seconds += time.perf_counter() - t0
            setattr(cls, name, timed)
        return self

    def __exit__(self, *exc) -> None:
        for name, fn in self._saved.items():
            setattr(runner_module.Runner, name, fn)


def run_job(pm, mode: str, items, *, slots: int, max_model_len: int) -> dict:
    """One job through an engine on the CPU with the network out (see the module docstring)."""
    t0 = time.perf_counter()
    reqs = [Request(tuple(p), n, mode=mode) for p, n in items]
    request_s = time.perf_counter() - t0
    capacity = RowLayout.of(pm.vocab, pm.pause_visibility).columns_needed(1, max_model_len - 1)
    opts = EngineOptions(max_slots=slots, cache_bytes=8 << 30)
    engine = Engine(pm, capacity=capacity, slots=slots, positions=choose_positions(pm, [mode], slots), options=opts)
    with _Timed(pm.hf_model.config.hidden_size) as timed:
        t0 = time.perf_counter()
        following = min(slots, len(reqs))
        for r in reqs[:following]:
            engine.submit(r)
        finished = 0
        while engine.busy:
            for e in engine.step():
                if e.finished is not None:
                    finished += 1
                    if following < len(reqs):
                        engine.submit(reqs[following])
                        following += 1
        wall = time.perf_counter() - t0
    steps = engine.stats["steps"]
    own = wall - timed.seconds
    return {"requests": len(reqs), "finished": finished, "steps": steps,
            "prefill_forwards": engine.stats["prefill_forwards"], "request_us": request_s / len(reqs) * 1e6,
            "wall_ms": wall * 1e3, "runner_ms": timed.seconds * 1e3, "engine_ms": own * 1e3,
            "engine_us_per_request": own / len(reqs) * 1e6, "engine_us_per_step": own / max(steps, 1) * 1e6}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="JSON file of the results")
    ap.add_argument("--jobs", nargs="+", default=["fewshot", "mixed", "eval"], choices=list(JOBS))
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=None, help="requests of every job (default: each job's own)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    print(f"{'job':8} {'case':17} {'requests':>8} {'steps':>6} {'Request us':>10} {'engine ms':>10} "
          f"{'us/request':>10} {'us/step':>8} {'runner ms':>10}")
    for job_name in a.jobs:
        for case in a.cases:
            pm, mode = tiny_model(case)
            job = make_job(job_name, bm.real_ids_limit(TINY["vocab_size"], CASES[case][1]), requests=a.requests)
            runs = [run_job(pm, mode, job.items, slots=job.spec.concurrency, max_model_len=job.spec.max_model_len)
                    for _ in range(a.repeats)]
            row = {"job": job_name, "case": case, "runs": runs}
            for key in ("request_us", "engine_ms", "engine_us_per_request", "engine_us_per_step", "runner_ms"):
                row[key] = statistics.median(r[key] for r in runs)
            row["steps"], row["requests"] = runs[0]["steps"], runs[0]["requests"]
            results.append(row)
            print(f"{job_name:8} {case:17} {row['requests']:8d} {row['steps']:6d} {row['request_us']:10.1f} "
                  f"{row['engine_ms']:10.1f} {row['engine_us_per_request']:10.1f} {row['engine_us_per_step']:8.0f} "
                  f"{row['runner_ms']:10.1f}", flush=True)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"repeats": a.repeats, "torch": torch.__version__, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
