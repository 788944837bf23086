"""Gated pauses through one FlexAttention call over the interleaved row, with the gate's gradient
taken outside the kernel, against the split attention (:mod:`cyb.kernels.split_attention`), at
one layer's shapes of a Recipe 1 row::

    python benchmarks/gated_flex_probe.py [--cases 32:256 4:2048] [--steps 4] [--out FILE.json]

A gated query sees what a shared one sees (every earlier position of the interleaved row), the
gate added to the logits of earlier tokens' pauses.  So the attention is one causal call with a
``score_mod`` adding the gate.  FlexAttention's own backward for a learned per-head bias adds
every tile's share into a handful of values, which made ``pause_kernel="flex"`` train 3x to over
20x slower than private pauses; here the kernel sees the gate detached, and the gate's gradient
comes from a second forward over the earlier pauses alone::

    dL/dg_h = sum over rows and queries of  s * (do . out_F - do . out)

with ``out_F`` that forward's output, ``s = exp(lse_F - lse)`` the share of the attention those
keys take (``lse_F`` with the gate, ``lse`` of the whole call).  The variants:

* ``split``: :func:`~cyb.kernels.split_attention.split_attention` (what ``auto`` runs on rows
  longer than :data:`cyb.model.attention.GATED_FLEX_MAX_POSITIONS`);
* ``flex_bias``: the gate inside FlexAttention's ``score_mod``, its gradient by the kernel;
* ``flex_detached``: :func:`cyb.model.attention.gated_flex`, the gate detached in the kernel
  and its gradient as written above (the second forward over the same causal block mask, the
  other keys shifted out).

Checks each variant's output and gradients (queries, keys, values, gate) against the float32
explicit softmax on the first rows, then times one forward and backward of each (CUDA).
Times on CUDA only; on the CPU (where FlexAttention has no backward) it checks the gate's
gradient by the formula above against the reference, and nothing else.
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


def foreign(q, k, m: int):
    """Whether key position ``k`` is a pause of an earlier token than query position ``q``
    (Recipe 1, interleaved, no padding; index tensors that broadcast, as FlexAttention's mask
    and score functions get them)."""
    return (k // m < q // m) & (k % m > 0)


def foreign_mask(t: int, m: int, device) -> torch.Tensor:
    """``[T, T]`` bool of :func:`foreign` (queries by row)."""
    pos = torch.arange(t, device=device)
    return foreign(pos.view(t, 1), pos.view(1, t), m)


def reference(q, k, v, gate, m):
    """The explicit softmax in float32: causal over the interleaved row, the gate on foreign keys."""
    t = q.shape[2]
    s = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s + torch.where(foreign_mask(t, m, q.device), gate.float().view(1, -1, 1, 1), 0.0)
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    s = s.masked_fill(~causal, float("-inf"))
    return (s.softmax(-1) @ v.float()).transpose(1, 2)  # [B, T, H, dim]


def build(t: int, m: int, device, compiled: bool):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from cyb.model.attention import gated_flex

    def causal(b, h, q, k):
        return k <= q

    mask = create_block_mask(causal, None, None, t, t, device=device, _compile=compiled)
    kernel = torch.compile(flex_attention, dynamic=False) if compiled else flex_attention
    pos = torch.arange(t, device=device)
    token, step = (pos // m).view(1, t), (pos % m).view(1, t)

    def gate_mod(gate):
        def mod(score, b, h, q, k):
            return score + torch.where(foreign(q, k, m), gate[h].to(score.dtype), torch.zeros_like(score))
        return mod

    def flex_bias(q, k, v, gate):
        return kernel(q, k, v, score_mod=gate_mod(gate), block_mask=mask).transpose(1, 2)

    def flex_detached(q, k, v, gate):  # the library's path (pause_kernel="flex")
        def flex(score_mod=None, return_lse=False):
            return kernel(q, k, v, score_mod=score_mod, block_mask=mask, return_lse=return_lse)
        return gated_flex(flex, gate, token, step).transpose(1, 2)

    return {"flex_bias": flex_bias, "flex_detached": flex_detached}


def split(m):
    from cyb.kernels.split_attention import split_attention

    def run(q, k, v, gate):
        return split_attention(q, k, v, m, gate=gate)
    return run


def inputs(b, t, heads, dim, device, dtype, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v = (torch.randn(b, heads, t, dim, generator=g).to(device, dtype).requires_grad_() for _ in range(3))
    gate = (torch.randn(heads, generator=g) * 2).to(device).requires_grad_()
    return q, k, v, gate


def grads(fn, q, k, v, gate, do):
    for x in (q, k, v, gate):
        x.grad = None
    out = fn(q, k, v, gate)
    out.backward(do.to(out.dtype))
    return out.detach().float(), [x.grad.detach().float() for x in (q, k, v, gate)]


def check(variants, m, device, dtype, b=2, length=32, heads=4, dim=32):
    """Largest error of each variant against the float32 reference, relative to the reference's
    largest magnitude (output, dq, dk, dv, dgate)."""
    t = length * m
    q, k, v, gate = inputs(b, t, heads, dim, device, dtype)
    do = torch.randn(b, t, heads, dim, generator=torch.Generator().manual_seed(1)).to(device)
    want_out, want = grads(lambda *a: reference(*a, m), q, k, v, gate, do)
    report = {}
    for name, fn in variants.items():
        out, got = grads(fn, q, k, v, gate, do)
        errs = [float((x - y).abs().max() / y.abs().max()) for x, y in zip([out] + got, [want_out] + want)]
        report[name] = dict(zip(("out", "dq", "dk", "dv", "dgate"), errs))
    return report


def check_gate_gradient(m, device, b=2, length=32, heads=4, dim=32):
    """The gate's gradient by the formula above (FlexAttention forwards without grad, so this
    runs on the CPU too) against the float32 reference's autograd: ``(output error, gate
    gradient error)``, each relative to the reference's largest magnitude."""
    t = length * m
    q, k, v, gate = inputs(b, t, heads, dim, device, torch.float32)
    q, k, v = q.detach(), k.detach(), v.detach()
    do = torch.randn(b, t, heads, dim, generator=torch.Generator().manual_seed(1)).to(device)
    want_out = reference(q, k, v, gate, m)
    (want_dgate,) = torch.autograd.grad(want_out, gate, do)
    fn = build(t, m, device, device.type == "cuda")["flex_detached"]
    out = fn(q, k, v, gate)
    (dgate,) = torch.autograd.grad(out, gate, do)
    out, want_out = out.detach(), want_out.detach()
    return (float((out - want_out).abs().max() / want_out.abs().max()),
            float((dgate - want_dgate).abs().max() / want_dgate.abs().max()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", default=["32:256", "4:2048"], help="BATCH:REAL_TOKENS")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--check-only", action="store_true")
    p.add_argument("--no-check", action="store_true", help="time only (no bf16 check against the reference)")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    m = a.steps
    result = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
              "steps": m, "heads": a.heads, "dim": a.dim, "command": " ".join(["python"] + sys.argv)}
    dtype = torch.bfloat16 if cuda else torch.float32
    result["gate_gradient_check"] = dict(zip(("out", "dgate"), check_gate_gradient(m, device)))
    print("the gate's gradient by the formula (largest error / largest value):", result["gate_gradient_check"])
    if cuda and not a.no_check:  # (FlexAttention has no backward on the CPU)
        small = {**build(32 * m, m, device, True), "split": split(m)}
        result["check"] = check(small, m, device, dtype)
        print("check in bf16 (largest error / largest value):", json.dumps(result["check"], indent=1))
    write(a.out, result)
    if not a.check_only and cuda:
        result["cases"] = {}
        for case in a.cases:
            b, length = map(int, case.split(":"))
            t = length * m
            variants = {"split": split(m), **build(t, m, device, True)}
            q, k, v, gate = inputs(b, t, a.heads, a.dim, device, dtype)
            do = torch.randn(b, t, a.heads, a.dim, device=device, dtype=dtype)
            row = {}
            for name, fn in variants.items():
                def step(fn=fn):
                    out = fn(q, k, v, gate)
                    out.backward(do)
                try:
                    row[name] = round(timed(step, repeats=10), 3)
                except Exception as e:  # noqa: BLE001  (a variant that cannot run: reported, not fatal)
                    row[name] = f"{type(e).__name__}: {e}"[:300]
                print(case, name, row[name], flush=True)
            result["cases"][case] = row
            write(a.out, result)
    write(a.out, result)


def write(path, result) -> None:
    """``result`` as JSON at ``path`` (None: nowhere), after each case, so a run cut short keeps
    what it measured."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
