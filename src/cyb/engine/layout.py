"""Where a request's positions go in its row of the engine's cache, for each pause layout.

A row of the cache is a sequence of *columns* (key/value slots).  The prompt is written by
prefill; decoding then feeds one position per row per step (or a whole block), and the layout
decides which column each position takes and which rotary position it gets:

* ``shared`` and ``gated`` pauses *append*: every fed position takes the next column, exactly
  the sequence the model would read without a cache.  The prompt is laid out as in Recipe 1
  training (each token but the last followed by its ``M - 1`` pauses).  Gated rows also tag
  each column as a pause or not, so that attention can add the layer's gate to other tokens'
  pauses (:mod:`cyb.engine.rows`).
* ``private`` pauses keep *real tokens only*: the prompt's real tokens fill the first columns;
  a token's pauses take the columns right after it and the next real token overwrites the
  first of them.  No token ever reads another token's pauses, so nothing is lost.

Positions follow the model's scheme: ``shared`` (a pause takes its real token's position) or
``advance`` (every fed position one more than the last; under private pauses the real tokens
keep the positions of the Recipe 1 layout, ``M`` apart).

A row that is preempted (its blocks taken back) resumes from a prefill of every column it had
(:meth:`RowLayout.prefill` with the tokens it decided): its prompt, then each decided token's
block as it was fed (under shared and gated pauses the token and the pauses it took: ``M``
columns in fixed mode, its steps in adaptive mode; under private pauses the real token alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..layout import PauseVocab


@dataclass(frozen=True)
class Prefill:
    """What prefill writes for one row, and where decoding starts.

    Attributes:
        ids, positions: ``[C]`` long, the columns ``0 .. C-1`` to write before decoding.
        first_token: the token fed by the row's first decoding step (a new row: the prompt's
            last token, whose block gives the first new token).
        first_position: its rotary position.
        counter: tokens decided before (a resumed row; its first step decides token ``counter``).
        prompt_columns: how many of the first columns hold the prompt (None: all ``C``); only
            they may be shared between rows (prefix caching).
        is_pause: gated pauses: ``[C]`` bool, which columns hold pauses (else None).
        starts: gated pauses: ``[C]`` long, the column of each column's real token (else None):
            a column attends with the gate to the pauses before its start.
        columns: ``C``.
    """

    ids: torch.Tensor
    positions: torch.Tensor
    first_token: int
    first_position: int
    counter: int = 0
    prompt_columns: int | None = None
    is_pause: torch.Tensor | None = None
    starts: torch.Tensor | None = None
    #: columns prefill writes (the first decoding step writes the next one); a plain int, read
    #: for every token a row decides
    columns: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", int(self.ids.shape[0]))
        if self.prompt_columns is None:
            object.__setattr__(self, "prompt_columns", self.columns)


@dataclass(frozen=True)
class RowLayout:
    """The column and position rules of one model's pauses (see the module docstring)."""

    visibility: str
    num_steps: int
    advance: bool
    pause_ids: tuple[int, ...]

    @classmethod
    def of(cls, vocab: PauseVocab, visibility: str) -> "RowLayout":
        return cls(visibility, vocab.num_steps, vocab.position_scheme == "advance", tuple(vocab.pause_ids))

    @property
    def real_only(self) -> bool:
        """Whether the cache keeps real tokens only (private pauses)."""
        return self.visibility == "private"

    @property
    def gated(self) -> bool:
        return self.visibility == "gated"

    def prefill(self, prompt: list[int], decided: list[int] = (), used: list[int] = ()) -> Prefill:
        """The columns of ``prompt`` (its token ids) before decoding starts; with ``decided``
        (tokens the row decided so far) and ``used`` (the columns each one's block kept: ``M``
        in fixed mode, its steps in adaptive mode; read under shared and gated pauses only),
        every column a resumed row had (see the module docstring)."""
        m = self.num_steps
        fed = list(prompt) + list(decided)
        earlier = torch.tensor(fed[:-1], dtype=torch.long)  # the real tokens before the one fed next
        n, p = earlier.shape[0], len(prompt) - 1
        step = m if self.advance else 1
        if self.real_only:
            ids, positions = earlier, torch.arange(n) * step
            return Prefill(ids, positions, int(fed[-1]), n * step, len(decided), p)
        if len(used) != len(decided):
            raise ValueError(f"used must give the columns of each decided token: {len(used)} for {len(decided)}")
        if not decided:  # Recipe 1's layout: every block M columns
            blocks = torch.empty((n, m), dtype=torch.long)
            blocks[:, 0] = earlier
            blocks[:, 1:] = torch.tensor(self.pause_ids[: m - 1], dtype=torch.long)
            ids = blocks.view(-1)
            positions = torch.arange(n * m) if self.advance else torch.arange(n).repeat_interleave(m)
            offset = torch.arange(m).repeat(n) if self.gated else None
            lengths = torch.full((n,), m, dtype=torch.long)
        else:
            # (lengths: the columns of each real token's block)
            lengths = torch.cat([torch.full((p,), m, dtype=torch.long), torch.tensor(list(used), dtype=torch.long)])
            starts = torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
            offset = torch.arange(starts.shape[0]) - starts  # 0 at the real token, j at its j-th pause
            pauses = torch.tensor((0,) + self.pause_ids, dtype=torch.long)
            ids = torch.where(offset == 0, torch.repeat_interleave(earlier, lengths), pauses[offset.clamp(max=m - 1)])
            positions = (torch.arange(ids.shape[0]) if self.advance
                         else torch.repeat_interleave(torch.arange(n), lengths))
        first = ids.shape[0] if self.advance else n
        is_pause = starts = None
        if self.gated:  # (what gated attention reads: which columns are pauses, and of which token)
            is_pause = offset > 0
            starts = torch.arange(ids.shape[0]) - offset
        return Prefill(ids, positions, int(fed[-1]), first, len(decided), p * m, is_pause, starts)

    def columns_needed(self, prompt_len: int, max_new_tokens: int) -> int:
        """Columns a request may fill: its prefill, then every decoded block at its longest."""
        m = self.num_steps
        if self.real_only:
            return (prompt_len - 1) + max_new_tokens + (m - 1)
        return (prompt_len - 1) * m + max_new_tokens * m

    def column_bound(self, columns: int, steps: int, q: int, cols: int) -> int:
        """A column that no position of a row has reached at its next decoding step: ``columns``
        prefill columns, ``steps`` decoding steps run since it started (``q`` positions each),
        ``cols`` its columns as the host knows them (prefill plus the blocks of the tokens
        reported).  Rows that append reach at most ``columns + steps x q``, and at most ``cols``
        plus the block of the token the host has not read yet (``M`` columns); a private row
        keeps real tokens only, so it reaches at most ``cols`` plus the token the host has not
        read yet, the one being fed and its ``M`` steps."""
        return min(columns + steps * q, cols + self.bound_margin)

    @property
    def bound_margin(self) -> int:
        """What :meth:`column_bound` adds to the columns the host knows of a row."""
        return 2 + self.num_steps if self.real_only else self.num_steps

    def used_columns(self, fixed: bool, steps: int) -> int:
        """Columns a decided token's block keeps in the row: 1 under private pauses (the real
        token), else ``M`` in fixed mode and ``steps`` in adaptive mode."""
        if self.real_only:
            return 1
        return self.num_steps if fixed else steps

    def last_position(self, prompt_len: int, max_new_tokens: int) -> int:
        """The largest rotary position a request may feed (its last new token is never fed)."""
        fed = prompt_len + max_new_tokens - 1  # real tokens that go through the network
        return fed * self.num_steps - 1 if self.advance else fed - 1

    def check_positions(self, prompt_len: int, max_new_tokens: int, limit: int | None) -> None:
        """Raise a ValueError if a request would need positions beyond ``limit`` (the model's
        ``max_position_embeddings``; None: no limit)."""
        last = self.last_position(prompt_len, max_new_tokens)
        if isinstance(limit, int) and last >= limit:
            raise ValueError(
                f"a prompt of {prompt_len} tokens plus max_new_tokens={max_new_tokens} needs position "
                f"{last}, beyond the model's max_position_embeddings = {limit}; lower max_new_tokens "
                "or shorten the prompt")


__all__ = ["Prefill", "RowLayout"]
