"""Pause vocabulary and sequence layouts.

Notation follows the paper: ``M`` (W^max) computation steps per real token, the real token
itself (step 1) and ``M-1`` pauses.

Recipe 1 (the default): ``M-1`` pauses after *every* real token.  Real ids ``x1 x2 x3`` with
``M = 3`` become ``x1 p1 p2 x2 p1 p2 x3 p1 p2``.  With the ``"shared"`` position scheme a pause
takes the position of the real token before it (``0 0 0 1 1 1 2 2 2``) and each pause index has
its own id (``<pause_1>``, ``<pause_2>``); the original Think-Before-You-Speak scheme
(``"advance"``) gives pauses positions of their own (``0 1 2 3 4 5 6 7 8``) and one shared id.
All ``M`` outputs of block ``k`` predict the next real token ``x_{k+1}``.

Recipe 2: a variable number of pauses per token, ``W - 1`` with ``W ~ Cat(omega)``.

Original TBYS data schemes (Goyal et al.): pauses inserted at random places of a pretraining
stream, or appended after the prefix of a fine-tuning example.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

import torch

from .vectors import check_step_vector
from .visibility import BlockSteps, inserted_steps, recipe1_steps, variable_steps

IGNORE_INDEX = -100
PositionScheme = Literal["shared", "advance"]
POSITION_SCHEMES = ("shared", "advance")


def _check_id(name: str, value: int, vocab_size: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int token id, got {value!r}")
    if not 0 <= value < vocab_size:
        raise ValueError(f"{name} = {value} is outside the vocabulary [0, {vocab_size})")


@dataclass(frozen=True)
class PauseVocab:
    """Which ids are pauses and which is ``<don't know>``, and how many steps a token gets.

    Attributes:
        num_steps: ``M`` >= 1, steps per real token (the token and ``M-1`` pauses).
        pause_ids: ids of ``<pause_1>`` .. ``<pause_{M-1}>`` (length ``M-1``).  With
            ``position_scheme="advance"`` (original TBYS) they may all be the same id.
        dk_id: id of the ``<don't know>`` output, or None for methods without one
            (baseline, TBYS).
        vocab_size: size of the model's output vocabulary; every id must lie below it.
        position_scheme: ``"shared"`` (a pause takes the position of the real token before
            it) or ``"advance"`` (pauses advance positions, as in the original TBYS).
    """

    num_steps: int
    pause_ids: tuple[int, ...] = ()
    dk_id: int | None = None
    vocab_size: int = 0
    position_scheme: PositionScheme = "shared"
    _special: frozenset = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        m = self.num_steps
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise ValueError(f"num_steps (M) must be an integer >= 1, got {m!r}")
        object.__setattr__(self, "pause_ids", tuple(self.pause_ids))
        if len(self.pause_ids) != m - 1:
            raise ValueError(
                f"pause_ids must hold M-1 = {m - 1} ids (one per pause index), "
                f"got {len(self.pause_ids)}: {list(self.pause_ids)}"
            )
        if not isinstance(self.vocab_size, int) or self.vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int, got {self.vocab_size!r}")
        if self.position_scheme not in POSITION_SCHEMES:
            raise ValueError(
                f"position_scheme must be one of {POSITION_SCHEMES}, got {self.position_scheme!r}"
            )
        for j, pid in enumerate(self.pause_ids, start=1):
            _check_id(f"pause_ids[{j - 1}] (<pause_{j}>)", pid, self.vocab_size)
        if self.position_scheme == "shared" and len(set(self.pause_ids)) != len(self.pause_ids):
            raise ValueError(
                "pause_ids must be distinct with position_scheme='shared' (each pause index needs "
                f"its own id), got {list(self.pause_ids)}"
            )
        if self.dk_id is not None:
            _check_id("dk_id", self.dk_id, self.vocab_size)
            if self.dk_id in self.pause_ids:
                raise ValueError(
                    f"dk_id = {self.dk_id} collides with a pause id {list(self.pause_ids)}; "
                    "<don't know> needs an id of its own"
                )
        special = set(self.pause_ids)
        if self.dk_id is not None:
            special.add(self.dk_id)
        object.__setattr__(self, "_special", frozenset(special))

    @property
    def special_ids(self) -> frozenset:
        """Pause and dk ids: ids that must never occur as real tokens."""
        return self._special

    def pause_id_tensor(self, device=None) -> torch.Tensor:
        """Ids fed at steps 1..M: index 0 is a placeholder for the real token."""
        return torch.tensor((0,) + self.pause_ids, dtype=torch.long, device=device)

    def check_real_ids(self, ids: torch.Tensor, *, mask: torch.Tensor | None = None) -> None:
        """Raise if real token ids fall outside the vocabulary or collide with pause/dk ids."""
        vals = ids if mask is None else ids[mask.bool()]
        if vals.numel() == 0:
            return
        lo, hi = int(vals.min()), int(vals.max())
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"ids: token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        if self._special:
            special = torch.tensor(sorted(self._special), device=vals.device)
            hit = torch.isin(vals, special)
            if bool(hit.any()):
                bad = int(vals[hit][0])
                raise ValueError(
                    f"token id {bad} occurs in the data but is reserved as a pause/dk id "
                    f"(pause_ids={list(self.pause_ids)}, dk_id={self.dk_id}); choose other ids "
                    "or clean the data"
                )


@dataclass
class Expanded:
    """A batch of real tokens laid out with pauses (Recipe 1).

    Attributes:
        input_ids: ``[B, L*M]`` real ids with their pauses.
        position_ids: ``[B, L*M]`` positions for the model's rotary embedding.
        attention_mask: ``[B, L*M]`` 1 where the step is valid (its real token is not padding).
        labels: ``[B, L*M]`` the target of every step (the next real token), ``IGNORE_INDEX``
            where there is none.
        block_labels: ``[B, L]`` the target of each real token's block.
        num_steps: ``M``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    block_labels: torch.Tensor
    num_steps: int

    @property
    def steps(self) -> BlockSteps:
        """Block and step of every position (for masks other than shared pauses)."""
        return recipe1_steps(self.attention_mask[:, ::self.num_steps], self.num_steps)


def left_pad(rows: Sequence[Sequence[int]], device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id rows of different lengths, right-aligned: ``(ids, attention_mask)``, both int64
    ``[len(rows), longest]``, padding (id 0, mask 0) on the left."""
    length = max(len(row) for row in rows)
    ids = torch.zeros((len(rows), length), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, length - len(row):] = torch.tensor(list(row), dtype=torch.long)
        mask[r, length - len(row):] = 1
    return ids.to(device), mask.to(device)


def next_token_labels(
    ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    loss_mask: torch.Tensor | None = None,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """``[B, L]`` target of each real position: the next real id, or ``ignore_index``.

    ``loss_mask`` (``[B, L]``, optional) marks which ids are to be *predicted* (e.g. only the
    answer of a prompt/answer pair); the target at position ``k`` is ``ids[k+1]`` when
    ``loss_mask[k+1]`` and ``attention_mask[k+1]`` are set.
    """
    labels = torch.full_like(ids, ignore_index)
    labels[:, :-1] = ids[:, 1:]
    keep = torch.ones_like(ids, dtype=torch.bool)
    if attention_mask is not None:
        keep &= attention_mask.bool()
    if loss_mask is not None:
        keep &= loss_mask.bool()
    valid_next = torch.zeros_like(keep)
    valid_next[:, :-1] = keep[:, 1:]
    if attention_mask is not None:
        valid_next &= attention_mask.bool()  # a padding position predicts nothing
    return labels.masked_fill(~valid_next, ignore_index)


def _positions_of_real(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions ``0, 1, ...`` counted over valid tokens (left padding gets position 0)."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp(min=0)


def expand(
    ids: torch.Tensor,
    vocab: PauseVocab,
    *,
    attention_mask: torch.Tensor | None = None,
    loss_mask: torch.Tensor | None = None,
    ignore_index: int = IGNORE_INDEX,
    check_ids: bool = True,
) -> Expanded:
    """Recipe 1: insert ``M-1`` pauses after every real token.

    Args:
        ids: ``[B, L]`` real token ids.
        vocab: the pause vocabulary (``M``, pause ids, position scheme).
        attention_mask: ``[B, L]`` 1 for real tokens, 0 for padding (left or right).
        loss_mask: ``[B, L]`` which tokens are prediction targets (default: all valid ones).
        check_ids: raise if real ids are outside the vocabulary or equal a pause/dk id.

    Returns:
        :class:`Expanded` with tensors of length ``L*M``.
    """
    if ids.dim() != 2:
        raise ValueError(f"ids must have shape [B, L], got {tuple(ids.shape)}")
    b, length = ids.shape
    m = vocab.num_steps
    if attention_mask is None:
        attention_mask = torch.ones_like(ids)
    elif attention_mask.shape != ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} does not match ids {tuple(ids.shape)}"
        )
    if loss_mask is not None and loss_mask.shape != ids.shape:
        raise ValueError(f"loss_mask shape {tuple(loss_mask.shape)} does not match ids {tuple(ids.shape)}")
    if check_ids:
        vocab.check_real_ids(ids, mask=attention_mask)
    block_labels = next_token_labels(ids, attention_mask, loss_mask, ignore_index)

    steps = vocab.pause_id_tensor(ids.device)  # [M], slot 0 replaced by the real id
    grid = steps.view(1, 1, m).expand(b, length, m).clone()
    grid[:, :, 0] = ids
    input_ids = grid.reshape(b, length * m)

    mask = attention_mask.unsqueeze(-1).expand(b, length, m).reshape(b, length * m)
    if vocab.position_scheme == "shared":
        real_pos = _positions_of_real(attention_mask)
        position_ids = real_pos.unsqueeze(-1).expand(b, length, m).reshape(b, length * m)
    else:
        position_ids = _positions_of_real(mask)
    labels = block_labels.unsqueeze(-1).expand(b, length, m).reshape(b, length * m)
    return Expanded(
        input_ids=input_ids,
        position_ids=position_ids.contiguous(),
        attention_mask=mask.contiguous(),
        labels=labels.contiguous(),
        block_labels=block_labels,
        num_steps=m,
    )


def collapse(x: torch.Tensor, num_steps: int) -> torch.Tensor:
    """``[B, L*M, ...]`` -> ``[B, L, M, ...]``: group the outputs of each real token's block."""
    if x.dim() < 2 or x.shape[1] % num_steps:
        raise ValueError(
            f"cannot collapse shape {tuple(x.shape)}: dim 1 must be a multiple of M = {num_steps}"
        )
    b, t = x.shape[:2]
    return x.reshape(b, t // num_steps, num_steps, *x.shape[2:])


# --------------------------------------------------------------------------- Recipe 2


def normalise_distribution(name: str, values, num_steps: int) -> torch.Tensor:
    """Validate a distribution over steps ``1..M`` and return it normalised (float64, ``[M]``)."""
    t = torch.as_tensor(values, dtype=torch.float64).flatten()
    check_step_vector(name, t.tolist(), num_steps)
    return t / float(t.sum())


def sample_pause_counts(
    shape: Sequence[int],
    omega,
    *,
    generator: torch.Generator | None = None,
    device=None,
) -> torch.Tensor:
    """Recipe 2: pauses per real token, ``W - 1`` with ``W ~ Cat(omega)`` over ``1..M``.

    Returns a long tensor of ``shape`` with values in ``[0, M-1]``; seeded by ``generator``.
    """
    omega_t = torch.as_tensor(omega, dtype=torch.float64).flatten()
    probs = normalise_distribution("omega", omega_t, omega_t.numel())
    n = 1
    for s in shape:
        n *= int(s)
    draws = torch.multinomial(probs, n, replacement=True, generator=generator)
    return draws.view(*shape).to(device=device)


@dataclass
class VariableExpanded:
    """A batch laid out with a variable number of pauses per token (Recipe 2).

    Attributes:
        input_ids, position_ids, attention_mask, labels: ``[B, T]`` with ``T`` the longest row.
        grid_index: ``[B, L, M]`` index into ``T`` of step ``i`` of token ``k`` (0 where absent).
        step_mask: ``[B, L, M]`` True where step ``i`` of token ``k`` exists.
        last_step: ``[B, L, M]`` True at the last step of each token's block (where ``d`` is
            forced to 0).
        world_stop: ``[B, L]`` the number of steps ``W`` each token was granted.
        block_labels: ``[B, L]`` the target of each block.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    grid_index: torch.Tensor
    step_mask: torch.Tensor
    last_step: torch.Tensor
    world_stop: torch.Tensor
    block_labels: torch.Tensor
    num_steps: int

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, ...]`` model outputs -> ``[B, L, M, ...]`` (absent steps hold step 0's value)."""
        b, length, m = self.grid_index.shape
        idx = self.grid_index.reshape(b, length * m)
        extra = x.shape[2:]
        idx = idx.view(b, length * m, *([1] * len(extra))).expand(b, length * m, *extra)
        return torch.gather(x, 1, idx).view(b, length, m, *extra)

    @property
    def steps(self) -> BlockSteps:
        """Block and step of every position (for masks other than shared pauses)."""
        return variable_steps(self.grid_index, self.step_mask, self.input_ids.shape[1])

    def world_omega(self) -> torch.Tensor:
        """``[B, L, M]`` one-hot stop distribution at ``W``: pass as ``omega`` to the losses."""
        return torch.nn.functional.one_hot(self.world_stop - 1, self.num_steps).to(torch.float32)


def expand_variable(
    ids: torch.Tensor,
    pause_counts: torch.Tensor,
    vocab: PauseVocab,
    *,
    attention_mask: torch.Tensor | None = None,
    loss_mask: torch.Tensor | None = None,
    pad_id: int = 0,
    ignore_index: int = IGNORE_INDEX,
    check_ids: bool = True,
) -> VariableExpanded:
    """Recipe 2: insert ``pause_counts[b, k]`` pauses after real token ``k`` of row ``b``.

    Rows are right-padded with ``pad_id`` to the longest expanded row.
    """
    if ids.dim() != 2 or pause_counts.shape != ids.shape:
        raise ValueError(
            f"ids [B, L] and pause_counts must have the same shape, got {tuple(ids.shape)} and "
            f"{tuple(pause_counts.shape)}"
        )
    m = vocab.num_steps
    if pause_counts.numel() and (int(pause_counts.min()) < 0 or int(pause_counts.max()) > m - 1):
        raise ValueError(f"pause_counts must lie in [0, M-1] = [0, {m - 1}]")
    b, length = ids.shape
    device = ids.device
    if attention_mask is None:
        attention_mask = torch.ones_like(ids)
    if check_ids:
        vocab.check_real_ids(ids, mask=attention_mask)
    valid = attention_mask.bool()
    counts = torch.where(valid, pause_counts.long() + 1, torch.zeros_like(pause_counts))
    starts = counts.cumsum(-1) - counts  # [B, L] offset of each block
    total = int(counts.sum(-1).max()) if length else 0
    block_labels = next_token_labels(ids, attention_mask, loss_mask, ignore_index)

    step = torch.arange(m, device=device)
    step_mask = (step.view(1, 1, m) < counts.unsqueeze(-1)) & valid.unsqueeze(-1)
    grid_index = (starts.unsqueeze(-1) + step.view(1, 1, m)).masked_fill(~step_mask, 0)
    last_step = step_mask & (step.view(1, 1, m) == (counts.unsqueeze(-1) - 1))

    steps_ids = vocab.pause_id_tensor(device).view(1, 1, m).expand(b, length, m).clone()
    steps_ids[:, :, 0] = ids
    if vocab.position_scheme == "shared":
        real_pos = _positions_of_real(attention_mask).unsqueeze(-1).expand(b, length, m)
    else:
        real_pos = None

    input_ids = torch.full((b, total), pad_id, dtype=ids.dtype, device=device)
    position_ids = torch.zeros((b, total), dtype=torch.long, device=device)
    mask = torch.zeros((b, total), dtype=torch.long, device=device)
    labels = torch.full((b, total), ignore_index, dtype=torch.long, device=device)
    rows = torch.arange(b, device=device).view(b, 1, 1).expand(b, length, m)
    sel_rows, sel_cols = rows[step_mask], grid_index[step_mask]
    input_ids[sel_rows, sel_cols] = steps_ids[step_mask]
    mask[sel_rows, sel_cols] = 1
    labels[sel_rows, sel_cols] = block_labels.unsqueeze(-1).expand(b, length, m)[step_mask]
    if real_pos is not None:
        position_ids[sel_rows, sel_cols] = real_pos[step_mask]
    else:
        position_ids = _positions_of_real(mask)
    return VariableExpanded(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=mask,
        labels=labels,
        grid_index=grid_index,
        step_mask=step_mask,
        last_step=last_step,
        world_stop=counts.clamp(min=1),
        block_labels=block_labels,
        num_steps=m,
    )


# ------------------------------------------------------------- original TBYS data schemes


@dataclass
class PausedSequence:
    """A sequence with pauses inserted by :func:`insert_pauses` (positions advance).

    ``labels[k]`` is the target of position ``k``: the next *real* token when ``k`` is the last
    step before it, else ``IGNORE_INDEX`` (outputs leading up to the final pause are ignored).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    is_pause: torch.Tensor | None = None

    @property
    def steps(self) -> BlockSteps:
        """Each run of pauses as a block of the real token before it."""
        return inserted_steps(self.is_pause, self.attention_mask.bool())


def insert_pauses(
    ids: torch.Tensor,
    pause_id: int,
    slots_of: Callable[[int, int, torch.Tensor], Sequence[int] | torch.Tensor],
    *,
    attention_mask: torch.Tensor | None = None,
    loss_mask: torch.Tensor | None = None,
) -> PausedSequence:
    """The original TBYS layout: pauses inserted into each row, positions advancing over them.

    ``slots_of(r, n, target)`` gives the indices, in the merged row of row ``r``'s ``n`` real
    tokens and its pauses, that hold a pause; ``target`` is the row's ``[n]`` loss mask (all
    True without ``loss_mask``). The output right before a real token predicts it when that
    token is a target; outputs before a pause predict nothing. Rows keep all their real tokens
    (padding, per ``attention_mask``, is dropped) and are right-padded to the longest.
    See :func:`random_pause_slots` (pretraining) and :func:`prompt_pause_slots` (fine-tuning).
    """
    rows, labels = [], []
    for r in range(ids.shape[0]):
        keep = attention_mask[r].bool() if attention_mask is not None else torch.ones_like(ids[r], dtype=torch.bool)
        real = ids[r][keep]
        target = loss_mask[r][keep].bool() if loss_mask is not None else torch.ones_like(real, dtype=torch.bool)
        n = real.numel()
        slots = torch.as_tensor(slots_of(r, n, target), dtype=torch.long)
        total = n + slots.numel()
        is_pause = torch.zeros(total, dtype=torch.bool)
        is_pause[slots] = True
        seq = torch.full((total,), pause_id, dtype=ids.dtype)
        seq[~is_pause] = real
        ok = torch.zeros(total, dtype=torch.bool)
        ok[~is_pause] = target
        lab = torch.full((total,), IGNORE_INDEX, dtype=torch.long)
        lab[:-1] = torch.where(ok[1:], seq[1:], torch.full_like(seq[1:], IGNORE_INDEX))
        rows.append(seq)
        labels.append(lab)
    width = max((len(s) for s in rows), default=0)
    b = len(rows)
    input_ids = torch.zeros((b, width), dtype=ids.dtype)
    lab_t = torch.full((b, width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for r, (s, lab) in enumerate(zip(rows, labels)):
        input_ids[r, :len(s)], lab_t[r, :len(s)], mask[r, :len(s)] = s, lab, 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    is_pause = (input_ids == pause_id) & mask.bool()
    return PausedSequence(input_ids, pos, mask, lab_t, is_pause)


def random_pause_slots(n: int, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``k`` pause slots at uniformly random places of a row of ``n`` real tokens, never before
    the first token (the pretraining scheme of the original TBYS)."""
    if k < 0:
        raise ValueError(f"the number of pauses must be >= 0, got {k}")
    if not n or not k:
        return torch.zeros(0, dtype=torch.long)
    return torch.randperm(n + k - 1, generator=generator)[:k] + 1


def prompt_pause_slots(target: torch.Tensor, k: int) -> list[int]:
    """``k`` pause slots right after the prompt, before the first target token (the
    fine-tuning scheme of the original TBYS: the last pause predicts the first answer token)."""
    if k < 0:
        raise ValueError(f"the number of pauses must be >= 0, got {k}")
    first = int(target.nonzero()[0]) if bool(target.any()) else target.numel()
    return list(range(first, first + k))
