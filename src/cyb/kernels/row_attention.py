"""Decoding attention that reads each row's own columns.

A decoding step of the engine (:mod:`cyb.engine`) has ``n`` rows of a cache, each at its own
length.  Attention through a mask reads every row up to one limit (the longest row, rounded up);
:func:`row_attention` reads each row only up to the last column its queries see, so a step
costs the columns the rows hold, not ``n`` times the longest.  The columns are cut into splits
that run side by side (so that a few long rows still fill the GPU) and merged by their
log-sum-exps.

The rule is the engine's: the query at a row's column ``c`` sees columns ``0 .. c`` of that row,
given as ``last [n, Q]`` (``-1``: none, the output is zero).  Gated pauses add a head's gate to
the logits of the columns marked ``foreign`` (other tokens' pauses).  A sliding window of ``w``
cuts what a query sees to the keys less than ``w`` behind it: in columns (``last - column < w``),
or in positions, each query's and each column's own (``query_pos - key_pos[column] < w``).  No
mask and no logit softcap.

:func:`row_attention_reference` is the same computation in float64 with plain tensor ops (the
tests' reference).  :func:`row_attention` runs the Triton kernels of
:mod:`cyb.kernels.triton_row_attention` (CUDA; CPU under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import functools
import math

import torch

#: columns per tile of the kernel
BLOCK_N = 64
#: the splits of a step aim at this many programs per streaming multiprocessor
PROGRAMS_PER_SM = 2


def _check(query, key, value, last, foreign, gate, window=None, query_pos=None, key_pos=None) -> None:
    n, heads, q_len, dim = query.shape
    if key.dim() != 4 or key.shape[0] < n or key.shape[3] != dim or value.shape != key.shape:
        raise ValueError(f"key and value must be [>= n, kv_heads, W, {dim}] alike, got "
                         f"{tuple(key.shape)} and {tuple(value.shape)} for a query of {tuple(query.shape)}")
    if heads % key.shape[1]:
        raise ValueError(f"{heads} query heads do not share {key.shape[1]} key heads evenly")
    if tuple(last.shape) != (n, q_len):
        raise ValueError(f"last must be [{n}, {q_len}], got {tuple(last.shape)}")
    if (foreign is None) != (gate is None):
        raise ValueError("foreign and gate go together (gated pauses) or not at all")
    if gate is not None and (tuple(gate.shape) != (heads,) or foreign.shape[0] < n
                             or foreign.shape[1] < key.shape[2]):
        raise ValueError(f"gate must be [{heads}] and foreign [n, >= W], got {tuple(gate.shape)} "
                         f"and {tuple(foreign.shape)}")
    if (query_pos is None) != (key_pos is None) or (query_pos is not None and window is None):
        raise ValueError("query_pos and key_pos go together, and with a window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be an integer >= 1 or None, got {window!r}")
    if query_pos is not None and (tuple(query_pos.shape) != (n, q_len) or key_pos.shape[0] < n
                                  or key_pos.shape[1] < key.shape[2]):
        raise ValueError(f"query_pos must be [{n}, {q_len}] and key_pos [n, >= W], got {tuple(query_pos.shape)} "
                         f"and {tuple(key_pos.shape)}")


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: torch.device) -> int:
    # (off CUDA: the interpreter, where every program costs; the kernel tests split on their own)
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def split_plan(rows: int, kv_heads: int, columns: int, device: torch.device) -> tuple[int, int]:
    """``(splits, columns per split)`` for a step of ``rows`` rows over ``columns`` columns:
    enough splits that every streaming multiprocessor gets :data:`PROGRAMS_PER_SM` programs,
    each split a whole number of tiles."""
    tiles = max(1, math.ceil(columns / BLOCK_N))
    splits = max(1, min(tiles, math.ceil(PROGRAMS_PER_SM * _multiprocessors(device) / max(1, rows * kv_heads))))
    per_split = math.ceil(tiles / splits) * BLOCK_N
    return math.ceil(columns / per_split), per_split


def row_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, last: torch.Tensor, *,
                  scale: float | None = None, foreign: torch.Tensor | None = None,
                  gate: torch.Tensor | None = None, window: int | None = None,
                  query_pos: torch.Tensor | None = None, key_pos: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of ``n`` rows, each over its own columns (see the module docstring).

    Args:
        query: ``[n, heads, Q, D]`` (any strides).
        key, value: ``[>= n, kv_heads, W, D]`` (any strides; rows ``0 .. n-1`` are read, each
            only up to its last visible column).
        last: ``[n, Q]`` integer, the last column each query sees (``-1``: none).
        scale: the logits' scale (None: ``D ** -0.5``).
        foreign: gated pauses: ``[>= n, >= W]`` bool, the columns whose logits get the gate.
        gate: gated pauses: ``[heads]``, each query head's gate (added, not scaled).
        window: a sliding window (None: none), in columns, or in positions when ``query_pos``
            (``[n, Q]`` integer, each query's position) and ``key_pos`` (``[>= n, >= W]``
            integer, each column's position) are given.

    Returns:
        ``[n, Q, heads, D]`` in the query's dtype (the layout attention functions of
        ``transformers`` return).
    """
    from . import triton_row_attention as kernels

    _check(query, key, value, last, foreign, gate, window, query_pos, key_pos)
    n, heads, q_len, dim = query.shape
    kv_heads, columns = key.shape[1], key.shape[2]
    out = torch.empty((n, q_len, heads, dim), dtype=query.dtype, device=query.device)
    if n == 0:
        return out
    splits, per_split = split_plan(n, kv_heads, columns, query.device)
    tile = (heads // kv_heads) * q_len
    o_part = torch.empty((n * kv_heads, splits, tile, dim), dtype=torch.float32, device=query.device)
    lse_part = torch.empty((n * kv_heads, splits, tile), dtype=torch.float32, device=query.device)
    if foreign is not None:
        foreign = foreign.view(torch.uint8) if foreign.dtype == torch.bool else foreign
        gate = gate.float().contiguous()
    kernels.launch(query, key, value, last, foreign, gate, query_pos, key_pos, window, out, o_part, lse_part,
                   splits=splits,
                   split_len=per_split, scale=dim ** -0.5 if scale is None else float(scale), block_n=BLOCK_N)
    return out


def row_attention_reference(query, key, value, last, *, scale=None, foreign=None, gate=None, window=None,
                            query_pos=None, key_pos=None) -> torch.Tensor:
    """:func:`row_attention` in float64 with plain tensor ops (same arguments and result, the
    result in float64)."""
    _check(query, key, value, last, foreign, gate, window, query_pos, key_pos)
    n, heads, q_len, dim = query.shape
    kv_heads, columns = key.shape[1], key.shape[2]
    group = heads // kv_heads
    q = query.double()
    k = key[:n].double().repeat_interleave(group, dim=1)
    v = value[:n].double().repeat_interleave(group, dim=1)
    s = q @ k.transpose(-1, -2) * (dim ** -0.5 if scale is None else scale)  # [n, H, Q, W]
    if gate is not None:
        s = s + torch.where(foreign[:n, :columns].bool().view(n, 1, 1, columns),
                            gate.double().view(1, heads, 1, 1), 0.0)
    col = torch.arange(columns, device=query.device).view(1, 1, 1, columns)
    seen = col <= last.view(n, 1, q_len, 1)
    if window is not None:
        if query_pos is None:
            seen = seen & ((last.view(n, 1, q_len, 1) - col) < window)
        else:
            seen = seen & ((query_pos.view(n, 1, q_len, 1) - key_pos[:n, :columns].view(n, 1, 1, columns)) < window)
    s = s.masked_fill(~seen, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a query that sees nothing: zero
    return (p @ v).transpose(1, 2)


__all__ = ["BLOCK_N", "row_attention", "row_attention_reference", "split_plan"]
