"""Triton kernels for the split attention's own-block part and merge
(:mod:`cyb.kernels.split_attention`), one program per token of a row.

* :func:`own_block_forward`: for each step ``i`` of a token, the softmax over the union of the
  real keys (part A's output and log-sum-exp), the earlier tokens' pauses (part C, gated
  layouts) and the steps ``1..i`` of its own block, in one pass: writes the merged output
  ``[B, L, M, H, dim]`` and log-sum-exp ``[B, L, H, M]``.
* :func:`own_block_backward_`: the own block's share of the gradients, given the merged output
  and log-sum-exp: adds into ``dq [B, L, H, M, dim]``, ``dk`` and ``dv [B, L, M, kv_heads, dim]``
  (float32; key heads shared by several query heads gather with atomic adds).

Each program holds one token's ``M x heads x dim`` queries, keys and values in registers
(``M`` is small), so the own block costs one read of the pause steps and one write, against a
dozen elementwise passes over float32 copies in the plain tensor version.  Arithmetic is
float32.  The kernels run on CUDA tensors, and on CPU tensors when ``TRITON_INTERPRET=1`` was
set before triton was first imported (the tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _token_tile(L, H, G: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's row ``b`` and token ``t``, its head and dim offsets, their masks (heads;
    heads x dim) and each head's key head."""
    pid = tl.program_id(0)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    hm = h < H
    return pid // L, pid % L, h, d, hm, hm[:, None] & (d < D)[None, :], h // G


@triton.jit
def _tile(x, b, t, step, heads, d, mask, s_b, s_l, s_m, s_h):
    """The float32 ``[heads, dim]`` tile of step ``step`` of token ``(b, t)`` of a tensor with
    strides ``s_b, s_l, s_m, s_h`` (row, token, step, head) and a unit last one."""
    return tl.load(x + b * s_b + t * s_l + step * s_m + heads[:, None] * s_h + d[None, :], mask=mask,
                   other=0.0).to(tl.float32)


@triton.jit
def _own_block_fwd(q, k, v, oa, la, oc, lc, out, lse, L, H, scale,
                   sq_b, sq_l, sq_m, sq_h, sk_b, sk_l, sk_m, sk_h, sv_b, sv_l, sv_m, sv_h,
                   soa_b, soa_l, soa_h, soa_m, sla_b, sla_l, sla_h, sla_m,
                   soc_b, soc_l, soc_h, soc_m, slc_b, slc_l, slc_h, slc_m,
                   M: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr,
                   BLOCK_D: tl.constexpr, HAS_C: tl.constexpr):
    b, t, h, d, hm, hd, kvh = _token_tile(L, H, G, D, BLOCK_H, BLOCK_D)
    for i in tl.static_range(M):
        o = _tile(oa, b, t, i, h, d, hd, soa_b, soa_l, soa_m, soa_h)
        lse_a = tl.load(la + b * sla_b + t * sla_l + h * sla_h + i * sla_m, mask=hm, other=0.0).to(tl.float32)
        top = lse_a
        if HAS_C:
            lse_c = tl.load(lc + b * slc_b + t * slc_l + h * slc_h + i * slc_m, mask=hm,
                            other=float("-inf")).to(tl.float32)
            top = tl.maximum(top, lse_c)
        qi = _tile(q, b, t, i, h, d, hd, sq_b, sq_l, sq_m, sq_h)
        for j in tl.static_range(1, i + 1):
            kj = _tile(k, b, t, j, kvh, d, hd, sk_b, sk_l, sk_m, sk_h)
            top = tl.maximum(top, tl.sum(qi * kj, axis=1) * scale)
        w = tl.exp(lse_a - top)
        total = w
        acc = w[:, None] * o
        if HAS_C:
            oci = _tile(oc, b, t, i, h, d, hd, soc_b, soc_l, soc_m, soc_h)
            wc = tl.exp(lse_c - top)
            total += wc
            acc += wc[:, None] * oci
        for j in tl.static_range(1, i + 1):
            kj = _tile(k, b, t, j, kvh, d, hd, sk_b, sk_l, sk_m, sk_h)
            vj = _tile(v, b, t, j, kvh, d, hd, sv_b, sv_l, sv_m, sv_h)
            wj = tl.exp(tl.sum(qi * kj, axis=1) * scale - top)
            total += wj
            acc += wj[:, None] * vj
        row = (b * L + t) * M + i
        tl.store(out + row * H * D + h[:, None] * D + d[None, :], (acc / total[:, None]).to(out.dtype.element_ty),
                 mask=hd)
        tl.store(lse + ((b * L + t) * H + h) * M + i, top + tl.log(total), mask=hm)


@triton.jit
def _own_block_bwd(q, k, v, do, out, lse, dq, dk, dv, L, H, KV, scale,
                   sq_b, sq_l, sq_m, sq_h, sk_b, sk_l, sk_m, sk_h, sv_b, sv_l, sv_m, sv_h,
                   sdo_b, sdo_l, sdo_m, sdo_h, sdq_b, sdq_l, sdq_h, sdq_m,
                   M: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    b, t, h, d, hm, hd, kvh = _token_tile(L, H, G, D, BLOCK_H, BLOCK_D)
    for i in tl.static_range(1, M):
        row = (b * L + t) * M + i
        qi = _tile(q, b, t, i, h, d, hd, sq_b, sq_l, sq_m, sq_h)
        doi = _tile(do, b, t, i, h, d, hd, sdo_b, sdo_l, sdo_m, sdo_h)
        oi = tl.load(out + row * H * D + h[:, None] * D + d[None, :], mask=hd, other=0.0).to(tl.float32)
        delta = tl.sum(doi * oi, axis=1)
        lse_i = tl.load(lse + ((b * L + t) * H + h) * M + i, mask=hm, other=0.0)
        dqi = tl.zeros((BLOCK_H, BLOCK_D), dtype=tl.float32)
        for j in tl.static_range(1, i + 1):
            kj = _tile(k, b, t, j, kvh, d, hd, sk_b, sk_l, sk_m, sk_h)
            vj = _tile(v, b, t, j, kvh, d, hd, sv_b, sv_l, sv_m, sv_h)
            p = tl.exp(tl.sum(qi * kj, axis=1) * scale - lse_i)
            ds = p * (tl.sum(doi * vj, axis=1) - delta)
            dqi += ds[:, None] * kj
            kv_row = ((b * L + t) * M + j) * KV * D + kvh[:, None] * D + d[None, :]
            tl.atomic_add(dk + kv_row, ds[:, None] * qi * scale, mask=hd)
            tl.atomic_add(dv + kv_row, p[:, None] * doi, mask=hd)
        at = dq + b * sdq_b + t * sdq_l + h[:, None] * sdq_h + i * sdq_m + d[None, :]
        tl.store(at, tl.load(at, mask=hd, other=0.0) + dqi * scale, mask=hd)


def _blocks_of(heads: int, dim: int) -> tuple[int, int]:
    return triton.next_power_of_2(heads), triton.next_power_of_2(dim)


def own_block_forward(q5, k5, v5, out_a, lse_a, out_c, lse_c, scale: float):
    """``(out [B, L, M, H, dim] in q's dtype, lse [B, L, H, M] float32)``: part A
    (``out_a [B, L, H, M, dim]``, ``lse_a [B, L, H, M]``), part C when given (the gate already
    in ``lse_c``) and the own block's pauses, merged.  ``q5 [B, L, M, H, dim]``, ``k5`` and
    ``v5 [B, L, M, kv_heads, dim]``; any strides with a unit last one."""
    b, n, m, h, d = q5.shape
    q5, k5, v5, out_a = (_unit_last(x) for x in (q5, k5, v5, out_a))
    out_c = _unit_last(out_c) if out_c is not None else None
    out = torch.empty((b, n, m, h, d), dtype=q5.dtype, device=q5.device)
    lse = torch.empty((b, n, h, m), dtype=torch.float32, device=q5.device)
    has_c = out_c is not None
    oc, lc = (out_c, lse_c) if has_c else (out_a, lse_a)  # (placeholders, never read)
    block_h, block_d = _blocks_of(h, d)
    _own_block_fwd[(b * n,)](
        q5, k5, v5, out_a, lse_a, oc, lc, out, lse, n, h, float(scale),
        *_strides4(q5), *_strides4(k5), *_strides4(v5), *_strides4(out_a), *lse_a.stride(),
        *_strides4(oc), *lc.stride(),
        M=m, G=h // k5.shape[3], D=d, BLOCK_H=block_h, BLOCK_D=block_d, HAS_C=has_c)
    return out, lse


def own_block_backward_(q5, k5, v5, do5, out, lse, dq, dk, dv, scale: float) -> None:
    """Add the own block's share of the gradients into ``dq [B, L, H, M, dim]`` and ``dk``, ``dv``
    (``[B, L, M, kv_heads, dim]``, contiguous), all float32, given the merged ``out``
    ``[B, L, M, H, dim]`` (contiguous) and ``lse [B, L, H, M]`` (contiguous float32)."""
    b, n, m, h, d = q5.shape
    if m < 2:
        return
    q5, k5, v5, do5 = (_unit_last(x) for x in (q5, k5, v5, do5))  # (the gradient of a sum is a broadcast)
    for x in (out, lse, dk, dv):
        if not x.is_contiguous():
            raise ValueError("own_block_backward_ needs contiguous out, lse, dk and dv")
    block_h, block_d = _blocks_of(h, d)
    _own_block_bwd[(b * n,)](
        q5, k5, v5, do5, out, lse, dq, dk, dv, n, h, k5.shape[3], float(scale),
        *_strides4(q5), *_strides4(k5), *_strides4(v5), *_strides4(do5), *_strides4(dq),
        M=m, G=h // k5.shape[3], D=d, BLOCK_H=block_h, BLOCK_D=block_d)


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when its last stride is 1 (the kernels read any other strides), else a copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _strides4(x: torch.Tensor) -> tuple[int, int, int, int]:
    """The first four strides of a 5-D tensor whose last stride is 1."""
    if x.stride(-1) != 1:
        raise ValueError("the kernels need a unit stride on the last dimension")
    return tuple(x.stride()[:4])


__all__ = ["own_block_backward_", "own_block_forward"]
