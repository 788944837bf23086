"""Accuracy of answers: exact match and per answer position, on strings or on token ids."""

from __future__ import annotations

from typing import Sequence

import torch


def score(predicted_answers: Sequence[str], answers: Sequence[str]) -> dict:
    """Compare predicted answer strings with the reference answers, character by character.

    Returns a dict:
        ``exact_match``: fraction of examples whose prediction equals the answer exactly.
        ``char_accuracy``: fraction of reference answer characters predicted correctly
            (``pred[j] == answer[j]``; a prediction too short misses the rest).
        ``per_position``: list, entry ``j`` the accuracy at answer character ``j`` over the
            examples whose answer has a character ``j``.
        ``num_examples``: N.
    Strings are compared as given: strip ``<eos>``, padding and pauses before calling.
    """
    if isinstance(predicted_answers, str) or isinstance(answers, str):
        raise TypeError("score takes lists of strings, not a single string")
    if len(predicted_answers) != len(answers):
        raise ValueError(
            f"predicted_answers has {len(predicted_answers)} entries but answers has {len(answers)}"
        )
    if not answers:
        raise ValueError("score needs at least one example")
    width = max(len(a) for a in answers)
    correct = [0] * width
    total = [0] * width
    exact = 0
    for pred, ref in zip(predicted_answers, answers):
        exact += pred == ref
        for j, c in enumerate(ref):
            total[j] += 1
            correct[j] += j < len(pred) and pred[j] == c
    return {
        "exact_match": exact / len(answers),
        "char_accuracy": sum(correct) / max(sum(total), 1),
        "per_position": [c / t for c, t in zip(correct, total)],
        "num_examples": len(answers),
    }


def shift_predictions(next_token_ids: torch.Tensor, fill: int = -1) -> torch.Tensor:
    """Align next-token predictions with the tokens they predict.

    ``next_token_ids[:, j]`` (e.g. ``logits.argmax(-1)``) is the prediction for token ``j + 1``;
    the result ``[N, L]`` holds it at column ``j + 1``, with ``fill`` in column 0 (which no
    model predicts), so it lines up with ``ids`` and ``loss_mask``.
    """
    if next_token_ids.dim() != 2:
        raise ValueError(f"next_token_ids must be [N, L], got shape {tuple(next_token_ids.shape)}")
    out = torch.full_like(next_token_ids, fill)
    out[:, 1:] = next_token_ids[:, :-1]
    return out


def answer_token_accuracy(
    pred_ids: torch.Tensor, target_ids: torch.Tensor, loss_mask: torch.Tensor
) -> dict:
    """Accuracy of predicted tokens on the positions of ``loss_mask`` (answer + ``<eos>``).

    Args:
        pred_ids: ``[N, L]`` predicted id for each position, aligned with ``target_ids``
            (see :func:`shift_predictions`).
        target_ids: ``[N, L]`` reference ids (a dataset's ``ids``).
        loss_mask: ``[N, L]`` bool, the positions to score.
    Returns a dict of Python numbers:
        ``token_accuracy``: correct / scored tokens.
        ``exact_match``: fraction of examples (rows with at least one scored token) whose
            scored tokens are all correct.
        ``per_position``: list, entry ``k`` the accuracy at the ``k``-th scored token of a row
            (answer character ``k``; the ``<eos>`` is each row's last).
        ``correct_tokens``, ``num_tokens``, ``correct_examples``, ``num_examples``: the counts,
            so results of several batches can be summed.
    """
    if not (pred_ids.shape == target_ids.shape == loss_mask.shape) or pred_ids.dim() != 2:
        raise ValueError(
            "pred_ids, target_ids and loss_mask must all be [N, L], got "
            f"{tuple(pred_ids.shape)}, {tuple(target_ids.shape)}, {tuple(loss_mask.shape)}"
        )
    mask = loss_mask.bool()
    hit = (pred_ids == target_ids) & mask
    num_tokens = int(mask.sum())
    if num_tokens == 0:
        raise ValueError("loss_mask selects no tokens")
    scored_rows = mask.any(dim=1)
    row_ok = (hit.sum(dim=1) == mask.sum(dim=1)) & scored_rows
    position = mask.long().cumsum(dim=1) - 1  # k-th scored token of its row
    width = int(position.max()) + 1
    per_correct = torch.zeros(width, dtype=torch.long).index_add_(
        0, position[mask].cpu(), hit[mask].long().cpu()
    )
    per_total = torch.bincount(position[mask].cpu(), minlength=width)
    return {
        "token_accuracy": int(hit.sum()) / num_tokens,
        "exact_match": int(row_ok.sum()) / int(scored_rows.sum()),
        "per_position": (per_correct / per_total).tolist(),
        "correct_tokens": int(hit.sum()),
        "num_tokens": num_tokens,
        "correct_examples": int(row_ok.sum()),
        "num_examples": int(scored_rows.sum()),
    }
