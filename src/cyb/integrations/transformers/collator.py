"""The data collator: tokenised examples in, a batch laid out with pauses out.

A Trainer script's examples are dicts with ``input_ids`` and, optionally, ``attention_mask``,
``labels`` (``-100`` where a token is not predicted, as Hugging Face causal LMs take them),
``completion_mask`` or ``assistant_masks`` (1 where a token is predicted, as TRL writes them).
:class:`PauseCollator` pads them on the right into real-token rows and lays the rows out as the
method says (:meth:`cyb.objective.Objective.prepare`: Recipe 1 blocks, Recipe 2's sampled blocks,
the original TBYS's inserted pauses, or none), so the batch is exactly what ``cyb train`` feeds its
model.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ...layout import IGNORE_INDEX

#: The columns of an example the collator reads (everything else is ignored).
EXAMPLE_COLUMNS = ("input_ids", "attention_mask", "labels", "completion_mask", "assistant_masks")
#: The key under which the collator returns the laid-out batch (the model's ``forward`` argument).
BATCH_KEY = "prep"


def _row(example, key: str, index: int) -> torch.Tensor | None:
    value = example.get(key)
    if value is None:
        return None
    t = torch.as_tensor(value)
    if t.dim() != 1:
        raise ValueError(f"example {index}: {key} must be a list of token ids or flags (one row), got shape "
                         f"{tuple(t.shape)}")
    return t.long()


def _target_mask(example, ids: torch.Tensor, index: int) -> torch.Tensor | None:
    """Which tokens of one example are predicted (None: every token after the first)."""
    masks = []
    labels = _row(example, "labels", index)
    if labels is not None:
        if labels.shape != ids.shape:
            raise ValueError(f"example {index}: labels has {labels.numel()} entries for {ids.numel()} input_ids")
        target = labels != IGNORE_INDEX
        if bool((labels[target] != ids[target]).any()):
            raise ValueError(f"example {index}: labels must equal input_ids wherever they are not {IGNORE_INDEX} "
                             "(the model predicts the next real token; shifted labels are not supported)")
        masks.append(target)
    for key in ("completion_mask", "assistant_masks"):
        mask = _row(example, key, index)
        if mask is not None:
            if mask.shape != ids.shape:
                raise ValueError(f"example {index}: {key} has {mask.numel()} entries for {ids.numel()} input_ids")
            masks.append(mask.bool())
    if not masks:
        return None
    out = masks[0]
    for m in masks[1:]:
        out = out & m
    return out


def pad_examples(examples: Sequence[dict], *, pad_id: int = 0, pad_to_multiple_of: int | None = None) -> dict:
    """Tokenised examples as padded real-token rows.

    Returns ``{"ids": [B, L], "attention_mask": [B, L]}`` (long tensors, padding on the right with
    ``pad_id`` and mask 0; ``L`` the longest example, rounded up to ``pad_to_multiple_of``) and,
    when any example says which tokens are predicted, ``"loss_mask"`` ``[B, L]`` (1 where a token
    is a target).  ValueError naming the example for an empty one or mismatched columns.
    """
    if not examples:
        raise ValueError("the batch holds no examples")
    rows, attn, targets = [], [], []
    for i, ex in enumerate(examples):
        if not hasattr(ex, "get"):
            raise TypeError(f"example {i}: expected a dict with input_ids, got {type(ex).__name__}")
        ids = _row(ex, "input_ids", i)
        if ids is None:
            raise ValueError(f"example {i} has no input_ids (tokenise the text first, or give SFTTrainer a text "
                             "column)")
        if ids.numel() == 0:
            raise ValueError(f"example {i} has no tokens")
        mask = _row(ex, "attention_mask", i)
        if mask is not None and mask.shape != ids.shape:
            raise ValueError(f"example {i}: attention_mask has {mask.numel()} entries for {ids.numel()} input_ids")
        rows.append(ids)
        attn.append(torch.ones_like(ids) if mask is None else mask)
        targets.append(_target_mask(ex, ids, i))
    length = max(r.numel() for r in rows)
    if pad_to_multiple_of:
        length = -(-length // pad_to_multiple_of) * pad_to_multiple_of
    b = len(rows)
    out = {"ids": torch.full((b, length), pad_id, dtype=torch.long),
           "attention_mask": torch.zeros((b, length), dtype=torch.long)}
    for i, (ids, mask) in enumerate(zip(rows, attn)):
        out["ids"][i, :ids.numel()] = ids
        out["attention_mask"][i, :ids.numel()] = mask
    if any(t is not None for t in targets):
        loss_mask = torch.zeros((b, length), dtype=torch.long)
        for i, (ids, t) in enumerate(zip(rows, targets)):
            loss_mask[i, :ids.numel()] = 1 if t is None else t.long()
        out["loss_mask"] = loss_mask
    return out


class PauseCollator:
    """``data_collator`` of a Trainer: pads tokenised examples and lays them out with pauses.

    Args:
        objective: the :class:`~cyb.objective.Objective` (or a
            :class:`~cyb.integrations.transformers.PauseTrainingModel`, whose objective is used).
        pad_id: the id written into padding (never attended to nor predicted; default 0).
        pad_to_multiple_of: round the padded length up to a multiple of this.

    Calling it with a list of examples returns ``{"prep": Prepared}``: a
    :class:`cyb.objective.Prepared` on the CPU (inputs, positions, masks and per-step targets of
    the laid-out rows, and the number of target tokens), which the Trainer moves to the device and
    hands to the model's ``forward``.  Random layouts (Recipe 2, the original TBYS's random pauses)
    draw from torch's global generator, which the Trainer seeds.
    """

    def __init__(self, objective, *, pad_id: int | None = None, pad_to_multiple_of: int | None = None):
        self.objective = getattr(objective, "objective", objective)
        self.pad_id = 0 if pad_id is None else int(pad_id)
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, examples: Sequence[dict]) -> dict:
        batch = pad_examples(examples, pad_id=self.pad_id, pad_to_multiple_of=self.pad_to_multiple_of)
        return {BATCH_KEY: self.objective.prepare(batch)}


__all__ = ["BATCH_KEY", "EXAMPLE_COLUMNS", "PauseCollator", "pad_examples"]
