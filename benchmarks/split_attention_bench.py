"""One layer's attention, forward and backward, under each pause layout and kernel (the 134 M
Llama's heads: 12 x 64, bf16), at 256, 512, 1024 and 2048 real tokens per row and 8192 real
tokens per batch, M = 4::

    python benchmarks/split_attention_bench.py [--out FILE.json]

Rows: shared pauses (sdpa's causal kernel over all L*M positions), private pauses through
FlexAttention over the real-first order (block mask) and through the split attention
(cyb.kernels.split_attention: causal FlashAttention calls merged; eager and compiled; the own
block and merge as tensor ops or as one Triton kernel per pass), gated pauses through the split
attention and through the dense [B, heads, T, T] additive mask (sdpa), with the gate's
gradient.  Milliseconds per call and peak memory above the inputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO_ROOT = str(Path(__file__).resolve().parents[1])
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from benchmarks.flex_variants import timed  # noqa: E402


def _profile(name: str, fn) -> None:
    """The top CUDA kernels of three calls of ``fn``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
    print(f"-- {name}: top kernels (3 calls)")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=70))


def _rows(length: int, batch: int, m: int, heads: int = 12, dim: int = 64, profiled: tuple = ()):
    from cyb import visibility as vis
    from cyb.kernels.split_attention import split_attention
    from cyb.model import attention

    dev = torch.device("cuda")
    t = length * m
    q, k, v = (torch.randn(batch, heads, t, dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    gate = torch.full((heads,), -2.0, device=dev, requires_grad=True)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    steps = vis.recipe1_steps(torch.ones(1, length, dtype=torch.long, device=dev), m)

    def shared():
        sdpa(q, k, v, is_causal=True).sum().backward()

    class _Cfg:  # a config with full attention in every layer
        sliding_window = None

    order = vis.real_first_order(steps, "private")
    mask = attention.flex_masks(steps, "private", torch.arange(t, device=dev).unsqueeze(0), _Cfg(), order)
    flex = attention._flex_kernel(True)

    def private_flex():
        out = flex(vis.reorder(q.transpose(1, 2), order).transpose(1, 2).contiguous(),
                   vis.reorder(k.transpose(1, 2), order).transpose(1, 2).contiguous(),
                   vis.reorder(v.transpose(1, 2), order).transpose(1, 2).contiguous(),
                   block_mask=mask, kernel_options=attention.kernel_options(dev, q.shape[-1]))
        out.sum().backward()

    def private_split():
        split_attention(q, k, v, m).sum().backward()

    def gated_split():
        split_attention(q, k, v, m, gate=gate).sum().backward()

    compiled = torch.compile(split_attention, dynamic=False)

    def private_split_compiled():
        compiled(q, k, v, m).sum().backward()

    def gated_split_compiled():
        compiled(q, k, v, m, gate=gate).sum().backward()

    def private_split_triton():
        split_attention(q, k, v, m, own_block="triton").sum().backward()

    def private_split_triton_compiled():
        compiled(q, k, v, m, own_block="triton").sum().backward()

    def gated_split_triton_compiled():
        compiled(q, k, v, m, gate=gate, own_block="triton").sum().backward()

    allowed = vis.visible(steps, "gated").unsqueeze(1)
    foreign = vis.foreign_pauses(steps.token, steps.step).unsqueeze(1)

    def gated_dense():
        zero = torch.zeros((), device=dev)
        bias = torch.where(allowed, zero, float("-inf")) + torch.where(foreign, gate.view(1, -1, 1, 1), zero)
        sdpa(q, k, v, attn_mask=bias.to(q.dtype).expand(batch, -1, -1, -1)).sum().backward()

    for name, fn in (("shared sdpa causal", shared), ("private flex", private_flex),
                     ("private split", private_split), ("private split compiled", private_split_compiled),
                     ("private split triton", private_split_triton),
                     ("private split triton compiled", private_split_triton_compiled),
                     ("gated split", gated_split), ("gated split compiled", gated_split_compiled),
                     ("gated split triton compiled", gated_split_triton_compiled),
                     ("gated dense", gated_dense)):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        try:
            ms = timed(fn, repeats=10)
            row = {"ms": ms, "peak_gib": (torch.cuda.max_memory_allocated() - base) / 2**30}
        except torch.OutOfMemoryError:
            row = {"status": "oom"}
        except Exception as err:  # noqa: BLE001 (a row records its failure and the others go on)
            row = {"status": f"error: {type(err).__name__}: {str(err)[:300]}"}
        if name in profiled and "ms" in row:
            _profile(f"{name}, L = {length}", fn)
        q.grad = k.grad = v.grad = gate.grad = None
        yield {"layout": name, "real_tokens": length, "batch": batch, "num_steps": m, **row}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", help="write the rows as JSON here")
    p.add_argument("--real-tokens", type=int, nargs="+", default=[256, 512, 1024, 2048])
    p.add_argument("--per-batch", type=int, default=8192, help="real tokens per batch")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--profile", nargs="*", default=[], metavar="ROW",
                   help="print the top CUDA kernels of these rows (e.g. 'private split compiled')")
    args = p.parse_args()
    rows = []
    for length in args.real_tokens:
        for row in _rows(length, args.per_batch // length, args.steps, profiled=tuple(args.profile)):
            rows.append(row)
            shown = f"{row['ms']:8.2f} ms {row['peak_gib']:6.2f} GiB" if "ms" in row else row["status"]
            print(f"L={length:5d} B={row['batch']:3d} {row['layout']:<20} {shown}", flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows},
                                                     indent=1))


if __name__ == "__main__":
    main()
