"""Which pause steps later tokens may attend to: shared or private pauses.

A laid-out row is a sequence of *blocks*: real token ``k`` (step 0) followed by its pauses
(steps ``1, 2, ...``).  Inside a block attention is causal.  Across blocks the visibility
decides what a later token's steps see of an earlier block:

* ``shared`` (the paper's layout): everything.  Attention is plain causal over the layout, the
  way the model reads any other sequence; no mask beyond it is needed.
* ``gated``: everything, as ``shared``, but the attention logit of a query to another (earlier)
  token's pause gets a learned bias per layer and head (:mod:`cyb.model.gates`), which starts
  low (the gate almost closed: nearly ``private``, so a freshly wrapped pretrained model keeps
  its quality) and is trained with the model, so that later tokens may learn to read earlier
  tokens' pauses where that helps.
* ``private``: the real token only.  The query at (token ``i``, step ``j``) sees the real
  tokens ``1..i`` and the steps ``1..j`` of token ``i``'s own block, never another token's
  pauses.  The real tokens then form exactly the base model's sequence (a freshly wrapped
  pretrained model keeps its quality), a later token's context does not depend on how many
  pauses an earlier token took (adaptive decoding is the training computation for any stop),
  and a KV cache needs real tokens only.

:class:`BlockSteps` describes a layout position by position (which block, which step, whether
it is valid); :func:`visible` is the reference mask;
:func:`real_first_order` is the reordering that puts every real token first, so that a
block-sparse attention kernel skips the pause-to-pause tiles that private pauses never attend.
Nothing here knows about models.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

VISIBILITIES = ("shared", "private", "gated")
DEFAULT_VISIBILITY = "shared"
#: the gated layout's starting bias on other tokens' pauses: they get exp(-8) = 0.03% of their weight
GATE_INIT = -8.0


def check_visibility(value) -> str:
    """``value`` if it names a visibility, else a ValueError listing them."""
    if value not in VISIBILITIES:
        raise ValueError(f"pause_visibility must be one of {VISIBILITIES}, got {value!r}")
    return value


@dataclass
class BlockSteps:
    """Block membership of every position of a laid-out batch.

    Attributes:
        token: ``[B, T]`` or ``[1, T]`` long: the index (within its row) of the real token whose
            block holds the position.
        step: ``[B, T]`` or ``[1, T]`` long: 0 for the real token, ``j`` for its ``j``-th pause.
        valid: ``[B, T]`` bool: the position is not padding.

    ``token`` and ``step`` have one row when every row of the batch has the same
    layout (Recipe 1), which lets kernels share one mask across the batch; ``layout_key`` then
    names that layout (e.g. ``("recipe1", L, M)``) so that a kernel can reuse what it built for
    it.
    """

    token: torch.Tensor
    step: torch.Tensor
    valid: torch.Tensor
    layout_key: tuple | None = None

    @property
    def shared_layout(self) -> bool:
        """Whether ``token`` and ``step`` are the same for every row."""
        return self.token.shape[0] == 1

    def to(self, device, non_blocking: bool = False) -> "BlockSteps":
        return BlockSteps(*(x.to(device, non_blocking=non_blocking)
                            for x in (self.token, self.step, self.valid)),
                          layout_key=self.layout_key)

    def exported(self, visibility: str) -> torch.Tensor:
        """Positions that later tokens may attend to (shape of ``step``)."""
        check_visibility(visibility)
        if visibility in ("shared", "gated"):
            return torch.ones_like(self.step, dtype=torch.bool)
        return self.step == 0


def recipe1_steps(attention_mask: torch.Tensor, num_steps: int) -> BlockSteps:
    """Recipe 1: ``L`` blocks of ``M`` steps each, interleaved (``x1 p1 .. x2 p1 ..``).

    ``attention_mask`` is ``[B, L]`` over the real tokens (1 = token, 0 = padding).
    """
    b, length = attention_mask.shape
    m = num_steps
    t = torch.arange(length * m, device=attention_mask.device).unsqueeze(0)
    step = t % m
    valid = attention_mask.bool().unsqueeze(-1).expand(b, length, m).reshape(b, length * m)
    return BlockSteps(t // m, step, valid, layout_key=("recipe1", length, m))


def variable_steps(grid_index: torch.Tensor, step_mask: torch.Tensor, total: int) -> BlockSteps:
    """Recipe 2: blocks of variable length, placed by ``grid_index [B, L, M]`` (index of step
    ``i`` of token ``k`` in the row, valid where ``step_mask``) in rows of ``total`` positions."""
    b, length, m = grid_index.shape
    device = grid_index.device
    token = torch.full((b, total), length, dtype=torch.long, device=device)
    step = torch.zeros((b, total), dtype=torch.long, device=device)
    valid = torch.zeros((b, total), dtype=torch.bool, device=device)
    rows = torch.arange(b, device=device).view(b, 1, 1).expand(b, length, m)[step_mask]
    cols = grid_index[step_mask]
    token[rows, cols] = torch.arange(length, device=device).view(1, length, 1).expand(b, length, m)[step_mask]
    step[rows, cols] = torch.arange(m, device=device).view(1, 1, m).expand(b, length, m)[step_mask]
    valid[rows, cols] = True
    return BlockSteps(token, step, valid)


def inserted_steps(is_pause: torch.Tensor, valid: torch.Tensor) -> BlockSteps:
    """Pauses inserted between real tokens (the original TBYS): each run of pauses belongs to
    the real token before it.  ``is_pause`` and ``valid`` are ``[B, T]`` bool."""
    real = (~is_pause) & valid
    token = (real.long().cumsum(-1) - 1).clamp(min=0)
    t = torch.arange(is_pause.shape[1], device=is_pause.device).expand_as(is_pause)
    last_real = torch.where(real, t, torch.zeros_like(t)).cummax(-1).values
    step = torch.where(valid, t - last_real, torch.zeros_like(t))
    return BlockSteps(token, step, valid)


def visible(steps: BlockSteps, visibility: str) -> torch.Tensor:
    """``[B, T, T]`` bool: whether the query at position ``q`` (dim 1) may attend to the key at
    position ``k`` (dim 2).

    A key is visible when it is valid and either belongs to the query's own block at a step
    no later than the query's, or belongs to an earlier block and is exported under
    ``visibility`` (:meth:`BlockSteps.exported`).  Every query also sees itself, so that a
    padding query never has an empty softmax.  This is the reference the fast kernels are
    tested against.
    """
    tok_q, tok_k = steps.token.unsqueeze(2), steps.token.unsqueeze(1)
    step_q, step_k = steps.step.unsqueeze(2), steps.step.unsqueeze(1)
    exported = steps.exported(visibility).unsqueeze(1)
    same = (tok_q == tok_k) & (step_k <= step_q)
    earlier = (tok_k < tok_q) & exported
    allowed = (same | earlier) & steps.valid.unsqueeze(1)
    t = steps.valid.shape[1]
    eye = torch.eye(t, dtype=torch.bool, device=steps.valid.device).unsqueeze(0)
    return allowed | eye


def foreign_pauses(token: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """``[B, T, T]`` bool: the key (dim 2) is a pause of an earlier token than the query's
    (dim 1), the keys whose logits a gated layout biases.  ``token`` and ``step`` are ``[B, T]``
    (:class:`BlockSteps`' fields, in the order the decoder sees the positions)."""
    return (token.unsqueeze(1) < token.unsqueeze(2)) & (step.unsqueeze(1) > 0)


def real_first_order(steps: BlockSteps, visibility: str) -> torch.Tensor:
    """``[B', T]`` long permutation that puts the exported positions first, in token order,
    then every block's remaining steps, block by block (``B'`` is 1 for a shared layout).

    Under private pauses this lays a row out as ``[x1 x2 .. xL | pauses of x1 | pauses of x2 ..]``:
    attention is then a causal triangle over the real tokens, a staircase from the pauses to the
    real tokens and small diagonal blocks among the pauses, about ``1/M`` of the tiles of a
    causal mask over all ``L*M`` positions.
    """
    exported = steps.exported(visibility)
    t = steps.token.shape[1]
    width = int(steps.step.max()) + 1 if steps.step.numel() else 1
    key = (~exported).long() * (t + 1) * width + steps.token * width + steps.step
    return torch.argsort(key, dim=-1, stable=True)


def inverse_order(order: torch.Tensor) -> torch.Tensor:
    """The permutation that undoes ``order`` (``x.gather(order).gather(inverse) == x``)."""
    inv = torch.empty_like(order)
    inv.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    return inv


def reorder(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``x [B, T, ...]`` with its positions taken in ``order`` (``[B, T]`` or ``[1, T]``)."""
    b, t = x.shape[:2]
    idx = order.expand(b, t).reshape(b, t, *([1] * (x.dim() - 2))).expand_as(x)
    return torch.gather(x, 1, idx)


__all__ = ["BlockSteps", "DEFAULT_VISIBILITY", "GATE_INIT", "VISIBILITIES", "check_visibility", "foreign_pauses", "inserted_steps",
           "inverse_order", "real_first_order", "recipe1_steps", "reorder", "variable_steps", "visible"]
