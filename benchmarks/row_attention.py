"""The engine's row attention against attention through a mask, one layer of a decoding step.

    python benchmarks/row_attention.py --out DIR

For each step shape (rows, query heads, key heads, positions per row, head dim; the 134 M Llama's
heads by default) and each spread of row lengths, times on the GPU (bf16, each call captured in a CUDA graph as the engine runs it, timed by
``triton.testing.do_bench`` over its replays):

* ``masked``: sdpa over every row's first ``limit`` columns with a bool mask, ``limit`` the longest
  row rounded up to 256 (what the engine runs without row attention);
* ``row``: :func:`cyb.kernels.row_attention.row_attention` at its defaults, and with other tiles,
  warps, pipelining stages and programs per multiprocessor (``--variants``);
* ``bound``: the bytes of keys and values the rows hold, at the device's measured copy bandwidth.

Writes ``row-attention.json`` and prints a line per shape.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from cyb.bench.timing import graphed  # noqa: E402
from cyb.kernels import row_attention as ra  # noqa: E402
from cyb.kernels import triton_row_attention as tra  # noqa: E402


def bandwidth_gb_s(bench) -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    return 2 * x.numel() / ms / 1e6


def main(argv=None):
    from triton.testing import do_bench

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=12)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--columns", type=int, default=1024, help="the cache's columns per row")
    ap.add_argument("--variants", nargs="*", default=["64:4:3:8", "64:4:3:32", "128:4:3:2", "128:4:3:8", "32:4:3:8"],
                    help="BLOCK_N:warps:stages:programs-per-SM variants of the kernel besides its default")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)

    def bench(fn):
        return do_bench(fn, warmup=25, rep=200)

    gb_s = bandwidth_gb_s(bench)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_gb_s": gb_s,
           "default": f"{ra.BLOCK_N}:{tra.NUM_WARPS}:{tra.NUM_STAGES}:{ra.PROGRAMS_PER_SM}", "runs": []}
    g = torch.Generator().manual_seed(0)
    for n in a.rows:
        for q_len in (1, 4):
            for spread, (lo, hi) in {"mixed": (16, 768), "full": (a.columns - 8, a.columns - 4)}.items():
                lengths = torch.randint(lo, hi, (n,), generator=g)
                q = torch.randn(n, q_len, a.heads, a.dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
                k = torch.randn(n, a.kv_heads, a.columns, a.dim, device="cuda", dtype=torch.bfloat16)
                v = torch.randn_like(k)
                last = (lengths.view(n, 1) - q_len + torch.arange(q_len)).cuda()
                limit = min(a.columns, -(-int(lengths.max()) // 256) * 256)
                mask = (torch.arange(limit, device="cuda").view(1, 1, 1, limit) <= last.view(n, 1, q_len, 1))
                group = a.heads // a.kv_heads
                row = {"rows": n, "q": q_len, "spread": spread, "limit": limit,
                       "bound_ms": 2 * int(lengths.sum()) * a.kv_heads * a.dim * 2 / gb_s / 1e6}
                row["masked_ms"] = bench(graphed(lambda: torch.nn.functional.scaled_dot_product_attention(
                    q, k[:, :, :limit], v[:, :, :limit], attn_mask=mask, enable_gqa=group > 1)))
                for variant in [out["default"]] + list(a.variants):
                    ra.BLOCK_N, tra.NUM_WARPS, tra.NUM_STAGES, ra.PROGRAMS_PER_SM = map(int, variant.split(":"))
                    got = ra.row_attention(q, k, v, last)
                    ref = torch.nn.functional.scaled_dot_product_attention(
                        q.float(), k[:, :, :limit].float(), v[:, :, :limit].float(), attn_mask=mask,
                        enable_gqa=group > 1).transpose(1, 2)
                    err = float((got.float() - ref).abs().max())
                    row[f"row_ms_{variant}"] = bench(graphed(lambda: ra.row_attention(q, k, v, last)))
                    row[f"row_err_{variant}"] = err
                ra.BLOCK_N, tra.NUM_WARPS, tra.NUM_STAGES, ra.PROGRAMS_PER_SM = map(int, out["default"].split(":"))
                out["runs"].append(row)
                print(json.dumps(row), flush=True)
                with open(os.path.join(a.out, "row-attention.json"), "w") as f:
                    json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
