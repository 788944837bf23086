"""Triton kernels of :func:`cyb.kernels.row_attention.row_attention` and
:func:`~cyb.kernels.row_attention.row_attention_varlen` (split-column attention that reads each
row's own columns, from a cache of rows or from a pool of blocks through a block table).

* :func:`_partial_kernel`, one program per (query tile, key head, split of the columns): the
  queries of a tile (``G`` query heads of the key head x up to ``QT`` of one row's queries: one
  tile of ``G * QT`` rows, so that the group's heads share each load of keys and values) against
  the split's columns, up to the last column any of them sees.  Online softmax in float32 (base
  2; float32 inputs multiply in full float32, not tf32).  With one split it writes the output
  itself; with several, each split's normalised output and its log-sum-exp (``-inf`` where the
  split has no visible column), per query token and head.
* :func:`_combine_kernel`, one program per (query token, head): merges the splits by their
  log-sum-exps and writes the output.

Paged: logical column ``c`` of row ``b`` is slot ``c % BLOCK_SIZE`` of block
``table[b, c // BLOCK_SIZE]`` of the pool.  Tiles start at multiples of ``BLOCK_N``, so where
``BLOCK_N <= BLOCK_SIZE`` a tile lies in one block (one table entry); otherwise each column looks
its block up.  Only columns from the lowest visible one to the highest are loaded, so table
entries outside them are never read.

Varlen: the queries of all rows are flattened (``[T, H, D]``), row ``b``'s at tokens
``query_start[b] .. query_start[b + 1] - 1``.  Each row's queries are cut into tiles of ``QT``;
program ``j`` finds its row and tile from ``query_start`` itself (:func:`_varlen_tile`), so the
grid (``cdiv(T, QT) + n + 1`` tiles, enough for any split of ``T`` into ``n`` rows) follows from
the shapes only.  The tokens past ``query_start[n]`` form one more row that sees nothing.

A mixed step's shapes change from step to step (its rows, its tokens, how the columns are
split), and a kernel compiled inside a timed step stalls every row: the sizes that vary are not
specialised on (``do_not_specialize``), the rows ``query_start`` holds are scanned in blocks of
at least :data:`MIN_VARLEN_ROWS`, the combine kernel of a varlen call is as wide as the most
splits its columns allow, and varlen tiles hold a power of two of queries
(:func:`cyb.kernels.row_attention.plan`), so that two compiled variants of the partial kernel
(one split or several) serve every step.

They run on CUDA tensors, and on CPU tensors when ``TRITON_INTERPRET=1`` was set before triton
was first imported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .chunk_ops import interpreting

LOG2E = 1.4426950408889634
#: the fewest rows of ``query_start`` a varlen program scans at once (``BLOCK_R``): one compiled
#: variant for every step of up to 511 rows (a scan of 512 integers costs nothing beside a tile)
MIN_VARLEN_ROWS = 512
#: sizes of a call that change from step to step: never compiled into the kernels
_VARYING = ("n", "tokens", "q_tiles", "splits")
#: warps of a program of the partial kernel with tiles of at most 64 query rows (8 above)
NUM_WARPS = 4
#: software-pipelining stages of a program of the partial kernel
NUM_STAGES = 3


@triton.jit
def _tile(q, k_base, v_base, table_row, foreign_row, gate, below, last, qpos, kpos_row, window, m_i, l_i, acc, c0,
          lo, end, sk_b, sk_c, sk_d, sv_b, sv_c, sv_d, st_c, sf_c, skp_c, d, in_d, qk_scale, HAS_GATE: tl.constexpr,
          HAS_BELOW: tl.constexpr, WINDOW: tl.constexpr, PAGED: tl.constexpr, BLOCK_SIZE: tl.constexpr,
          BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """The online softmax over the columns ``c0 .. c0 + BLOCK_N - 1`` (those in ``lo .. end - 1``)."""
    cols = c0 + tl.arange(0, BLOCK_N)
    in_cols = (cols < end) & (cols >= lo)
    if PAGED:
        if BLOCK_N <= BLOCK_SIZE:  # one block (it holds a column in lo .. end - 1: a valid entry)
            blk = tl.load(table_row + (c0 // BLOCK_SIZE) * st_c).to(tl.int64)
        else:
            blk = tl.load(table_row + (cols // BLOCK_SIZE) * st_c, mask=in_cols, other=0).to(tl.int64)
        within = cols % BLOCK_SIZE
        k_rows = blk * sk_b + within * sk_c
        v_rows = blk * sv_b + within * sv_c
    else:
        k_rows = cols * sk_c
        v_rows = cols * sv_c
    k = tl.load(k_base + k_rows[:, None] + d[None, :] * sk_d, mask=in_cols[:, None] & in_d[None, :], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    if HAS_GATE:
        f = tl.load(foreign_row + cols * sf_c, mask=in_cols, other=0)
        gated = f[None, :] != 0
        if HAS_BELOW:  # each query's own: the pauses of tokens before its own
            gated = gated & (cols[None, :] < below[:, None])
        s += tl.where(gated, gate[:, None], 0.0)
    seen = (cols[None, :] <= last[:, None]) & in_cols[None, :]
    if WINDOW == 1:  # a sliding window in columns
        seen = seen & ((last[:, None] - cols[None, :]) < window)
    if WINDOW == 2:  # a sliding window in positions: each column's own
        kp = tl.load(kpos_row + cols * skp_c, mask=in_cols, other=0)
        seen = seen & ((qpos[:, None] - kp[None, :]) < window)
    s = tl.where(seen, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that see nothing yet
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(v_base + v_rows[:, None] + d[None, :] * sv_d, mask=in_cols[:, None] & in_d[None, :], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _varlen_tile(qstart_ptr, n, tokens, j, QT: tl.constexpr, BLOCK_R: tl.constexpr):
    """Tile ``j`` of a flattened step: ``(row, its first token, the tile's first query in the row,
    the row's queries)``.  Row ``n`` is the padding past ``query_start[n]``; past the last tile,
    a row above ``n`` with no queries."""
    i = tl.arange(0, BLOCK_R)
    lo = tl.load(qstart_ptr + i, mask=i <= n, other=0).to(tl.int32)
    hi = tl.load(qstart_ptr + i + 1, mask=i < n, other=tokens).to(tl.int32)
    lens = tl.where(i <= n, hi - lo, 0)
    tiles = (lens + QT - 1) // QT
    ends = tl.cumsum(tiles, 0)
    row = tl.sum((ends <= j).to(tl.int32), 0)  # the first row whose tiles end past j
    pick = i == row
    first_tile = tl.sum(tl.where(pick, ends - tiles, 0), 0)
    first = tl.sum(tl.where(pick, lo, 0), 0)
    count = tl.sum(tl.where(pick, lens, 0), 0)
    return row, first, (j - first_tile) * QT, count


@triton.jit(do_not_specialize=_VARYING)
def _partial_kernel(
    q_ptr, k_ptr, v_ptr, last_ptr, foreign_ptr, gate_ptr, below_ptr, qpos_ptr, kpos_ptr, table_ptr, qstart_ptr,
    out_ptr, o_ptr, lse_ptr,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_c, sk_d, sv_b, sv_h, sv_c, sv_d, sl_b, sl_t, sf_b, sf_c, sb_b, sb_t,
    sp_b, sp_t, skp_b, skp_c, st_b, st_c,
    n, tokens, q_len, heads, kv_heads, q_tiles, splits, split_len, tiles, qk_scale, window,
    G: tl.constexpr, QT: tl.constexpr, D: tl.constexpr, HAS_GATE: tl.constexpr, HAS_BELOW: tl.constexpr,
    WINDOW: tl.constexpr,
    PAGED: tl.constexpr, BLOCK_SIZE: tl.constexpr, VARLEN: tl.constexpr, DIRECT: tl.constexpr,
    DYNAMIC_LOOP: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    r = tl.arange(0, BLOCK_M)  # the tile's rows: head g * G + r // QT, query q0 + r % QT
    if VARLEN:  # pid = key head * q_tiles + tile of the flattened step
        g = pid // q_tiles
        b, first, q0, count = _varlen_tile(qstart_ptr, n, tokens, pid % q_tiles, QT, BLOCK_R)
    else:  # pid = (row * kv_heads + key head) * q_tiles + tile of the row's queries
        g = (pid // q_tiles) % kv_heads
        b = pid // (q_tiles * kv_heads)
        first = b * q_len
        q0 = (pid % q_tiles) * QT
        count = q_len
    b64 = b.to(tl.int64)
    qi = q0 + r % QT
    head = g * G + r // QT
    in_tile = (r < G * QT) & (qi < count)
    t = (first + qi).to(tl.int64)  # the query's token (the output's row)
    if VARLEN:
        q_row = t * sq_t
        l_row = t * sl_t
        f_row = t * sb_t
        p_row = t * sp_t
    else:
        q_row = b64 * sq_b + qi * sq_t
        l_row = b64 * sl_b + qi * sl_t
        f_row = b64 * sb_b + qi * sb_t
        p_row = b64 * sp_b + qi * sp_t
    d = tl.arange(0, BLOCK_D)
    in_d = d < D
    last = tl.load(last_ptr + l_row, mask=in_tile, other=-1)
    if VARLEN:
        last = tl.where(b < n, last, -1)  # the padding past query_start[n] sees nothing
    end = tl.minimum(tl.max(last, axis=0) + 1, (split + 1) * split_len)
    start = split * split_len
    lo = 0
    qpos = last
    if WINDOW == 1:  # no column below the lowest query's window is read
        lo = tl.maximum(tl.min(tl.where(in_tile & (last >= 0), last, end), axis=0) - window + 1, 0)
        start = tl.maximum(start, lo // BLOCK_N * BLOCK_N)
    if WINDOW == 2:
        qpos = tl.load(qpos_ptr + p_row, mask=in_tile, other=0)
    q = tl.load(q_ptr + q_row[:, None] + head[:, None] * sq_h + d[None, :] * sq_d,
                mask=in_tile[:, None] & in_d[None, :], other=0.0)
    gate = tl.zeros((BLOCK_M,), tl.float32)
    below = last
    if HAS_GATE:
        gate = tl.load(gate_ptr + head, mask=in_tile, other=0.0).to(tl.float32) * 1.4426950408889634
        if HAS_BELOW:
            below = tl.load(below_ptr + f_row, mask=in_tile, other=0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    k_base = k_ptr + g * sk_h
    v_base = v_ptr + g * sv_h
    if not PAGED:
        k_base += b64 * sk_b
        v_base += b64 * sv_b
    table_row = table_ptr + b64 * st_b
    foreign_row = foreign_ptr + b64 * sf_b
    kpos_row = kpos_ptr + b64 * skp_b
    if DYNAMIC_LOOP:  # to the tile's own end (pipelined); the interpreter needs the loop below
        for c0 in range(start, end, BLOCK_N):
            m_i, l_i, acc = _tile(q, k_base, v_base, table_row, foreign_row, gate, below, last, qpos, kpos_row,
                                  window, m_i, l_i, acc, c0, lo, end, sk_b, sk_c, sk_d, sv_b, sv_c, sv_d, st_c, sf_c,
                                  skp_c, d, in_d, qk_scale, HAS_GATE, HAS_BELOW, WINDOW, PAGED, BLOCK_SIZE, BLOCK_N,
                                  PRECISION)
    else:
        for i in range(0, tiles):  # (tiles outside the visible columns do nothing)
            c0 = split * split_len + i * BLOCK_N
            if (c0 < end) & (c0 + BLOCK_N > start):
                m_i, l_i, acc = _tile(q, k_base, v_base, table_row, foreign_row, gate, below, last, qpos,
                                      kpos_row, window, m_i, l_i, acc, c0, lo, end, sk_b, sk_c, sk_d, sv_b, sv_c, sv_d,
                                      st_c, sf_c, skp_c, d, in_d, qk_scale, HAS_GATE, HAS_BELOW, WINDOW, PAGED,
                                      BLOCK_SIZE, BLOCK_N, PRECISION)
    seen_any = l_i > 0
    out = acc / tl.where(seen_any, l_i, 1.0)[:, None]
    keep = in_tile[:, None] & in_d[None, :]
    if DIRECT:  # one split: the output itself
        tl.store(out_ptr + (t[:, None] * heads + head[:, None]) * D + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=keep)
    else:
        lse = tl.where(seen_any, m_i + tl.log2(tl.where(seen_any, l_i, 1.0)), float("-inf"))
        part = (split * tokens + t) * heads + head
        tl.store(o_ptr + part[:, None] * D + d[None, :], out, mask=keep)
        tl.store(lse_ptr + part, lse, mask=in_tile)


@triton.jit(do_not_specialize=("tokens", "splits"))
def _combine_kernel(o_ptr, lse_ptr, out_ptr, tokens, heads, splits, D: tl.constexpr, BLOCK_S: tl.constexpr,
                    BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)  # query token
    h = tl.program_id(1)  # head
    s = tl.arange(0, BLOCK_S)
    in_s = s < splits
    d = tl.arange(0, BLOCK_D)
    in_d = d < D
    part = (s * tokens + t) * heads + h
    lse = tl.load(lse_ptr + part, mask=in_s, other=float("-inf"))
    top = tl.max(lse, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    w = tl.where(in_s, tl.exp2(lse - top), 0.0)
    total = tl.sum(w, axis=0)
    o = tl.load(o_ptr + part[:, None] * D + d[None, :], mask=in_s[:, None] & in_d[None, :], other=0.0)
    out = tl.sum(w[:, None] * o, axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + (t * heads + h) * D + d, out.to(out_ptr.dtype.element_ty), mask=in_d)


def launch(query, key, value, last, foreign, gate, query_pos, key_pos, block_table, query_start, window, out, *,
           rows: int, q_len: int, q_tile: int, q_tiles: int, splits: int, split_len: int, scale: float,
           block_n: int, foreign_below=None) -> None:
    """Run the kernels (shapes checked and planned by :mod:`cyb.kernels.row_attention`).

    ``query`` is ``[n, H, Q, D]`` with ``last [n, Q]`` (``query_start`` None), or ``[T, H, D]``
    with ``last [T]`` and ``query_start [n + 1]``; ``out`` is contiguous, ``[n, Q, H, D]`` or
    ``[T, H, D]``; ``rows`` is ``n``; ``q_tiles`` the tiles per row (dense) or per key head
    (varlen); ``foreign`` a uint8 view or None, ``gate`` float32 or None, ``foreign_below``
    shaped as ``last`` or None."""
    varlen = query_start is not None
    heads, dim = query.shape[-2 if varlen else 1], query.shape[-1]
    tokens = out.shape[0] if varlen else rows * q_len
    kv_heads = key.shape[1]
    group = heads // kv_heads
    block_d = max(16, triton.next_power_of_2(dim))
    block_m = max(16, triton.next_power_of_2(group * q_tile))
    has_gate = gate is not None
    has_below = has_gate and foreign_below is not None
    paged = block_table is not None
    # 0: no window, 1: a window in columns, 2: in positions (query_pos and key_pos)
    mode = 0 if window is None else (1 if key_pos is None else 2)
    # (arguments a call leaves out point at ``last``: never read)
    foreign_arg = foreign if has_gate else last
    below_arg = foreign_below if has_below else last
    qpos_arg = query_pos if mode == 2 else last
    kpos_arg = key_pos if mode == 2 else last
    table_arg = block_table if paged else last
    if varlen:  # [T, H, D] and [T]: no row stride
        sq = (0, query.stride(1), query.stride(0), query.stride(2))  # (row, head, token, dim)
        sl = (0, last.stride(0))
        sb = (0, below_arg.stride(0))
        sp = (0, qpos_arg.stride(0))
    else:
        sq = query.stride()
        sl = last.stride()
        sb = below_arg.stride()
        sp = qpos_arg.stride() if mode == 2 else (0, 0)
    direct = splits == 1
    if direct:
        o_part = lse_part = out
    else:
        o_part = torch.empty((splits, tokens, heads, dim), dtype=torch.float32, device=query.device)
        lse_part = torch.empty((splits, tokens, heads), dtype=torch.float32, device=query.device)
    programs = (kv_heads * q_tiles) if varlen else (rows * kv_heads * q_tiles)
    _partial_kernel[(programs, splits)](
        query, key, value, last, foreign_arg, gate if has_gate else last, below_arg, qpos_arg, kpos_arg, table_arg,
        query_start if varlen else last, out, o_part, lse_part,
        *sq, *key.stride(), *value.stride(), *sl,
        *(foreign.stride() if has_gate else (0, 0)), *sb, *sp, *(key_pos.stride() if mode == 2 else (0, 0)),
        *(block_table.stride() if paged else (0, 0)),
        rows, tokens, q_len, heads, kv_heads, q_tiles, splits, split_len, split_len // block_n, scale * LOG2E,
        0 if window is None else int(window),
        G=group, QT=q_tile, D=dim, HAS_GATE=has_gate, HAS_BELOW=has_below, WINDOW=mode, PAGED=paged,
        BLOCK_SIZE=key.shape[2] if paged else 1, VARLEN=varlen, DIRECT=direct, DYNAMIC_LOOP=not interpreting(),
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32", BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=block_d, BLOCK_R=max(MIN_VARLEN_ROWS, triton.next_power_of_2(rows + 1)) if varlen else 2,
        num_warps=NUM_WARPS if block_m <= 64 else 2 * NUM_WARPS, num_stages=NUM_STAGES,
    )
    if not direct:
        # (varlen: as wide as the most splits, every column tile one, so one variant serves all)
        widest = triton.cdiv(block_table.shape[1] * key.shape[2] if paged else key.shape[2], block_n) if varlen else splits
        block_s = max(2, triton.next_power_of_2(widest))
        _combine_kernel[(tokens, heads)](
            o_part, lse_part, out, tokens, heads, splits,
            D=dim, BLOCK_S=block_s, BLOCK_D=block_d, num_warps=4 if varlen and block_s > 16 else 1,
        )
