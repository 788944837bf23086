"""Log-likelihood of continuations under the pause readout, a batch of requests at a time.

The scoring behind the lm-evaluation-harness model's ``loglikelihood`` (:mod:`.lm_eval`), kept
apart from the harness so that it can be used and timed without it.  One forward of the
left-padded batch in the Recipe 1 layout; then the blocks of every row's continuation tokens
(only those: never the logits of the whole context) are read out together, a chunk of blocks
at a time, and the per-row sums come back to the host in one read.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..decision import greedy_decision
from ..layout import collapse, expand, left_pad
from ..losses import cyb_loss
from ..readout import readout

#: logits held at once when scoring continuation blocks
LOGITS_PER_CHUNK = 1 << 24


def token_log_likelihood(log_t: torch.Tensor, log_d: torch.Tensor, log_not_d: torch.Tensor,
                         *, has_dk: bool) -> torch.Tensor:
    """Log-likelihood of each real token's target under the model's readout.

    Args:
        log_t, log_d, log_not_d: ``[..., M]`` per-step readout (:func:`cyb.readout.readout`).
        has_dk: the model has a dk output.

    Returns:
        ``[...]`` (float32, or float64 for float64 input): ``-cyb_loss`` with ``omega`` one-hot
        on ``M`` and ``gamma = 1`` (``log sum_i Pr(S=i | d) t_i``) with dk; else ``log t_M``
        (TBYS reads out at the last step; with ``M = 1`` plain log-softmax).
    """
    if has_dk:
        return -cyb_loss(log_t, log_d, log_not_d)
    return log_t[..., -1]


@torch.inference_mode()
def score_batch(model, pairs: Sequence[tuple[list[int], list[int]]], *, max_length: int,
                logits_per_chunk: int = LOGITS_PER_CHUNK) -> list[tuple[float, bool]]:
    """``(sum of continuation log-likelihoods, greedy readout gives every continuation token)``
    per ``(context ids, continuation ids)`` pair, scored as one batch.

    Each sequence (context then continuation) keeps its last ``max_length + 1`` tokens; the last
    token is never fed (it is only a target).  The block of token ``k`` predicts token ``k + 1``
    (:func:`token_log_likelihood`); ``is_greedy`` asks :func:`cyb.decision.greedy_decision` of
    every continuation block.  An empty continuation scores ``(0.0, True)``.
    """
    results = [(0.0, True)] * len(pairs)
    live = [j for j, (_, cont) in enumerate(pairs) if cont]
    if not live:
        return results
    device = model.device
    inputs = [(pairs[j][0] + pairs[j][1])[-(max_length + 1):][:-1] for j in live]
    ids, mask = left_pad(inputs, device)
    length, m = ids.shape[1], model.num_steps
    layout = expand(ids, model.vocab, attention_mask=mask)
    hidden, _ = model.hidden_states(layout.input_ids, layout.position_ids, layout.attention_mask,
                                    steps=layout.steps)
    blocks = collapse(hidden, m)  # [B, L, M, H]
    lens = torch.tensor([len(pairs[j][1]) for j in live], device=device)
    rows = torch.repeat_interleave(torch.arange(len(live), device=device), lens)
    starts = torch.repeat_interleave(length - lens, lens)
    offset = torch.arange(rows.shape[0], device=device) - torch.repeat_interleave(lens.cumsum(0) - lens, lens)
    picked = blocks[rows, starts + offset]  # [N, M, H]: every continuation block of the batch
    target = torch.tensor([t for j in live for t in pairs[j][1]], dtype=torch.long, device=device)
    dk_id, dk_bias = model.settings.dk_id, model.dk_bias
    ll = torch.empty(target.shape[0], dtype=torch.float64, device=device)
    greedy = torch.empty(target.shape[0], dtype=torch.bool, device=device)
    step = max(1, logits_per_chunk // (m * model.vocab.vocab_size))
    for s in range(0, target.shape[0], step):
        logits = model.logits(picked[s:s + step])  # [n, M, V]
        tgt = target[s:s + step]
        log_t, log_d, log_not_d = readout(logits, tgt.unsqueeze(-1).expand(-1, m),
                                          dk_id=dk_id, dk_bias=dk_bias)
        ll[s:s + step] = token_log_likelihood(log_t, log_d, log_not_d, has_dk=dk_id is not None)
        token, _ = greedy_decision(logits, dk_id=dk_id, dk_bias=dk_bias)
        greedy[s:s + step] = token == tgt
    totals = torch.zeros(len(live), dtype=torch.float64, device=device).index_add_(0, rows, ll)
    misses = torch.zeros(len(live), dtype=torch.float64, device=device).index_add_(0, rows, (~greedy).double())
    for j, (total, missed) in zip(live, torch.stack([totals, misses], 1).tolist()):
        results[j] = (total, missed == 0)
    return results
