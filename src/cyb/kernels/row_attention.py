"""Attention that reads each row's own columns, from a cache of rows or a pool of blocks.

A step of the engine (:mod:`cyb.engine`) has ``n`` rows of a cache, each at its own length.
Attention through a mask reads every row up to one limit (the longest row, rounded up);
:func:`row_attention` reads each row only up to the last column its queries see, so a step
costs the columns the rows hold, not ``n`` times the longest.  The columns are cut into splits
that run side by side (so that a few long rows still fill the GPU) and merged by their
log-sum-exps; the queries are cut into tiles (a decoding step's few queries are one tile, a
prefill chunk's many are several), each tile holding all query heads of a key head so that
they share every load of keys and values.

The rule is the engine's: the query at a row's column ``c`` sees columns ``0 .. c`` of that row,
given as ``last [n, Q]`` (``-1``: none, the output is zero: a row that is not decoding, or the
padding of a prefill chunk).  Gated pauses add a head's gate to the logits of the columns marked
``foreign`` (other tokens' pauses); with ``foreign_below`` (a column per query: the first of its
own token) only to those below it, so that queries of several tokens share one row of marks.  A sliding window of ``w`` cuts what a query sees to the keys
less than ``w`` behind it: in columns (``last - column < w``), or in positions, each query's and
each column's own (``query_pos - key_pos[column] < w``).  No mask and no logit softcap.

Where the columns live:

* a cache of rows (``block_table=None``): ``key``/``value [>= n, kv_heads, W, D]``, row ``i``'s
  column ``c`` at ``key[i, :, c]``;
* a pool of blocks (``block_table [>= n, B]``, int32 or int64): ``key``/``value [num_blocks,
  kv_heads, block_size, D]`` with ``block_size`` a power of two from 16 to 256, row ``i``'s
  logical column ``c`` at ``key[block_table[i, c // block_size], :, c % block_size]``.  Rows may
  share blocks.  ``foreign`` and ``key_pos`` stay logical (``[>= n, >= B * block_size]``).
  Table entries of blocks that hold no column the row's queries see are never read (past its
  last column, and before every query's window where the window counts columns).

Either way, any strides.  Shapes decide everything else (tiles, splits, buffers): no host syncs
and no allocation that depends on values, so a call can be captured in a CUDA graph.

Two entries:

* :func:`row_attention`: ``query [n, heads, Q, D]``, ``last [n, Q]``; every row has ``Q``
  queries (a decoding step: ``Q`` = 1 or M; a prefill chunk: ``Q`` up to a few thousand, rows
  padded with ``last = -1``).  Returns ``[n, Q, heads, D]``.
* :func:`row_attention_varlen`: the queries of all rows flattened, ``query [T, heads, D]`` and
  ``last [T]``, row ``i``'s at tokens ``query_start[i] .. query_start[i + 1] - 1``
  (``query_start [n + 1]`` integer, ``query_start[0] = 0``, nondecreasing, ``query_start[n] <= T``;
  not checked, as that would read the device).  Tokens past ``query_start[n]`` are padding and
  return zeros; ``query_pos`` is ``[T]``.  A step that mixes decoding rows (one query each) and
  prefill chunks (many) runs as one call.  ``max_queries`` (optional, an int fixed for a
  captured graph) bounds the queries of any row, and picks smaller tiles for steps of short rows;
  a row with more queries is still right.  Returns ``[T, heads, D]``.

:func:`row_attention_reference` and :func:`row_attention_varlen_reference` are the same
computations in float64 with plain tensor ops (the tests' reference).  The fast entries run the
Triton kernels of :mod:`cyb.kernels.triton_row_attention` (CUDA; CPU under
``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

#: columns per tile of the kernel
BLOCK_N = 64
#: the most query rows (query heads of a key head x queries) in one tile of the kernel
MAX_TILE_ROWS = 128
#: the splits of a step aim at this many programs per streaming multiprocessor
PROGRAMS_PER_SM = 2
#: the block sizes a pool may have (key.shape[2] with a block_table)
BLOCK_SIZES = (16, 32, 64, 128, 256)


def _check_cache(n: int, heads: int, dim: int, key, value, foreign, gate, window, query_pos, key_pos,
                 block_table) -> int:
    """Check what a call reads besides its queries; the logical columns per row."""
    if key.dim() != 4 or key.shape[3] != dim or value.shape != key.shape:
        raise ValueError(f"key and value must be [rows or blocks, kv_heads, columns, {dim}] alike, got "
                         f"{tuple(key.shape)} and {tuple(value.shape)} for queries of head dim {dim}")
    if heads % key.shape[1]:
        raise ValueError(f"{heads} query heads do not share {key.shape[1]} key heads evenly")
    if block_table is None:
        if key.shape[0] < n:
            raise ValueError(f"key and value must hold >= {n} rows, got {key.shape[0]}")
        columns = key.shape[2]
    else:
        if (block_table.dim() != 2 or block_table.shape[0] < n
                or block_table.dtype not in (torch.int32, torch.int64)):
            raise ValueError(f"block_table must be [>= {n}, B] int32 or int64, got {tuple(block_table.shape)} "
                             f"{block_table.dtype}")
        if key.shape[2] not in BLOCK_SIZES:
            raise ValueError(f"block_size (key.shape[2] with a block_table) must be a power of two from 16 to "
                             f"256, got {key.shape[2]}")
        columns = block_table.shape[1] * key.shape[2]
    if (foreign is None) != (gate is None):
        raise ValueError("foreign and gate go together (gated pauses) or not at all")
    if gate is not None and (tuple(gate.shape) != (heads,) or foreign.dim() != 2 or foreign.shape[0] < n
                             or foreign.shape[1] < columns):
        raise ValueError(f"gate must be [{heads}] and foreign [>= {n}, >= {columns}], got {tuple(gate.shape)} "
                         f"and {tuple(foreign.shape)}")
    if (query_pos is None) != (key_pos is None) or (query_pos is not None and window is None):
        raise ValueError("query_pos and key_pos go together, and with a window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be an integer >= 1 or None, got {window!r}")
    if key_pos is not None and (key_pos.dim() != 2 or key_pos.shape[0] < n or key_pos.shape[1] < columns):
        raise ValueError(f"key_pos must be [>= {n}, >= {columns}], got {tuple(key_pos.shape)}")
    return columns


def _check_below(foreign_below, foreign, last) -> None:
    if foreign_below is None:
        return
    if foreign is None:
        raise ValueError("foreign_below goes with foreign (gated pauses)")
    if foreign_below.shape != last.shape or foreign_below.dtype.is_floating_point:
        raise ValueError(f"foreign_below must be integer and shaped as last {tuple(last.shape)}, got "
                         f"{tuple(foreign_below.shape)} {foreign_below.dtype}")


def _check(query, key, value, last, foreign, gate, window, query_pos, key_pos, block_table,
           foreign_below=None) -> int:
    if query.dim() != 4:
        raise ValueError(f"query must be [n, heads, Q, D], got {tuple(query.shape)}")
    n, heads, q_len, dim = query.shape
    columns = _check_cache(n, heads, dim, key, value, foreign, gate, window, query_pos, key_pos, block_table)
    if tuple(last.shape) != (n, q_len):
        raise ValueError(f"last must be [{n}, {q_len}], got {tuple(last.shape)}")
    _check_below(foreign_below, foreign, last)
    if query_pos is not None and tuple(query_pos.shape) != (n, q_len):
        raise ValueError(f"query_pos must be [{n}, {q_len}], got {tuple(query_pos.shape)}")
    return columns


def _check_varlen(query, key, value, last, query_start, foreign, gate, window, query_pos, key_pos,
                  block_table, foreign_below=None) -> int:
    if query.dim() != 3:
        raise ValueError(f"query must be [T, heads, D], got {tuple(query.shape)}")
    if query_start.dim() != 1 or query_start.shape[0] < 1 or query_start.dtype.is_floating_point:
        raise ValueError(f"query_start must be [n + 1] integer, got {tuple(query_start.shape)} {query_start.dtype}")
    tokens, heads, dim = query.shape
    n = query_start.shape[0] - 1
    columns = _check_cache(n, heads, dim, key, value, foreign, gate, window, query_pos, key_pos, block_table)
    if tuple(last.shape) != (tokens,):
        raise ValueError(f"last must be [{tokens}], got {tuple(last.shape)}")
    _check_below(foreign_below, foreign, last)
    if query_pos is not None and tuple(query_pos.shape) != (tokens,):
        raise ValueError(f"query_pos must be [{tokens}], got {tuple(query_pos.shape)}")
    return columns


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: torch.device) -> int:
    # (off CUDA: the interpreter, where every program costs; the kernel tests split on their own)
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def split_plan(rows: int, kv_heads: int, columns: int, device: torch.device) -> tuple[int, int]:
    """``(splits, columns per split)`` for ``rows`` query tiles per key head over ``columns``
    columns: enough splits that every streaming multiprocessor gets :data:`PROGRAMS_PER_SM`
    programs, each split a whole number of tiles."""
    tiles = max(1, math.ceil(columns / BLOCK_N))
    splits = max(1, min(tiles, math.ceil(PROGRAMS_PER_SM * _multiprocessors(device) / max(1, rows * kv_heads))))
    per_split = math.ceil(tiles / splits) * BLOCK_N
    return math.ceil(columns / per_split), per_split


def query_tile(group: int, queries: int) -> int:
    """Queries of one row per tile, for ``group`` query heads per key head and rows of up to
    ``queries`` queries: all of them where ``group * queries`` fits :data:`MAX_TILE_ROWS`."""
    return max(1, min(queries, MAX_TILE_ROWS // group))


class Plan(NamedTuple):
    """How a call is cut: queries per tile, tiles (per row, or per key head for varlen), splits
    of the columns and columns per split."""

    q_tile: int
    q_tiles: int
    splits: int
    split_len: int


def plan(rows: int, group: int, kv_heads: int, columns: int, device: torch.device, *, queries: int,
         tokens: int | None = None) -> Plan:
    """The :class:`Plan` of a call with ``rows`` rows of up to ``queries`` queries each; with
    ``tokens`` (varlen), the queries of all rows flattened into that many tokens."""
    # (varlen: a power of two, so that steps whose longest row differs share a compiled kernel)
    q_tile = query_tile(group, max(1, queries) if tokens is None else 1 << (max(1, queries) - 1).bit_length())
    if tokens is None:
        q_tiles = math.ceil(queries / q_tile)
        splits, split_len = split_plan(rows * q_tiles, kv_heads, columns, device)
    else:  # enough tiles for any split of the tokens into rows, and the padding past them
        q_tiles = math.ceil(tokens / q_tile) + rows + 1
        splits, split_len = split_plan(q_tiles, kv_heads, columns, device)
    return Plan(q_tile, q_tiles, splits, split_len)


def _prepared(foreign, gate):
    if foreign is not None:
        foreign = foreign.view(torch.uint8) if foreign.dtype == torch.bool else foreign
        gate = gate.float().contiguous()
    return foreign, gate


def row_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, last: torch.Tensor, *,
                  scale: float | None = None, foreign: torch.Tensor | None = None,
                  gate: torch.Tensor | None = None, window: int | None = None,
                  query_pos: torch.Tensor | None = None, key_pos: torch.Tensor | None = None,
                  block_table: torch.Tensor | None = None,
                  foreign_below: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of ``n`` rows, each over its own columns (see the module docstring).

    Args:
        query: ``[n, heads, Q, D]`` (any strides).
        key, value: ``[>= n, kv_heads, W, D]`` (a cache of rows), or with ``block_table`` a pool
            ``[num_blocks, kv_heads, block_size, D]``; any strides.
        last: ``[n, Q]`` integer, the last (logical) column each query sees (``-1``: none).
        scale: the logits' scale (None: ``D ** -0.5``).
        foreign: gated pauses: ``[>= n, >= W]`` bool (``W``: the logical columns), the columns
            whose logits get the gate.
        gate: gated pauses: ``[heads]``, each query head's gate (added, not scaled).
        foreign_below: with ``foreign``, ``[n, Q]`` integer: a query's foreign columns are only
            those below this column (its own token's first); None: all of them.
        window: a sliding window (None: none), in columns, or in positions when ``query_pos``
            (``[n, Q]`` integer, each query's position) and ``key_pos`` (``[>= n, >= W]``
            integer, each column's position) are given.
        block_table: ``[>= n, B]`` int32 or int64: row ``i``'s ``j``-th block of columns in the
            pool (``W = B * block_size``).

    Returns:
        ``[n, Q, heads, D]`` in the query's dtype (the layout attention functions of
        ``transformers`` return).
    """
    from . import triton_row_attention as kernels

    columns = _check(query, key, value, last, foreign, gate, window, query_pos, key_pos, block_table, foreign_below)
    n, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    out = torch.empty((n, q_len, heads, dim), dtype=query.dtype, device=query.device)
    if n == 0 or q_len == 0:
        return out
    p = plan(n, heads // kv_heads, kv_heads, columns, query.device, queries=q_len)
    foreign, gate = _prepared(foreign, gate)
    kernels.launch(query, key, value, last, foreign, gate, query_pos, key_pos, block_table, None, window, out,
                   rows=n, q_len=q_len, q_tile=p.q_tile, q_tiles=p.q_tiles, splits=p.splits,
                   split_len=p.split_len, scale=dim ** -0.5 if scale is None else float(scale), block_n=BLOCK_N,
                   foreign_below=foreign_below)
    return out


def row_attention_varlen(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, last: torch.Tensor,
                         query_start: torch.Tensor, *, scale: float | None = None,
                         foreign: torch.Tensor | None = None, gate: torch.Tensor | None = None,
                         window: int | None = None, query_pos: torch.Tensor | None = None,
                         key_pos: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
                         max_queries: int | None = None, foreign_below: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`row_attention` with the queries of all rows flattened (see the module docstring).

    Args:
        query: ``[T, heads, D]`` (any strides); row ``i``'s queries at tokens
            ``query_start[i] .. query_start[i + 1] - 1``, the tokens past ``query_start[n]``
            padding.
        last: ``[T]`` integer, the last column each token's query sees (``-1``: none).
        query_start: ``[n + 1]`` integer (``query_start[0] = 0``, nondecreasing, at most ``T``).
        query_pos: ``[T]`` with a window in positions.
        foreign_below: ``[T]``, as :func:`row_attention`'s per query.
        max_queries: the most queries of any row (None: ``T``); it only picks the tile size.
        key, value, scale, foreign, gate, window, key_pos, block_table: as :func:`row_attention`
            (``n`` rows).

    Returns:
        ``[T, heads, D]`` in the query's dtype (zeros for padding tokens).
    """
    from . import triton_row_attention as kernels

    columns = _check_varlen(query, key, value, last, query_start, foreign, gate, window, query_pos, key_pos,
                            block_table, foreign_below)
    if max_queries is not None and (isinstance(max_queries, bool) or not isinstance(max_queries, int)
                                    or max_queries < 1):
        raise ValueError(f"max_queries must be an integer >= 1 or None, got {max_queries!r}")
    tokens, heads, dim = query.shape
    n = query_start.shape[0] - 1
    kv_heads = key.shape[1]
    out = torch.empty((tokens, heads, dim), dtype=query.dtype, device=query.device)
    if tokens == 0:
        return out
    queries = tokens if max_queries is None else min(tokens, max_queries)
    p = plan(n, heads // kv_heads, kv_heads, columns, query.device, queries=queries, tokens=tokens)
    foreign, gate = _prepared(foreign, gate)
    kernels.launch(query, key, value, last, foreign, gate, query_pos, key_pos, block_table, query_start, window,
                   out, rows=n, q_len=0, q_tile=p.q_tile, q_tiles=p.q_tiles, splits=p.splits,
                   split_len=p.split_len, scale=dim ** -0.5 if scale is None else float(scale), block_n=BLOCK_N,
                   foreign_below=foreign_below)
    return out


def logical_columns(key: torch.Tensor, value: torch.Tensor, n: int, block_table: torch.Tensor | None):
    """Rows ``0 .. n-1``'s keys and values as ``[n, kv_heads, W, D]`` (a copy from a pool: table
    entries outside the pool read block 0, their columns never seen)."""
    if block_table is None:
        return key[:n], value[:n]
    blocks, kv_heads, size, dim = key.shape
    idx = block_table[:n].long().clamp(0, blocks - 1)

    def gather(pool):
        return pool[idx].transpose(1, 2).reshape(n, kv_heads, idx.shape[1] * size, dim)

    return gather(key), gather(value)


def _reference(query, key, value, last, scale, foreign, gate, window, query_pos, key_pos, foreign_below=None):
    """The float64 computation over logical columns (``key``/``value [n, kv_heads, W, D]``)."""
    n, heads, q_len, dim = query.shape
    kv_heads, columns = key.shape[1], key.shape[2]
    group = heads // kv_heads
    col = torch.arange(columns, device=query.device).view(1, 1, 1, columns)
    seen = col <= last.view(n, 1, q_len, 1).long()
    if window is not None:
        if query_pos is None:
            seen = seen & ((last.view(n, 1, q_len, 1) - col) < window)
        else:
            seen = seen & ((query_pos.view(n, 1, q_len, 1) - key_pos[:n, :columns].view(n, 1, 1, columns)) < window)
    # columns no query of the row sees may hold anything (NaN included): never multiplied
    read = seen.any(dim=2).view(n, 1, columns, 1)
    q = query.double()
    k = torch.where(read, key.double(), 0.0).repeat_interleave(group, dim=1)
    v = torch.where(read, value.double(), 0.0).repeat_interleave(group, dim=1)
    s = q @ k.transpose(-1, -2) * (dim ** -0.5 if scale is None else scale)  # [n, H, Q, W]
    if gate is not None:
        gated = foreign[:n, :columns].bool().view(n, 1, 1, columns)
        if foreign_below is not None:
            gated = gated & (col < foreign_below.view(n, 1, q_len, 1).long())
        s = s + torch.where(gated, gate.double().view(1, heads, 1, 1), 0.0)
    s = s.masked_fill(~seen, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a query that sees nothing: zero
    return (p @ v).transpose(1, 2)


def row_attention_reference(query, key, value, last, *, scale=None, foreign=None, gate=None, window=None,
                            query_pos=None, key_pos=None, block_table=None, foreign_below=None) -> torch.Tensor:
    """:func:`row_attention` in float64 with plain tensor ops (same arguments and result, the
    result in float64)."""
    _check(query, key, value, last, foreign, gate, window, query_pos, key_pos, block_table, foreign_below)
    k, v = logical_columns(key, value, query.shape[0], block_table)
    return _reference(query, k, v, last, scale, foreign, gate, window, query_pos, key_pos, foreign_below)


def row_attention_varlen_reference(query, key, value, last, query_start, *, scale=None, foreign=None, gate=None,
                                   window=None, query_pos=None, key_pos=None, block_table=None,
                                   max_queries=None, foreign_below=None) -> torch.Tensor:
    """:func:`row_attention_varlen` in float64, row by row (it reads ``query_start`` on the host)."""
    _check_varlen(query, key, value, last, query_start, foreign, gate, window, query_pos, key_pos, block_table,
                  foreign_below)
    tokens, heads, dim = query.shape
    n = query_start.shape[0] - 1
    k, v = logical_columns(key, value, n, block_table)
    out = torch.zeros((tokens, heads, dim), dtype=torch.float64, device=query.device)
    bounds = query_start.tolist()
    for i in range(n):
        a, b = bounds[i], bounds[i + 1]
        if b == a:
            continue
        row = slice(i, i + 1)
        out[a:b] = _reference(query[a:b].transpose(0, 1).unsqueeze(0), k[row], v[row], last[a:b].unsqueeze(0),
                              scale, None if foreign is None else foreign[row], gate, window,
                              None if query_pos is None else query_pos[a:b].unsqueeze(0),
                              None if key_pos is None else key_pos[row],
                              None if foreign_below is None else foreign_below[a:b].unsqueeze(0))[0]
    return out


__all__ = ["BLOCK_N", "BLOCK_SIZES", "MAX_TILE_ROWS", "Plan", "logical_columns", "plan", "query_tile",
           "row_attention", "row_attention_reference", "row_attention_varlen", "row_attention_varlen_reference",
           "split_plan"]
