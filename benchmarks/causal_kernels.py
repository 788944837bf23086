"""The causal calls of the split attention (:mod:`cyb.kernels.split_attention`) through each
kernel PyTorch offers on CUDA, at one layer's shapes of a Recipe 1 row::

    python benchmarks/causal_kernels.py [--batch 32] [--real-tokens 256] [--steps 4]

Checks each kernel's output, log-sum-exp and gradients (given the log-sum-exp of a wider
softmax, as the split attention's backward passes it) against the explicit softmax, then times
forward and backward of: part A alone, part A and the ``M - 1`` calls of part C one by one, and
the same ``M`` calls as one call of ``M`` times the batch; beside the shared layout's causal
attention over ``M L`` positions (what a TBYS step runs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO_ROOT = str(Path(__file__).resolve().parents[1])
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from benchmarks.flex_variants import timed  # noqa: E402


class CudnnCalls:
    """The split attention's two calls (forward with its log-sum-exp; backward given the
    log-sum-exp of a wider softmax) through cuDNN's fused attention."""

    def forward(self, q, k, v, scale):
        out, lse, *_ = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False,
                                                                          scale=scale)
        return out, lse.view(q.shape[:3])

    def backward(self, do, q, k, v, out, lse, scale):
        n, m = q.shape[2], k.shape[2]
        unused = torch.empty((), dtype=torch.int64, device=q.device)
        # (cuDNN wants the statistics as [B, heads, n, 1] with a unit last stride)
        stats = torch.empty((*q.shape[:3], 1), dtype=torch.float32, device=q.device)
        stats.copy_(lse.reshape(stats.shape))
        return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            do, q, k, v, out, stats, unused, unused, None, None, None, n, m, 0.0, True, scale=scale)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--real-tokens", type=int, default=256)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=12)
    args = p.parse_args()
    from cyb.kernels.split_attention import FlashKernel, MathKernel

    dev, bf = torch.device("cuda"), torch.bfloat16
    b, n, m, h, kv, d = args.batch, args.real_tokens, args.steps, args.heads, args.kv_heads, 64
    scale = d ** -0.5
    flash, cudnn, math = FlashKernel(), CudnnCalls(), MathKernel()

    # correctness on a small case, GQA included (step heads over key heads)
    torch.manual_seed(0)
    qs, ks, vs = (torch.randn(2, hh, 96, d, device=dev, dtype=bf) for hh in (m * h, kv, kv))
    ref_out, ref_lse = math.forward(qs, ks, vs, scale)
    for name, fwd in (("flash", flash.forward), ("cudnn", cudnn.forward)):
        try:
            out, lse = fwd(qs, ks, vs, scale)
            lse = lse.reshape(ref_lse.shape).float()
            print(f"{name}: lse shape {tuple(lse.shape)}, out err {(out.float() - ref_out.float()).abs().max():.3g}, "
                  f"lse err {(lse - ref_lse).abs().max():.3g}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name} forward with {m * h} query heads on {kv} key heads: {type(e).__name__}: {str(e)[:200]}")
    wider = ref_lse + 0.7  # as if other keys held half the mass
    do = torch.randn_like(qs)
    ref = math.backward(do, qs, ks, vs, ref_out, wider, scale)
    for name, bwd, fwd in (("flash", flash.backward, flash.forward), ("cudnn", cudnn.backward, cudnn.forward)):
        try:
            out, lse = fwd(qs, ks, vs, scale)
            got = bwd(do, qs, ks, vs, ref_out.to(bf), (wider).reshape(lse.shape).contiguous(), scale)
            errs = [(g.float() - r.float()).abs().max().item() / (r.float().abs().max().item() + 1e-9)
                    for g, r in zip(got, ref)]
            print(f"{name} backward with a given lse: relative errors dq dk dv {errs}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name} backward: {type(e).__name__}: {str(e)[:300]}")

    def make(batch, heads, kv_heads, length):
        return [torch.randn(batch, hh, length, d, device=dev, dtype=bf, requires_grad=True)
                for hh in (heads, kv_heads, kv_heads)]

    def fwd_bwd(kind, calls, batch):
        q, k, v = make(batch, m * h, kv, n)

        def run():
            for _ in range(calls):
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != m * h)
                out.sum().backward()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[kind]
        with sdpa_kernel(backend):
            return timed(run)

    sh = make(b, h, kv, n * m)
    for kind in ("cudnn", "flash"):
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[kind]
            with sdpa_kernel(backend):
                t = timed(lambda: torch.nn.functional.scaled_dot_product_attention(
                    *sh, is_causal=True, enable_gqa=kv != h).sum().backward())
            print(f"shared causal over {n * m}, {kind}: {t:.3f} ms", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"shared {kind}: {type(e).__name__}: {str(e)[:200]}")
        for label, calls, batch in (("part A", 1, b), (f"A + C as {m} calls", m, b), (f"A + C as one call of batch {m * b}", 1, m * b)):
            try:
                print(f"{label}, {kind}: {fwd_bwd(kind, calls, batch):.3f} ms", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"{label}, {kind}: {type(e).__name__}: {str(e)[:200]}")


if __name__ == "__main__":
    main()
