"""Per-slot decoding state on the device, and how a step moves it on.

:class:`Rows` holds one entry per slot of everything a decoding step reads and writes: what
each row feeds next (token or pause, rotary position, cache column), where its current block
started, which step of it comes next, the index of the token it is deciding, its random stream,
its settings (mode, greedy or sampled, temperature, top-k, top-p) and what it has read out of
the block so far.  A step reads the state of rows ``0 .. n-1``, runs the model, reads out
(:mod:`cyb.engine.readout`) and writes the next state back in place (:meth:`Rows.advance`), so
that the next step needs nothing from the host.  The host changes a row only when it starts
(:meth:`Rows.start`) or leaves (:meth:`Rows.stop`).

A step feeds ``Q`` positions per row: ``Q = 1`` (a row feeds its real token, then a pause only
after a dk: adaptive mode's computation; in fixed mode a row keeps feeding pauses after its
answer until step ``M``), or ``Q = M`` (every row feeds its whole block; adaptive rows keep the
steps up to their stop step and the next block overwrites the rest).
"""

from __future__ import annotations

import math

import torch

from ..losses import expected_stop_step
from .layout import RowLayout
from .readout import RowReadout, SamplingKind

#: the columns of the step's output rows: emitted, token, steps, E[S], then d_1 .. d_M
OUT_FIXED_COLUMNS = 4
#: tensors of :class:`Rows` that are not per-row state: the last step's output and constants
NOT_STATE = ("out", "pause_ids", "offsets")


def to_device(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` (a list, or a list of equal-length lists) as a tensor on ``device``.  On CUDA
    it is staged in pinned memory and copied without the host waiting for the device (a copy
    from pageable memory waits for everything queued before it, which would empty the queue
    of steps that the host keeps ahead); the pinned block is not reused before the copy ends."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


class Rows:
    """The decoding state of ``slots`` rows on ``device`` (see the module docstring).

    Args:
        layout: the model's :class:`~cyb.engine.layout.RowLayout`.
        readout: its :class:`~cyb.engine.readout.RowReadout`.
        slots: rows.
        scratch_col: the first scratch column of the cache (where rows not decoding write).
        last_col: the cache's last column (no write goes past it).
        max_position: the largest rotary position the model takes (None: no limit).
    """

    def __init__(self, layout: RowLayout, readout: RowReadout, slots: int, scratch_col: int,
                 last_col: int, max_position: int | None, device) -> None:
        self.layout, self.readout = layout, readout
        self.m, self.slots, self.device = layout.num_steps, slots, device
        self.scratch_col, self.last_col = scratch_col, last_col
        self.max_position = max_position

        def longs(fill=0):
            return torch.full((slots,), fill, dtype=torch.long, device=device)

        self.active = torch.zeros(slots, dtype=torch.bool, device=device)
        self.feed, self.pos, self.col = longs(), longs(), longs(scratch_col)
        self.real_col, self.real_pos = longs(), longs()
        self.step, self.counter, self.key = longs(1), longs(), longs()
        self.fixed = torch.zeros(slots, dtype=torch.bool, device=device)
        self.greedy = torch.ones(slots, dtype=torch.bool, device=device)
        self.temperature = torch.ones(slots, dtype=torch.float32, device=device)
        self.top_k = longs()
        self.top_p = torch.ones(slots, dtype=torch.float32, device=device)
        # what the row has read out of its current block (fixed mode with Q = 1)
        self.stopped = torch.zeros(slots, dtype=torch.bool, device=device)
        self.answer, self.stop_step = longs(), longs()
        self.log_d = torch.zeros(slots, self.m, dtype=torch.float32, device=device)
        self.log_not_d = torch.zeros(slots, self.m, dtype=torch.float32, device=device)
        #: the output of the last step: [slots, 4 + M] (emitted, token, steps, E[S], d_1 .. d_M)
        self.out = torch.zeros(slots, OUT_FIXED_COLUMNS + self.m, dtype=torch.float32, device=device)
        self.pause_ids = torch.tensor((0,) + layout.pause_ids, dtype=torch.long, device=device)
        self.offsets = torch.arange(self.m, device=device)

    # ------------------------------------------------------------------ host-driven changes
    def start(self, slots: list[int], tokens: list[int], positions: list[int], cols: list[int],
              keys: list[int], fixed: list[bool], greedy: list[bool], temperature: list[float],
              top_k: list[int], top_p: list[float], counters: list[int] | None = None) -> None:
        """Rows ``slots`` begin decoding: each feeds ``tokens`` (its prompt's last token, or a
        resumed row's last decided one) at ``positions``, column ``cols``, deciding its new
        token of index ``counters`` (None: 0, the first).  Every field of the rows is set, from
        two staged host copies (:func:`to_device`: the host does not wait)."""
        counters = counters if counters is not None else [0] * len(slots)
        longs = to_device([slots, tokens, positions, cols, keys, fixed, greedy, top_k, counters], torch.long,
                          self.device)
        floats = to_device([temperature, top_p], torch.float32, self.device)
        idx = longs[0]
        for t, v in ((self.feed, longs[1]), (self.pos, longs[2]), (self.real_pos, longs[2]),
                     (self.col, longs[3]), (self.real_col, longs[3]), (self.key, longs[4]),
                     (self.fixed, longs[5]), (self.greedy, longs[6]), (self.top_k, longs[7]),
                     (self.counter, longs[8]), (self.temperature, floats[0]), (self.top_p, floats[1])):
            t.index_copy_(0, idx, v.to(t.dtype))
        self.step.index_fill_(0, idx, 1)
        self.active.index_fill_(0, idx, True)
        for t in (self.stopped, self.answer, self.stop_step, self.log_d, self.log_not_d):
            t.index_fill_(0, idx, 0)

    def stop(self, slots: list[int]) -> None:
        """Rows ``slots`` stop decoding (their slots are free or being prefilled)."""
        self.active.index_fill_(0, to_device(slots, torch.long, self.device), False)

    def move(self, src: list[int], dst: list[int]) -> None:
        """Rows ``src``'s whole state (:meth:`per_slot`) goes to rows ``dst`` (``src[i]`` to
        ``dst[i]``; no slot in both lists); rows ``src`` stop (the cache's columns move
        separately: :meth:`cyb.engine.cache.PagedCache.move`)."""
        src_idx, dst_idx = to_device([src, dst], torch.long, self.device)
        for t in self.per_slot():
            t.index_copy_(0, dst_idx, t.index_select(0, src_idx))
        self.active.index_fill_(0, src_idx, False)

    def per_slot(self) -> list[torch.Tensor]:
        """Every tensor of per-row state (first dimension: the slots): each attribute of this
        object that is a tensor, but the step's output and the constants (:data:`NOT_STATE`)."""
        return [v for k, v in vars(self).items() if isinstance(v, torch.Tensor) and k not in NOT_STATE]

    def snapshot(self) -> list[torch.Tensor]:
        """Copies of everything a step changes (to undo a graph capture's warm-up)."""
        return [t.clone() for t in self.per_slot() + [self.out]]

    def restore(self, saved: list[torch.Tensor]) -> None:
        for t, v in zip(self.per_slot() + [self.out], saved):
            t.copy_(v)

    # ------------------------------------------------------------------ a step's inputs
    def inputs(self, n: int, q: int):
        """``(ids, positions, write_cols)``, each ``[n, q]``, of the next step's positions."""
        active = self.active[:n]
        if q == 1:
            ids, pos, col = self.feed[:n, None], self.pos[:n, None], self.col[:n, None]
        else:
            ids = torch.cat([self.feed[:n, None], self.pause_ids[1:].expand(n, q - 1)], dim=1)
            pos = self.pos[:n, None] + self.offsets * int(self.layout.advance)
            col = self.col[:n, None] + self.offsets
        col = torch.where(active.unsqueeze(1), col, self.scratch_col + self.offsets[:q]).clamp(max=self.last_col)
        if self.max_position is not None:
            pos = pos.clamp(0, self.max_position)
        return ids, pos, col

    def is_pause_fed(self, n: int, q: int) -> torch.Tensor:
        """``[n, q]`` bool: which of the next step's positions are pauses."""
        if q == 1:
            return (self.step[:n] > 1).unsqueeze(1)
        return (self.offsets > 0).expand(n, q)

    # ------------------------------------------------------------------ after the forward
    def advance(self, n: int, logits: torch.Tensor, kind: SamplingKind) -> None:
        """Read out ``logits [n, Q, V]`` of the step just run, write its output rows
        (:attr:`out`) and move the state of rows ``0 .. n-1`` on to the next step."""
        q = logits.shape[1]
        sl = slice(0, n)
        dec = self.readout.decide(logits, self.step[sl], self.key[sl], self.counter[sl], self.greedy[sl],
                                  self.temperature[sl], self.top_k[sl], self.top_p[sl], kind)
        if q == 1:
            self._advance_one(n, dec)
        else:
            self._advance_block(n, dec)

    def _advance_one(self, n: int, dec) -> None:
        m, lay, sl = self.m, self.layout, slice(0, n)
        step, fixed, active = self.step[sl], self.fixed[sl], self.active[sl]
        at_step = (step - 1).unsqueeze(1)
        log_d = self.log_d[sl].scatter(1, at_step, dec.log_d)
        log_not_d = self.log_not_d[sl].scatter(1, at_step, dec.log_not_d)
        stopped = self.stopped[sl]
        newly = ~stopped & dec.stop
        answer = torch.where(newly, dec.token, self.answer[sl])
        stop_step = torch.where(newly, step, self.stop_step[sl])
        emit = torch.where(fixed, step >= m, newly) & active
        self._write_out(n, emit, answer, stop_step, log_d, log_not_d, fixed)
        # the next position: the answer after a finished block, else the next pause
        col, pos = self.col[sl], self.pos[sl]
        if lay.real_only:
            next_col = torch.where(emit, self.real_col[sl] + 1, col + 1)
            new_pos = self.real_pos[sl] + (m if lay.advance else 1)
        else:
            next_col = col + 1
            new_pos = pos + 1 if lay.advance else self.real_pos[sl] + 1
        pause_pos = pos + 1 if lay.advance else pos
        self.feed[sl] = torch.where(emit, answer, self.pause_ids[step.clamp(max=m - 1)])
        self.pos[sl] = torch.where(emit, new_pos, pause_pos)
        self.real_pos[sl] = torch.where(emit, new_pos, self.real_pos[sl])
        self.real_col[sl] = torch.where(emit, next_col, self.real_col[sl])
        self.col[sl] = next_col
        # (rows that are not decoding stay put, so that their step stays within the block)
        self.step[sl] = torch.where(emit, torch.ones_like(step), torch.where(active, step + 1, step))
        self.counter[sl] += emit.long()
        keep = ~emit
        self.stopped[sl] = (stopped | newly) & keep
        self.answer[sl], self.stop_step[sl] = answer, stop_step
        self.log_d[sl] = torch.where(keep.unsqueeze(1), log_d, 0.0)
        self.log_not_d[sl] = torch.where(keep.unsqueeze(1), log_not_d, 0.0)

    def _advance_block(self, n: int, dec) -> None:
        m, lay, sl = self.m, self.layout, slice(0, n)
        fixed, active = self.fixed[sl], self.active[sl]
        steps = dec.at + 1
        self._write_out(n, active, dec.token, steps, dec.log_d, dec.log_not_d, fixed)
        real_col, real_pos = self.real_col[sl], self.real_pos[sl]
        used = torch.where(fixed, torch.full_like(steps, m), steps)  # steps the next block follows
        if lay.real_only:
            next_col = real_col + 1
            next_pos = real_pos + (m if lay.advance else 1)
        else:
            next_col = real_col + used
            next_pos = real_pos + used if lay.advance else real_pos + 1
        self.feed[sl] = dec.token
        self.col[sl] = self.real_col[sl] = next_col
        self.pos[sl] = self.real_pos[sl] = next_pos
        self.counter[sl] += active.long()

    def _write_out(self, n: int, emit, token, steps, log_d, log_not_d, fixed) -> None:
        """The step's output rows: emitted, token, steps, E[S] (fixed rows; NaN for others),
        ``d_1 .. d_M`` (NaN after the stop step in adaptive rows; ``d_M = 0``)."""
        d = log_d.exp()
        d[:, -1] = 0.0
        ran = self.offsets.unsqueeze(0) < steps.unsqueeze(1)
        d = torch.where(fixed.unsqueeze(1) | ran, d, math.nan)
        d[:, -1] = 0.0
        expected = torch.where(fixed, expected_stop_step(log_d, log_not_d).float(), math.nan)
        out = self.out[:n]
        out[:, 0] = emit.float()
        out[:, 1] = token.float()
        out[:, 2] = steps.float()
        out[:, 3] = expected
        out[:, OUT_FIXED_COLUMNS:] = d


__all__ = ["OUT_FIXED_COLUMNS", "Rows"]
