"""Where a private-pause training step spends its time on a GPU: forward+backward of the 134 M
Llama with shared and with private pauses, the attention alone (sdpa causal against
FlexAttention with the private block mask), and the top CUDA kernels of each::

    python benchmarks/profile_private.py [--real-tokens 2048] [--batch 4] [--steps 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO_ROOT = str(Path(__file__).resolve().parents[1])
if REPO_ROOT not in sys.path:  # run as a script: the repository root holds experiments/ and benchmarks/
    sys.path.insert(0, REPO_ROOT)

from benchmarks.flex_variants import timed  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--real-tokens", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=4, help="M")
    p.add_argument("--profile", action="store_true", help="print the top kernels of each step")
    args = p.parse_args()
    from cyb import visibility as vis
    from cyb.bench.models import SHAPE_134M, build_hf_model, random_ids, wrap
    from cyb.model import attention
    from cyb.objective import Objective, run_model
    from cyb.config import MethodConfig

    dev = torch.device("cuda")
    m, length, b = args.steps, args.real_tokens, args.batch
    hf_model = build_hf_model(SHAPE_134M, 32768, dtype=torch.bfloat16, device=dev, max_positions=length * m)
    ids = random_ids(b, length, 32768 - m)
    rows = {}
    for visibility in ("shared", "private"):
        model = wrap(hf_model, "cyb", m, visibility)
        prep = Objective(MethodConfig(name="cyb", num_steps=m), model.vocab).prepare({"ids": ids}).to(dev)

        def step():
            hidden = run_model(model, prep)
            hidden.float().square().mean().backward()
        rows[visibility] = timed(step)
        print(f"decoder fwd+bwd, {visibility:8s}: {rows[visibility]:7.1f} ms", flush=True)
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                for _ in range(2):
                    step()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14), flush=True)
    # the attention alone, one layer's shapes
    heads, dim = 12, 64
    t = length * m
    q, k, v = (torch.randn(b, heads, t, dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()  # noqa: E731
    steps = vis.recipe1_steps(torch.ones(b, length, dtype=torch.long, device=dev), m)
    order, mask = attention.flex_layout(steps, "private", torch.zeros(1, t, dtype=torch.long, device=dev),
                                        hf_model.config)
    flex = attention._flex_kernel(True)
    fl = lambda: flex(q, k, v, block_mask=mask).sum().backward()  # noqa: E731
    print(f"attention fwd+bwd, sdpa causal over {t}: {timed(sdpa):7.2f} ms; flex private: {timed(fl):7.2f} ms "
          f"(block mask {mask.shape}, sparsity {mask.sparsity():.1f}%)", flush=True)


if __name__ == "__main__":
    main()
