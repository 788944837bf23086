"""The readout's state on vLLM's V1 model runner (the CPU build's runner).

The V1 runner tells a logits processor which requests joined, left or moved between batch
rows (``update_state``) and hands it each request's output as a live list that grows with
every sampled token.  :class:`RowReadout` keeps one :class:`_Row` per batch row and reads, from
the output so far, the step of the current block that comes next and the index of the token
it decides.  The decision itself is :func:`cyb.integrations.vllm.decisions.decide`.
"""

from __future__ import annotations

import torch

from .pauses import ServedPauses
from .decisions import RequestSettings, decide, feed, force, pause_table


class _Row:
    """One request of the batch: its settings and what it read out of its current block."""

    __slots__ = ("settings", "output", "seen", "reals", "block", "block_of")

    def __init__(self, params, output: list[int], default_mode: str) -> None:
        self.settings = RequestSettings(params, default_mode)
        self.output = output  # vLLM's live list of the request's output ids
        self.seen = 0  # output ids counted so far
        self.reals = 0  # real tokens among them
        self.block: dict[int, tuple[bool, int]] = {}  # step -> (answered, token) of the current block
        self.block_of = -1  # the token index the block belongs to

    def position(self, pauses: frozenset, m: int) -> tuple[int, int]:
        """``(step, counter)``: the step of the current block that comes next (1-based) and the
        index of the token it decides."""
        out = self.output
        if len(out) < self.seen:  # vLLM dropped output tokens: count again
            self.seen, self.reals = 0, 0
        for t in out[self.seen:]:
            if t not in pauses:
                self.reals += 1
        self.seen = len(out)
        trailing = 0
        for t in reversed(out):
            if t not in pauses or trailing >= m - 1:
                break
            trailing += 1
        return trailing + 1, self.reals

    def keep(self, step: int, counter: int, answered: bool, token: int, m: int) -> tuple[int, int]:
        """Record fixed mode's readout of ``step`` (a later computation of a step replaces the
        earlier one) and return the block's first answering step and its token (meaningful at
        step ``M``, which always answers)."""
        if self.block_of != counter:
            self.block, self.block_of = {}, counter
        self.block[step] = (answered, token)
        at = next((k for k in range(1, m + 1) if k in self.block and self.block[k][0]), m)
        return at, self.block.get(at, (True, token))[1]


class RowReadout:
    """The readout's rows on the V1 runner (see the module docstring)."""

    def __init__(self, pauses: ServedPauses) -> None:
        self.pauses = pauses
        self.rows: dict[int, _Row] = {}
        self._pause_set = frozenset(pauses.pause_ids)

    def update_state(self, batch_update) -> None:
        if batch_update is None:
            return
        from vllm.v1.sample.logits_processor.interface import MoveDirectionality

        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            self.rows[index] = _Row(params, output, self.pauses.default_mode)
        for a, b, direction in batch_update.moved:
            ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
            if ra is not None:
                self.rows[b] = ra
            if direction == MoveDirectionality.SWAP and rb is not None:
                self.rows[a] = rb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        p = self.pauses
        if not self.rows:
            return logits
        n, m = logits.shape[0], p.num_steps
        live = [i for i in range(n) if i in self.rows]
        if not live:
            return logits
        rs = [self.rows[i] for i in live]
        where = [r.position(self._pause_set, m) for r in rs]
        dev = logits.device

        def column(values, dtype):
            return torch.tensor(values, dtype=dtype, device=dev)

        idx = column(live, torch.long)
        step = column([s for s, _ in where], torch.long)
        temperature = column([r.settings.temperature for r in rs], torch.float32)
        answers, token = decide(
            p, logits.index_select(0, idx), step, column([r.settings.key for r in rs], torch.long),
            column([c for _, c in where], torch.long), column([r.settings.greedy for r in rs], torch.bool),
            temperature, column([r.settings.top_k for r in rs], torch.long),
            column([r.settings.top_p for r in rs], torch.float32))
        fixed = [r.settings.mode == "fixed" for r in rs]
        firsts = [r.keep(s, c, a, t, m) if f else (m, t)
                  for r, (s, c), a, t, f in zip(rs, where, answers.tolist(), token.tolist(), fixed)]
        out, code = feed(p, column(fixed, torch.bool), step, answers, token,
                         column([a for a, _ in firsts], torch.long), column([t for _, t in firsts], torch.long),
                         pause_table(p, dev))
        return force(logits, idx, out, code, temperature)


__all__ = ["RowReadout"]
