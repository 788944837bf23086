"""Where a compiled training step spends its time, variant by variant (the steps of
``cyb bench train``, :mod:`cyb.bench.train_step`), on a GPU::

    python benchmarks/profile_train_step.py --out DIR [--real-tokens 256] [--batch 32]
        [--variants tbys_liger cyb_fused cyb_private cyb_private_split cyb_gated] [--shape 134m]

For each variant: the step time (median of timed steps), then one profiled window of steps:

* the GPU's busy share of the wall time (kernel time over wall time),
* kernel launches and host syncs per step (``aten::_local_scalar_dense`` and ``aten::nonzero``:
  a device value read on the host; ``cudaStreamSynchronize``/``cudaDeviceSynchronize``),
* kernel time by kind (FlashAttention, FlexAttention, matrix products, Triton, other),
* every kernel (time and calls per step), and the graph breaks and graphs that ``torch.compile`` made.

Writes ``DIR/profile-<shape>-<L>.json`` (every number) and ``DIR/profile-<shape>-<L>.txt`` (the
profiler's table of each variant) as each variant finishes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = str(Path(__file__).resolve().parents[1])
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

KINDS = (("flash attention", ("flash",)), ("flex attention", ("flex",)),
         ("matrix products", ("gemm", "cutlass", "nvjet", "sm90_xmma", "sm80_xmma", "cublas")),
         ("triton", ("triton",)))
SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "cudaStreamSynchronize", "cudaDeviceSynchronize")


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def profile_variant(case, variant: str, steps: int) -> dict:
    """Time and profile ``steps`` compiled training steps of ``variant`` on ``case``."""
    import torch._dynamo
    from torch.profiler import ProfilerActivity, profile

    from cyb.bench.timing import time_calls
    from cyb.bench.train_step import _autocast

    torch._dynamo.utils.counters.clear()
    case.restore()
    loss_fn = case.loss_fn(variant)
    optimizer = torch.optim.AdamW(case.params, lr=1e-4, fused=True)

    def step():
        with _autocast(case.cfg.precision, case.device):
            loss = loss_fn()
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    timed = time_calls(step, device=case.device, warmup=3, repeats=5)
    breaks = {str(k): int(v) for k, v in torch._dynamo.utils.counters["graph_break"].items()}
    graphs = int(torch._dynamo.utils.counters["stats"].get("unique_graphs", 0))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    optimizer.zero_grad(set_to_none=True)
    del optimizer
    kernels, by_kind, syncs, launches = {}, {}, {}, 0
    for e in prof.key_averages():
        cuda_us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if e.key in SYNC_OPS:
            syncs[e.key] = e.count / steps
        if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx"):
            launches += e.count
        if cuda_us and e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.key] = (cuda_us / steps / 1e3, e.count / steps)
            k = kind_of(e.key)
            by_kind[k] = by_kind.get(k, 0.0) + cuda_us / steps / 1e3
    busy = sum(ms for ms, _ in kernels.values())
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])
    return {"variant": variant, "step_ms": timed["ms"], "profiled_step_ms": wall / steps * 1e3,
            "kernel_ms_per_step": busy, "gpu_busy": busy / (wall / steps * 1e3),
            "kernels_per_step": sum(n for _, n in kernels.values()), "launch_calls_per_step": launches / steps,
            "host_syncs_per_step": syncs, "kernel_ms_by_kind": by_kind, "graph_breaks": breaks,
            "unique_graphs": graphs,
            "kernels": [{"name": k[:120], "ms_per_step": ms, "calls_per_step": n} for k, (ms, n) in top],
            "table": prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--real-tokens", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--shape", default="134m")
    p.add_argument("--steps", type=int, default=3, help="profiled steps per variant")
    p.add_argument("--variants", nargs="+",
                   default=["tbys_liger", "cyb_fused", "cyb_private", "cyb_private_split", "cyb_gated"])
    args = p.parse_args()
    from cyb.bench.models import TRAIN_SHAPES
    from cyb.bench.train_step import TrainBenchConfig, _Case, _static_compile_settings

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = TrainBenchConfig(shape=TRAIN_SHAPES[args.shape], cases=[(args.vocab, args.batch)],
                           real_tokens=args.real_tokens, variants=tuple(args.variants), modes=("compile",),
                           device="cuda").validate()
    rows = []
    with _static_compile_settings():
        case = _Case(cfg, args.vocab, args.batch, torch.device("cuda"))
        case.compile_layers()
        for variant in args.variants:
            row = profile_variant(case, variant, args.steps)
            table = row.pop("table")
            rows.append(row)
            with open(out / f"profile-{args.shape}-{args.real_tokens}.txt", "a") as f:
                f.write(f"== {variant}\n{table}\n")
            print(json.dumps({k: v for k, v in row.items() if k != "kernels"}), flush=True)
            for t in row["kernels"][:8]:
                print(f"   {t['ms_per_step']:7.2f} ms {t['calls_per_step']:6.0f}x  {t['name']}", flush=True)
            (out / f"profile-{args.shape}-{args.real_tokens}.json").write_text(json.dumps(
                {"argv": sys.argv[1:], "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
