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
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..layout import PauseVocab


@dataclass(frozen=True)
class Prefill:
    """What prefill writes for one prompt, and where decoding starts.

    Attributes:
        ids, positions: ``[C]`` long, the columns ``0 .. C-1`` to write before decoding.
        first_token: the prompt's last token, fed by the row's first decoding step (its block
            gives the first new token).
        first_position: its rotary position.
        columns: ``C``.
    """

    ids: torch.Tensor
    positions: torch.Tensor
    first_token: int
    first_position: int
    #: columns prefill writes (the first decoding step writes the next one); a plain int, read
    #: for every token a row decides
    columns: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", int(self.ids.shape[0]))


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

    def prefill(self, prompt: list[int]) -> Prefill:
        """The columns of ``prompt`` (its token ids) before decoding starts."""
        m = self.num_steps
        earlier = torch.tensor(prompt[:-1], dtype=torch.long)
        n = earlier.shape[0]
        step = m if self.advance else 1
        if self.real_only:
            ids, positions = earlier, torch.arange(n) * step
        else:  # each token followed by its M - 1 pauses
            blocks = torch.empty((n, m), dtype=torch.long)
            blocks[:, 0] = earlier
            blocks[:, 1:] = torch.tensor(self.pause_ids[: m - 1], dtype=torch.long)
            ids = blocks.view(-1)
            positions = torch.arange(n * m) if self.advance else torch.arange(n).repeat_interleave(m)
        return Prefill(ids, positions, int(prompt[-1]), n * step)

    def columns_needed(self, prompt_len: int, max_new_tokens: int) -> int:
        """Columns a request may fill: its prefill, then every decoded block at its longest."""
        m = self.num_steps
        if self.real_only:
            return (prompt_len - 1) + max_new_tokens + (m - 1)
        return (prompt_len - 1) * m + max_new_tokens * m

    def column_bound(self, columns: int, steps: int, q: int, real: int) -> int:
        """A column that no position of a row has reached at its next decoding step: ``columns``
        prefill columns, ``steps`` decoding steps run since it started (``q`` positions each),
        ``real`` its real columns as the host knows them (prefill plus the tokens reported).
        Rows that append reach at most ``columns + steps x q``; a private row keeps real tokens
        only, so it reaches at most ``real`` plus the token the host has not read yet, the one
        being fed and its ``M`` steps."""
        bound = columns + steps * q
        if self.real_only:
            bound = min(bound, real + 2 + self.num_steps)
        return bound

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

    def prefill_is_pause(self, columns: int) -> torch.Tensor:
        """``[columns]`` bool: which prefill columns hold pauses (the Recipe 1 layout)."""
        col = torch.arange(columns)
        return torch.zeros(columns, dtype=torch.bool) if self.real_only else (col % self.num_steps) != 0


__all__ = ["Prefill", "RowLayout"]
