"""Triton kernels of :func:`cyb.kernels.row_attention.row_attention` (split-column decoding
attention that reads each row's own columns).

* :func:`_partial_kernel`, one program per (row, key head, split of the columns): the queries of
  the key head's ``G`` query heads at the row's ``Q`` positions (``G x Q`` rows of one tile)
  against the split's columns, up to the last column any of them sees.  Online softmax in
  float32 (base 2; float32 inputs multiply in full float32, not tf32); writes the split's normalised output and its log-sum-exp (``-inf`` where
  the split has no visible column).
* :func:`_combine_kernel`, one program per (row, key head, query row of the tile): merges the
  splits by their log-sum-exps and writes the output ``[n, Q, H, D]``.

They run on CUDA tensors, and on CPU tensors when ``TRITON_INTERPRET=1`` was set before triton
was first imported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .chunk_ops import interpreting

LOG2E = 1.4426950408889634
#: warps and software-pipelining stages of a program of the partial kernel
NUM_WARPS = 4
NUM_STAGES = 3


@triton.jit
def _tile(q, k_base, v_base, foreign_row, gate, last, qpos, kpos_row, window, m_i, l_i, acc, c0, end, sk_c, sk_d,
          sv_c, sv_d, d, in_d, qk_scale, HAS_GATE: tl.constexpr, WINDOW: tl.constexpr, BLOCK_N: tl.constexpr,
          PRECISION: tl.constexpr):
    """The online softmax over the columns ``c0 .. c0 + BLOCK_N - 1`` (those below ``end``)."""
    cols = c0 + tl.arange(0, BLOCK_N)
    in_cols = cols < end
    k = tl.load(k_base + cols[:, None] * sk_c + d[None, :] * sk_d, mask=in_cols[:, None] & in_d[None, :], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    if HAS_GATE:
        f = tl.load(foreign_row + cols, mask=in_cols, other=0)
        s += tl.where(f[None, :] != 0, gate[:, None], 0.0)
    seen = (cols[None, :] <= last[:, None]) & in_cols[None, :]
    if WINDOW == 1:  # a sliding window in columns
        seen = seen & ((last[:, None] - cols[None, :]) < window)
    if WINDOW == 2:  # a sliding window in positions: each column's own
        kp = tl.load(kpos_row + cols, mask=in_cols, other=0)
        seen = seen & ((qpos[:, None] - kp[None, :]) < window)
    s = tl.where(seen, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that see nothing yet
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(v_base + cols[:, None] * sv_c + d[None, :] * sv_d, mask=in_cols[:, None] & in_d[None, :], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _partial_kernel(
    q_ptr, k_ptr, v_ptr, last_ptr, foreign_ptr, gate_ptr, qpos_ptr, kpos_ptr, o_ptr, lse_ptr,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_c, sk_d, sv_b, sv_h, sv_c, sv_d, sl_b, sl_t, sf_b, sp_b, sp_t, skp_b,
    kv_heads, splits, split_len, tiles, qk_scale, window,
    G: tl.constexpr, Q: tl.constexpr, D: tl.constexpr, HAS_GATE: tl.constexpr, WINDOW: tl.constexpr,
    DYNAMIC_LOOP: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)  # row * kv_heads + key head
    split = tl.program_id(1)
    b = (pid // kv_heads).to(tl.int64)
    g = pid % kv_heads
    r = tl.arange(0, BLOCK_M)
    in_tile = r < G * Q
    head = g * G + r // Q
    qi = r % Q
    d = tl.arange(0, BLOCK_D)
    in_d = d < D
    last = tl.load(last_ptr + b * sl_b + qi * sl_t, mask=in_tile, other=-1)
    end = tl.minimum(tl.max(last, axis=0) + 1, (split + 1) * split_len)
    start = split * split_len
    qpos = last
    if WINDOW == 1:  # no column below the lowest query's window is read
        lowest = tl.min(tl.where(in_tile & (last >= 0), last, end), axis=0) - window + 1
        start = tl.maximum(start, tl.maximum(lowest, 0) // BLOCK_N * BLOCK_N)
    if WINDOW == 2:
        qpos = tl.load(qpos_ptr + b * sp_b + qi * sp_t, mask=in_tile, other=0)
    q = tl.load(q_ptr + b * sq_b + head[:, None] * sq_h + qi[:, None] * sq_t + d[None, :] * sq_d,
                mask=in_tile[:, None] & in_d[None, :], other=0.0)
    gate = tl.zeros((BLOCK_M,), tl.float32)
    if HAS_GATE:
        gate = tl.load(gate_ptr + head, mask=in_tile, other=0.0).to(tl.float32) * 1.4426950408889634
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    k_base = k_ptr + b * sk_b + g * sk_h
    v_base = v_ptr + b * sv_b + g * sv_h
    if DYNAMIC_LOOP:  # to the row's own end (pipelined); the interpreter needs the loop below
        for c0 in range(start, end, BLOCK_N):
            m_i, l_i, acc = _tile(q, k_base, v_base, foreign_ptr + b * sf_b, gate, last, qpos, kpos_ptr + b * skp_b,
                                  window, m_i, l_i, acc, c0, end, sk_c, sk_d, sv_c, sv_d, d, in_d, qk_scale,
                                  HAS_GATE, WINDOW, BLOCK_N, PRECISION)
    else:
        for t in range(0, tiles):  # (tiles outside the row's columns do nothing)
            c0 = split * split_len + t * BLOCK_N
            if (c0 < end) & (c0 + BLOCK_N > start):
                m_i, l_i, acc = _tile(q, k_base, v_base, foreign_ptr + b * sf_b, gate, last, qpos,
                                      kpos_ptr + b * skp_b, window, m_i, l_i, acc, c0, end, sk_c, sk_d, sv_c, sv_d,
                                      d, in_d, qk_scale, HAS_GATE, WINDOW, BLOCK_N, PRECISION)
    seen_any = l_i > 0
    out = acc / tl.where(seen_any, l_i, 1.0)[:, None]
    lse = tl.where(seen_any, m_i + tl.log2(tl.where(seen_any, l_i, 1.0)), float("-inf"))
    part = (pid.to(tl.int64) * splits + split) * (G * Q)
    tl.store(o_ptr + (part + r[:, None]) * D + d[None, :], out, mask=in_tile[:, None] & in_d[None, :])
    tl.store(lse_ptr + part + r, lse, mask=in_tile)


@triton.jit
def _combine_kernel(
    o_ptr, lse_ptr, out_ptr, kv_heads, splits, heads,
    G: tl.constexpr, Q: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)  # row * kv_heads + key head
    r = tl.program_id(1)  # query row of the tile: head g * G + r // Q, position r % Q
    b = (pid // kv_heads).to(tl.int64)
    g = pid % kv_heads
    s = tl.arange(0, BLOCK_S)
    in_s = s < splits
    d = tl.arange(0, BLOCK_D)
    in_d = d < D
    part = (pid.to(tl.int64) * splits + s) * (G * Q) + r
    lse = tl.load(lse_ptr + part, mask=in_s, other=float("-inf"))
    top = tl.max(lse, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    w = tl.where(in_s, tl.exp2(lse - top), 0.0)
    total = tl.sum(w, axis=0)
    o = tl.load(o_ptr + part[:, None] * D + d[None, :], mask=in_s[:, None] & in_d[None, :], other=0.0)
    out = tl.sum(w[:, None] * o, axis=0) / tl.where(total > 0, total, 1.0)
    head = g * G + r // Q
    qi = r % Q
    tl.store(out_ptr + ((b * Q + qi) * heads + head) * D + d, out.to(out_ptr.dtype.element_ty), mask=in_d)


def launch(query, key, value, last, foreign, gate, query_pos, key_pos, window, out, o_part, lse_part, *,
           splits: int, split_len: int, scale: float, block_n: int) -> None:
    """Run both kernels (shapes and buffers prepared by
    :func:`cyb.kernels.row_attention.row_attention`)."""
    n, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    block_d = max(16, triton.next_power_of_2(dim))
    block_m = max(16, triton.next_power_of_2(group * q_len))
    has_gate = gate is not None
    foreign_arg = foreign if has_gate else last
    gate_arg = gate if has_gate else last
    # 0: no window, 1: a window in columns, 2: in positions (query_pos and key_pos)
    mode = 0 if window is None else (1 if key_pos is None else 2)
    qpos_arg = query_pos if mode == 2 else last
    kpos_arg = key_pos if mode == 2 else last
    _partial_kernel[(n * kv_heads, splits)](
        query, key, value, last, foreign_arg, gate_arg, qpos_arg, kpos_arg, o_part, lse_part,
        *query.stride(), *key.stride(), *value.stride(), *last.stride(),
        foreign.stride(0) if has_gate else 0, *qpos_arg.stride(), kpos_arg.stride(0),
        kv_heads, splits, split_len, split_len // block_n, scale * LOG2E, 0 if window is None else int(window),
        G=group, Q=q_len, D=dim, HAS_GATE=has_gate, WINDOW=mode, DYNAMIC_LOOP=not interpreting(),
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32", BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    _combine_kernel[(n * kv_heads, group * q_len)](
        o_part, lse_part, out, kv_heads, splits, heads,
        G=group, Q=q_len, D=dim, BLOCK_S=max(2, triton.next_power_of_2(splits)), BLOCK_D=block_d,
        num_warps=1,
    )
