"""One call of the fused CYB readout and loss (``cyb.kernels.chunked.fused_linear_loss`` with
``cyb_loss``, forward and backward), split by its parts: for each, the host's time and the
time of the kernels it launched, under the torch profiler.

    python benchmarks/profile_loss_parts.py --out FILE.json [--rows 32768] [--hidden 768]
        [--vocab 32768] [--num-steps 4] [--backend triton] [--dtype bf16] [--quick]

The rows are a training step's readout at 32 x 256 real tokens and ``M = 4`` by default (the
134 M Llama's hidden size and vocabulary); random hidden states and weights.  The parts are the
functions of :mod:`cyb.kernels.chunked` that each chunk runs, wrapped (from here, without
changing them) in named profiler ranges:

* ``logits``: the chunk's logits matmul (``F.linear``);
* ``stats``: the readout's per-row statistics from them (``ops.stats``);
* ``block loss``: the per-block loss and its gradient w.r.t. the three readouts
  (``_block_loss_grads``: ``cyb_loss`` and its small autograd backward);
* ``logits grad``: ``d loss / d logits`` in place (``ops.grad``);
* ``grad matmuls``: the hidden, weight and bias gradients (``chunk_grads``).

Host time is each range's wall time on the host (children included); kernel time is the
device time of the kernels launched inside it.  Prints a table and writes every number to
``--out``; ``--quick`` runs a small case on the CPU (kernel times are then 0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from cyb.kernels import chunked  # noqa: E402
from cyb.bench.loss import make_methods, make_problem  # noqa: E402
from cyb.kernels.chunk_ops import OPS, resolve_backend  # noqa: E402

PARTS = ("logits", "stats", "block loss", "logits grad", "grad matmuls")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _ranged(name: str, fn):
    def run(*args, **kwargs):
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)
    return run


class _Ops:
    """A chunk backend whose ``stats`` and ``grad`` run in named ranges."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.stats = _ranged("stats", inner.stats)
        self.grad = _ranged("logits grad", inner.grad)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class PartsInRanges:
    """While inside, the chunk loop's parts run in named profiler ranges (see the module docstring)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend

    def __enter__(self):
        self.saved = (chunked._block_loss_grads, chunked.chunk_grads, OPS[self.backend], F.linear)
        chunked._block_loss_grads = _ranged("block loss", chunked._block_loss_grads)
        chunked.chunk_grads = _ranged("grad matmuls", chunked.chunk_grads)
        OPS[self.backend] = _Ops(OPS[self.backend])
        F.linear = _ranged("logits", F.linear)
        return self

    def __exit__(self, *exc):
        chunked._block_loss_grads, chunked.chunk_grads, OPS[self.backend], F.linear = self.saved
        return False


def one_call(loss, h, w, t):
    loss(h, w, t).backward()
    h.grad = w.grad = None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--num-steps", type=int, default=4)
    ap.add_argument("--backend", default="auto", choices=("auto", "torch", "triton"))
    ap.add_argument("--dtype", default="bf16", choices=tuple(DTYPES))
    ap.add_argument("--calls", type=int, default=5, help="profiled calls (after 3 warm-ups)")
    ap.add_argument("--quick", action="store_true", help="a small case on the CPU (a smoke run)")
    a = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not a.quick
    device = torch.device("cuda" if cuda else "cpu")
    if a.quick:
        a.rows, a.hidden, a.vocab, a.dtype = 512, 64, 1024, "fp32"
    backend = resolve_backend(a.backend, device, DTYPES[a.dtype])
    h, w, t = make_problem(a.rows, a.vocab, a.hidden, a.num_steps, DTYPES[a.dtype], device)
    loss = make_methods(a.vocab, a.num_steps, None)[f"fused_{backend}"]  # cyb_loss, the bench's own
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(3):
        one_call(loss, h, w, t)
    sync()
    walls = []
    for _ in range(a.calls):
        t0 = time.perf_counter()
        one_call(loss, h, w, t)
        sync()
        walls.append((time.perf_counter() - t0) * 1e3)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with PartsInRanges(backend), torch.profiler.profile(activities=activities) as prof:
        with torch.profiler.record_function("call"):
            for _ in range(a.calls):
                one_call(loss, h, w, t)
            sync()
    averages = prof.key_averages()
    # a named range appears twice: as a host range (its calls, host time, and the time of the
    # kernels launched inside it) and, on CUDA, as an annotation of the GPU's timeline (a span,
    # which overlaps other ranges' kernels where the loss runs on a side stream): the host's is read
    host = {e.key: e for e in averages if getattr(e, "device_type", None) == torch.autograd.DeviceType.CPU}
    ranges = {"call", *PARTS}
    parts = {}
    for name in ("call",) + PARTS:
        e = host.get(name)
        if e is None:
            continue
        device_us = getattr(e, "device_time_total", None)
        if device_us is None:
            device_us = getattr(e, "cuda_time_total", 0.0)
        parts[name] = {"calls_per_loss_call": e.count / a.calls, "host_ms": e.cpu_time_total / 1e3 / a.calls,
                       "kernel_ms": device_us / 1e3 / a.calls}
    kernels = sum(getattr(e, "self_device_time_total", 0.0) or 0.0 for e in averages
                  if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA and e.key not in ranges
                  and not getattr(e, "is_user_annotation", False))
    result = {"argv": sys.argv[1:], "device": torch.cuda.get_device_name() if cuda else "cpu",
              "torch": torch.__version__, "backend": backend, "rows": a.rows, "hidden": a.hidden, "vocab": a.vocab,
              "num_steps": a.num_steps, "dtype": a.dtype, "wall_ms_median": statistics.median(walls),
              "kernel_ms_per_call": kernels / 1e3 / a.calls, "parts": parts}
    print(f"fused_linear_loss, {a.rows} rows x {a.vocab} vocab, M = {a.num_steps}, {a.dtype}, backend {backend}: "
          f"{result['wall_ms_median']:.2f} ms a call (median of {a.calls}), kernels {result['kernel_ms_per_call']:.2f} ms")
    print(f"{'part':<14} {'calls':>6} {'host ms':>9} {'kernel ms':>10}")
    for name, p in parts.items():
        print(f"{name:<14} {p['calls_per_loss_call']:>6.1f} {p['host_ms']:>9.2f} {p['kernel_ms']:>10.2f}")
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
