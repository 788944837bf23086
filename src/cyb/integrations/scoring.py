"""Log-likelihood of tokens under the pause readout, a batch of sequences at a time.

The scoring behind the lm-evaluation-harness model's ``loglikelihood`` (:mod:`.lm_eval`) and
the server's prompt log-probabilities (``echo`` with ``logprobs``, :mod:`cyb.serve`), kept
apart from both so that it can be used and timed alone.  One forward of the left-padded batch in
the Recipe 1 layout; then the blocks of the tokens to score (only those: never the logits of the
whole context) are read out together, a chunk of blocks at a time, and the results come back
to the host in one read.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from ..decision import greedy_decision
from ..layout import collapse, expand, left_pad
from ..losses import cyb_loss, stop_log_probs
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


def _last_blocks(model, inputs: list[list[int]], counts: list[int]):
    """One forward of ``inputs`` (real ids, left-padded, Recipe 1 layout); returns the hidden
    states ``[N, M, H]`` of the last ``counts[r]`` blocks of every row ``r``, rows in order, and
    the row of each block ``[N]``."""
    device = model.device
    ids, mask = left_pad(inputs, device)
    length, m = ids.shape[1], model.num_steps
    layout = expand(ids, model.vocab, attention_mask=mask)
    hidden, _ = model.hidden_states(layout.input_ids, layout.position_ids, layout.attention_mask,
                                    steps=layout.steps)
    blocks = collapse(hidden, m)  # [B, L, M, H]
    lens = torch.tensor(counts, device=device)
    rows = torch.repeat_interleave(torch.arange(len(inputs), device=device), lens)
    starts = torch.repeat_interleave(length - lens, lens)
    offset = torch.arange(rows.shape[0], device=device) - torch.repeat_interleave(lens.cumsum(0) - lens, lens)
    return blocks[rows, starts + offset], rows


def _read_blocks(model, picked: torch.Tensor, target: torch.Tensor, *, top: int = 0,
                 logits_per_chunk: int = LOGITS_PER_CHUNK):
    """Read out blocks ``picked [N, M, H]`` against ``target [N]``, a chunk at a time.

    Returns ``(ll, greedy, greedy_ll, top_ids, top_ll)``: the target's log-likelihood
    (:func:`token_log_likelihood`, float64 ``[N]``), the token the greedy sequential readout
    picks (:func:`cyb.decision.greedy_decision`, ``[N]``), that token's log-likelihood computed
    as the target's is (bit-equal to ``ll`` where it is the target), and with ``top > 0`` the
    ``top`` real tokens of highest log-likelihood other than the greedy one (``[N, top]`` ids
    and float64 values; pause and dk ids never among them), else None twice.
    """
    n, m = target.shape[0], model.num_steps
    device = picked.device
    dk_id, dk_bias = model.settings.dk_id, model.dk_bias
    has_dk = dk_id is not None
    ll = torch.empty(n, dtype=torch.float64, device=device)
    greedy = torch.empty(n, dtype=torch.long, device=device)
    greedy_ll = torch.empty(n, dtype=torch.float64, device=device) if top else None
    top_ids = torch.empty((n, top), dtype=torch.long, device=device) if top else None
    top_ll = torch.empty((n, top), dtype=torch.float64, device=device) if top else None
    special = sorted(model.vocab.special_ids)
    step = max(1, logits_per_chunk // (m * model.vocab.vocab_size * (2 if top else 1)))
    for s in range(0, n, step):
        logits = model.logits(picked[s:s + step])  # [c, M, V]
        tgt = target[s:s + step]
        log_t, log_d, log_not_d = readout(logits, tgt.unsqueeze(-1).expand(-1, m), dk_id=dk_id, dk_bias=dk_bias)
        ll[s:s + step] = token_log_likelihood(log_t, log_d, log_not_d, has_dk=has_dk)
        token, _ = greedy_decision(logits, dk_id=dk_id, dk_bias=dk_bias)
        greedy[s:s + step] = token
        if not top:
            continue
        g_t, g_d, g_nd = readout(logits, token.unsqueeze(-1).expand(-1, m), dk_id=dk_id, dk_bias=dk_bias)
        greedy_ll[s:s + step] = token_log_likelihood(g_t, g_d, g_nd, has_dk=has_dk)
        z = logits.float()
        if has_dk:  # log sum_i Pr(S=i) t_i(v) for every v: t_i renormalised without dk
            z = z.index_fill(-1, torch.tensor([dk_id], device=device), float("-inf"))
            marginal = torch.logsumexp(stop_log_probs(log_d, log_not_d).unsqueeze(-1) + z.log_softmax(-1), dim=-2)
        else:
            marginal = z[:, -1].log_softmax(-1)
        banned = torch.tensor(special, dtype=torch.long, device=device)
        if special:
            marginal = marginal.index_fill(-1, banned, float("-inf"))
        marginal = marginal.scatter(-1, token.unsqueeze(-1), float("-inf"))
        k = min(top, marginal.shape[-1])
        values, ids = marginal.topk(k, dim=-1)
        top_ids[s:s + step, :k] = ids
        top_ll[s:s + step, :k] = values.double()
    return ll, greedy, greedy_ll, top_ids, top_ll


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
    picked, rows = _last_blocks(model, inputs, [len(pairs[j][1]) for j in live])
    target = torch.tensor([t for j in live for t in pairs[j][1]], dtype=torch.long, device=device)
    ll, greedy, *_ = _read_blocks(model, picked, target, logits_per_chunk=logits_per_chunk)
    totals = torch.zeros(len(live), dtype=torch.float64, device=device).index_add_(0, rows, ll)
    misses = torch.zeros(len(live), dtype=torch.float64, device=device).index_add_(0, rows, (greedy != target).double())
    for j, (total, missed) in zip(live, torch.stack([totals, misses], 1).tolist()):
        results[j] = (total, missed == 0)
    return results


class TokenScores(NamedTuple):
    """Per token ``k >= 1`` of a sequence (lists of ``len(sequence) - 1``), given tokens ``< k``.

    Attributes:
        log_likelihood: the token's log-likelihood under the readout (:func:`token_log_likelihood`).
        greedy: the token the greedy sequential readout picks there.
        greedy_log_likelihood: that token's log-likelihood (equal to ``log_likelihood`` where
            it is the token).
        top: with ``top > 0``: the ``top`` other real tokens of highest log-likelihood, as
            ``(id, log-likelihood)`` pairs, most likely first; else empty lists.
    """

    log_likelihood: list
    greedy: list
    greedy_log_likelihood: list
    top: list


@torch.inference_mode()
def score_tokens(model, sequences: Sequence[Sequence[int]], *, top: int = 0,
                 logits_per_chunk: int = LOGITS_PER_CHUNK) -> list[TokenScores]:
    """:class:`TokenScores` of every token but the first of each sequence, scored as one batch
    (the readout of :func:`score_batch`: summing ``log_likelihood`` over a continuation gives
    its score).  ``top > 0`` also lists the most likely other tokens at each position, from the
    marginal ``log sum_i Pr(S=i | d) t_i(v)`` over real tokens ``v`` (``log t_M(v)`` without dk).
    Sequences of one token score nothing (empty lists); no sequence is truncated."""
    empty = TokenScores([], [], [], [])
    results = [empty] * len(sequences)
    live = [j for j, seq in enumerate(sequences) if len(seq) > 1]
    if not live:
        return results
    device = model.device
    inputs = [list(sequences[j][:-1]) for j in live]
    counts = [len(x) for x in inputs]
    picked, _ = _last_blocks(model, inputs, counts)
    target = torch.tensor([t for j in live for t in sequences[j][1:]], dtype=torch.long, device=device)
    ll, greedy, greedy_ll, top_ids, top_ll = _read_blocks(model, picked, target, top=top,
                                                          logits_per_chunk=logits_per_chunk)
    ll, greedy = ll.tolist(), greedy.tolist()
    if top:
        greedy_ll, top_ids, top_ll = greedy_ll.tolist(), top_ids.tolist(), top_ll.tolist()
    start = 0
    for j, n in zip(live, counts):
        end = start + n
        results[j] = TokenScores(
            ll[start:end], greedy[start:end],
            greedy_ll[start:end] if top else [],
            [list(zip(i, v)) for i, v in zip(top_ids[start:end], top_ll[start:end])] if top else [])
        start = end
    return results
