"""Decisions of the engine's rows: where each row stops and which token it answers.

Every row carries its own settings (greedy or sampled, temperature, top-k, top-p) and its own
random stream (:func:`cyb.decision.stream_uniforms`: the uniforms of a decision depend on the
row's key and the index of the token being decided, nothing else).  A step hands over the
logits of ``Q`` consecutive steps of each row's block, starting at the row's current step
(``Q = 1``: one step; ``Q = M``: a whole block, steps ``1 .. M``), and the readout is the
paper's sequential decision over them:

* at step ``i < M`` the row says ``<don't know>`` (greedy: dk is the argmax over ``{dk} U V``
  under the dk prior; sampled: the uniform of lane ``i - 1`` is below ``d_i``), else it answers;
* at step ``M`` it must answer;
* the answer is the argmax without dk (greedy), or a draw from the distribution without dk,
  divided by the temperature and cut by top-k and top-p, with the uniform of lane ``M``.

These are the decisions of :func:`cyb.decision.greedy_decision` and
:func:`cyb.decision.sample_decision` given the same uniforms, row by row.  Pause ids are never
answers: their logits are ``-inf`` before anything is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..decision import inverse_cdf, stream_uniforms


@dataclass(frozen=True)
class SamplingKind:
    """What the rows of one step need beyond greedy decisions (host-side; each kind is its own
    captured graph): whether any row samples, the largest top-k of a sampling row (0: none),
    whether any sampling row uses top-p."""

    sample: bool = False
    top_k: int = 0
    top_p: bool = False


def sampling_kind(requests) -> SamplingKind:
    """What the readout of rows deciding ``requests`` (:class:`cyb.engine.Request`) needs: top-k
    rounded up to a power of two (one captured graph serves many)."""
    sampled = [r for r in requests if not r.greedy]
    if not sampled:
        return SamplingKind()
    top_k = max(r.top_k for r in sampled)
    if top_k:
        k = 1
        while k < top_k:
            k *= 2
        top_k = k
    return SamplingKind(True, top_k, any(r.top_p < 1 for r in sampled))


@dataclass
class Decision:
    """What the readout of ``Q`` steps of ``n`` rows found.

    Attributes:
        stop: ``[n]`` bool, the row answered at one of these steps.
        at: ``[n]`` long, the index (``0 .. Q-1``) of the step it answered at (0 where not).
        token: ``[n]`` long, the answer (meaningful where ``stop``).
        log_d, log_not_d: ``[n, Q]`` float32 ``log d_i`` and ``log(1 - d_i)`` under the dk prior
            (``d_i = 1`` without dk); the caller sets ``d_M = 0``.
    """

    stop: torch.Tensor
    at: torch.Tensor
    token: torch.Tensor
    log_d: torch.Tensor
    log_not_d: torch.Tensor


class RowReadout:
    """The decision rule of a model's rows (its ``M``, pause ids, dk id and dk prior).

    Args:
        vocab: the model's :class:`cyb.layout.PauseVocab`.
        dk_bias: the dk prior offset (:attr:`cyb.PauseModel.dk_bias`).
        device: where the rows live.
        read_at: an ablation: every token is read out at this step (1: no pause; ``M`` or
            more: every pause), whatever ``d`` says (``d`` is still reported); None: the model's
            own decisions.
    """

    def __init__(self, vocab, dk_bias: float, device, read_at: int | None = None) -> None:
        self.read_at = read_at
        self.m = vocab.num_steps
        self.dk_id = vocab.dk_id
        self.dk_bias = float(dk_bias)
        masked = sorted(set(vocab.pause_ids) | ({vocab.dk_id} if vocab.dk_id is not None else set()))
        #: ids that are never answers: the pauses and dk
        self.masked = torch.tensor(masked, dtype=torch.long, device=device) if masked else None

    def decide(self, logits: torch.Tensor, step: torch.Tensor, key: torch.Tensor, counter: torch.Tensor,
               greedy: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
               kind: SamplingKind) -> Decision:
        """Read out ``logits [n, Q, V]`` of steps ``step[b] .. step[b] + Q - 1`` of each row.

        ``key``, ``counter``: the rows' streams and the index of the token each decides;
        ``greedy [n]`` bool, ``temperature [n]`` float, ``top_k [n]`` long (0: off),
        ``top_p [n]`` float (1: off): the rows' settings; ``kind`` says which of them any row
        uses.  Fixed shapes, no host read.  One float copy of the logits, one max and one
        log-sum-exp over the vocabulary (the dk decision compares the dk logit with the best
        real token's: ``argmax`` over ``{dk} U V`` is dk exactly when the dk logit is larger, or
        equal with the smaller id).
        """
        n, q, _ = logits.shape
        z = logits.float()
        dk = self.dk_id
        if dk is not None:
            zdk = z[..., dk] + self.dk_bias  # [n, Q] (a copy, taken before the masking below)
        if z.data_ptr() == logits.data_ptr():
            z = z.clone()  # float32 logits: keep the caller's
        if self.masked is not None:
            z.index_fill_(-1, self.masked, -math.inf)  # z: the real tokens' logits
        best, token = z.max(-1)  # [n, Q]: the best real token of each step (its first index)
        rest = torch.logsumexp(z, -1)
        steps = step.unsqueeze(1) + torch.arange(q, device=z.device)  # [n, Q], 1-based
        last = steps >= self.m
        uniforms = stream_uniforms(key, counter, self.m + 1) if kind.sample else None  # [n, M+1]
        if dk is None:
            log_d = torch.zeros_like(rest)
            log_not_d = torch.full_like(rest, -math.inf)
            wants_dk = torch.ones_like(last)
        else:
            total = torch.logaddexp(rest, zdk)
            log_d, log_not_d = zdk - total, rest - total
            wants_dk = (zdk > best) | ((zdk == best) & (token > dk))
            if kind.sample:
                lane = (steps - 1).clamp(max=self.m - 1)
                sampled_dk = uniforms.gather(1, lane) < log_d.exp()
                wants_dk = torch.where(greedy.unsqueeze(1), wants_dk, sampled_dk)
        if self.read_at is not None:
            wants_dk = steps < self.read_at
        answers = ~wants_dk | last
        index = torch.arange(q, device=z.device).expand(n, q)
        at = torch.where(answers, index, torch.full_like(index, q)).amin(-1)
        stop = at < q
        at = at.clamp(max=q - 1)
        answer = token.gather(1, at.unsqueeze(1)).squeeze(1)
        if kind.sample:
            chosen = z.gather(1, at.view(n, 1, 1).expand(n, 1, z.shape[-1])).squeeze(1)  # [n, V]
            tempered = chosen / torch.where(greedy, 1.0, temperature).unsqueeze(1)
            tempered = filter_rows(tempered, top_k if kind.top_k else None, top_p if kind.top_p else None,
                                   kind.top_k)
            drawn = inverse_cdf(tempered.softmax(-1), uniforms[:, self.m])
            answer = torch.where(greedy, answer, drawn)
        return Decision(stop, at, answer, log_d, log_not_d)


def filter_rows(z: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                max_k: int = 0) -> torch.Tensor:
    """:func:`cyb.decision.filter_logits` with a top-k and a top-p per row: ``z [n, V]``,
    ``top_k [n]`` long (0 or >= V: off; ``max_k`` the largest, which bounds the work),
    ``top_p [n]`` float (1: off)."""
    v = z.shape[-1]
    if top_k is not None and max_k > 0:
        kk = min(max_k, v)
        values = z.topk(kk, dim=-1).values  # [n, kk] descending
        on = (top_k > 0) & (top_k < v)
        kth = values.gather(1, (top_k.clamp(1, kk) - 1).unsqueeze(1))
        z = torch.where(on.unsqueeze(1) & (z < kth), -math.inf, z)
    if top_p is not None:
        sorted_z, order = z.sort(dim=-1, descending=True)
        probs = sorted_z.softmax(-1)
        cum = probs.cumsum(-1)
        on = (top_p > 0) & (top_p < 1)
        drop_sorted = ((cum - probs) >= top_p.unsqueeze(1)) & on.unsqueeze(1)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, -math.inf)
    return z


__all__ = ["Decision", "RowReadout", "SamplingKind", "filter_rows", "sampling_kind"]
