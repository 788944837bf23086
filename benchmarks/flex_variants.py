"""FlexAttention forward+backward under the private-pause mask, in several forms, against sdpa's
causal kernel (one layer's shapes of the 134 M Llama)::

    python benchmarks/flex_variants.py [--real-tokens 2048] [--batch 4] [--steps 4]
        [--heads 12] [--head-dim 64] [--forms tensor arith] [--options '{"BLOCK_M": 64, "BLOCK_N": 64}' ...] [--no-causal]

Forms: a plain causal ``mask_mod`` (the kernel's own speed), the private mask read from index
tensors (any layout), the private mask computed from the indices of Recipe 1's real-first order
(no loads), each with the default kernel options and with explicit ones (``--options``: JSON
dicts of FlexAttention's ``kernel_options``; keys prefixed ``fwd_`` or ``bwd_`` reach one
direction only, e.g. ``bwd_BLOCK_M1``, ``bwd_BLOCK_N1``, ``bwd_BLOCK_M2``, ``bwd_BLOCK_N2``,
``bwd_num_warps``, ``bwd_num_stages`` for the backward's tiles).
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def timed(fn, repeats: int = 20) -> float:
    """Milliseconds per call of ``fn`` on the GPU (three untimed calls first)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--real-tokens", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--forms", nargs="+", choices=("tensor", "arith"), default=["tensor", "arith"])
    p.add_argument("--options", nargs="+", type=json.loads, metavar="JSON",
                   default=[{"BACKEND": "TRITON"}, {"BLOCK_M": 64, "BLOCK_N": 64},
                            {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2}])
    p.add_argument("--no-causal", action="store_true", help="skip the sdpa and causal FlexAttention rows")
    args = p.parse_args()
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from cyb import visibility as vis

    dev = torch.device("cuda")
    b, length, m, heads, dim = args.batch, args.real_tokens, args.steps, args.heads, args.head_dim
    t = length * m
    q, k, v = (torch.randn(b, heads, t, dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    flex = torch.compile(flex_attention, dynamic=False)

    def run(mask, **kw):
        def go():
            flex(q, k, v, block_mask=mask, **kw).sum().backward()
        return go

    def fwd(mask, **kw):
        def go():
            with torch.no_grad():
                flex(q, k, v, block_mask=mask, **kw)
        return go

    print(f"T = {t}, B = {b}, {heads} heads of {dim}", flush=True)
    if not args.no_causal:
        sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()  # noqa: E731
        print(f"sdpa causal fwd+bwd {timed(sdpa):.2f} ms", flush=True)
        causal = create_block_mask(lambda b_, h, qi, ki: ki <= qi, None, None, t, t, device=dev)
        print(f"flex causal: fwd+bwd {timed(run(causal)):.2f} ms, fwd {timed(fwd(causal)):.2f} ms", flush=True)

    steps = vis.recipe1_steps(torch.ones(1, length, dtype=torch.long, device=dev), m)
    order = vis.real_first_order(steps, "private")
    tok, stp = vis.reorder(steps.token, order)[0], vis.reorder(steps.step, order)[0]

    def tensor_mod(b_, h, qi, ki):
        same = (tok[qi] == tok[ki]) & (stp[ki] <= stp[qi])
        return same | ((tok[ki] < tok[qi]) & (stp[ki] == 0))

    def arith_mod(b_, h, qi, ki):
        q_real, k_real = qi < length, ki < length
        q_tok = torch.where(q_real, qi, (qi - length) // (m - 1))
        k_tok = torch.where(k_real, ki, (ki - length) // (m - 1))
        q_step = torch.where(q_real, 0, (qi - length) % (m - 1) + 1)
        k_step = torch.where(k_real, 0, (ki - length) % (m - 1) + 1)
        return (k_real & (k_tok <= q_tok)) | ((q_tok == k_tok) & (k_step <= q_step))

    forms = {"tensor": tensor_mod, "arith": arith_mod}
    for name in args.forms:
        mask = create_block_mask(forms[name], None, None, t, t, device=dev)
        print(f"flex private ({name}, sparsity {mask.sparsity():.1f}%): fwd+bwd {timed(run(mask)):.2f} ms, "
              f"fwd {timed(fwd(mask)):.2f} ms", flush=True)
        for opts in args.options:
            try:
                print(f"   {opts}: fwd+bwd {timed(run(mask, kernel_options=opts)):.2f} ms, "
                      f"fwd {timed(fwd(mask, kernel_options=opts)):.2f} ms", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"   {opts}: failed {str(e).splitlines()[0][:120]}", flush=True)


if __name__ == "__main__":
    main()
