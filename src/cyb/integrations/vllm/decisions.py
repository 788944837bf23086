"""What the readout decides for a batch of rows, whichever vLLM runner calls it: pure tensor
functions of one step (no vLLM here).

* :class:`RequestSettings`: what the readout takes from a request's sampling settings;
* :func:`decide`: whether each row answers at its step, and with which token (cyb's engine's
  rule, with each request's own random stream);
* :func:`feed`: what each row feeds next in its mode, and the step code of that token;
* :func:`force`: the logits left with that one finite entry.

:mod:`~cyb.integrations.vllm.readout` explains the rule and the step code.
"""

from __future__ import annotations

import math

import torch

from ...decision import inverse_cdf, stream_uniforms
from .pauses import ServedPauses

#: vLLM's bound below which a temperature means greedy decoding
GREEDY_BELOW = 1e-5


class RequestSettings:
    """What the readout takes from one request's ``SamplingParams``: its mode, greedy or not,
    the temperature (1 when greedy), top-k (0: off), top-p (1: off) and the key of its stream
    (from its seed, else drawn)."""

    __slots__ = ("mode", "greedy", "temperature", "top_k", "top_p", "key")

    def __init__(self, params, default_mode: str) -> None:
        from ...decision import KEY_LIMIT, row_keys

        extra = params.extra_args or {}
        self.mode = extra.get("mode", default_mode)
        t = float(params.temperature)
        self.greedy = t < GREEDY_BELOW
        self.temperature = 1.0 if self.greedy else t
        k = int(params.top_k or 0)
        self.top_k = k if k > 0 else 0
        self.top_p = float(params.top_p if params.top_p is not None else 1.0)
        seed = params.seed
        self.key = row_keys(1, seed=int(seed))[0] if seed is not None else int(
            torch.randint(0, KEY_LIMIT, (1,)).item())


def _filter(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, *, max_k: int | None = None,
            any_p: bool | None = None) -> torch.Tensor:
    """Top-k (``[n]`` long, 0: off) then nucleus top-p (``[n]`` float, 1: off) per row of ``z``
    (``[n, V]``), as :func:`cyb.decision.filter_logits` does for one setting.  ``max_k`` (the
    largest top-k in use, 0: none) and ``any_p`` (whether a row uses top-p), when the caller
    knows them on the host, spare the device reads that find them."""
    v = z.shape[-1]
    on = (top_k > 0) & (top_k < v)
    if max_k is None:
        max_k = int(top_k[on].max()) if bool(on.any()) else 0
    if max_k > 0:
        kk = min(max_k, v)
        values = z.topk(kk, dim=-1).values
        kth = values.gather(1, (top_k.clamp(1, kk) - 1).unsqueeze(1))
        z = torch.where(on.unsqueeze(1) & (z < kth), -math.inf, z)
    on = (top_p > 0) & (top_p < 1)
    if any_p is None:
        any_p = bool(on.any())
    if any_p:
        sorted_z, order = z.sort(dim=-1, descending=True)
        probs = sorted_z.softmax(-1)
        drop_sorted = ((probs.cumsum(-1) - probs) >= top_p.unsqueeze(1)) & on.unsqueeze(1)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, -math.inf)
    return z


def decide(pauses: ServedPauses, logits: torch.Tensor, step: torch.Tensor, key: torch.Tensor,
           counter: torch.Tensor, greedy: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
           top_p: torch.Tensor, *, sample: bool | None = None, max_k: int | None = None,
           any_p: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(answers, token)``, each ``[n]``: whether each row answers at its ``step`` (1-based) and
    the token it answers (meaningful where it does), from ``logits [n, V]``.

    The rule of cyb's engine for one step: dk (with the prior) against the best real token, or
    the request's uniform of the step against ``d``; at step ``M`` an answer; the token the best
    real one or a draw with the request's token uniform.  ``sample`` (whether any row samples),
    ``max_k`` and ``any_p`` (see :func:`_filter`): host knowledge that spares device reads.
    """
    m, dk = pauses.num_steps, pauses.dk_id
    z = logits.float()
    if dk is not None:
        zdk = z[:, dk] + pauses.dk_bias
    z = z.clone()
    masked = torch.tensor(sorted(pauses.special_ids), dtype=torch.long, device=z.device)
    if masked.numel():
        z.index_fill_(-1, masked, -math.inf)
    best, token = z.max(-1)
    if sample is None:
        sample = not bool(greedy.all())
    uniforms = stream_uniforms(key, counter, m + 1) if sample else None
    if dk is None:
        wants_dk = torch.ones_like(greedy)
    else:
        wants_dk = (zdk > best) | ((zdk == best) & (token > dk))
        if sample:
            total = torch.logaddexp(torch.logsumexp(z, -1), zdk)
            lane = (step - 1).clamp(max=m - 1)
            sampled_dk = uniforms.gather(1, lane.unsqueeze(1)).squeeze(1) < (zdk - total).exp()
            wants_dk = torch.where(greedy, wants_dk, sampled_dk)
    answers = ~wants_dk | (step >= m)
    if sample:
        tempered = _filter(z / torch.where(greedy, 1.0, temperature).unsqueeze(1), top_k, top_p, max_k=max_k,
                           any_p=any_p)
        drawn = inverse_cdf(tempered.softmax(-1), uniforms[:, m])
        token = torch.where(greedy, token, drawn)
    return answers, token


def pause_table(pauses: ServedPauses, device) -> torch.Tensor:
    """``[M]`` long: the pause fed after step ``s`` at index ``s - 1`` (index ``M - 1``, after
    the last step, is never fed)."""
    return torch.tensor([*pauses.pause_ids, 0][: pauses.num_steps], dtype=torch.long, device=device)


def feed(pauses: ServedPauses, fixed: torch.Tensor, step: torch.Tensor, answers: torch.Tensor, token: torch.Tensor,
         first: torch.Tensor, first_token: torch.Tensor, pauses_after: torch.Tensor,
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token, code)``, each ``[n]``: what each row feeds next and its step code.

    Args:
        fixed: ``[n]`` bool, the row's mode is fixed (else adaptive).
        step, answers, token: the row's step and what :func:`decide` read out at it.
        first, first_token: fixed mode's first step of the current block that answered and its
            token (read where ``step`` is ``M``).
        pauses_after: :func:`pause_table`.

    Fixed mode feeds the next pause before step ``M`` and the first answer at ``M``; adaptive
    mode the answer when there is one, else the next pause.  A real token's code is the step
    it was read at, a pause's 0.
    """
    pause = pauses_after[(step - 1).clamp(0, pauses.num_steps - 1)]
    at_last = step >= pauses.num_steps
    zero = torch.zeros_like(step)
    out = torch.where(fixed, torch.where(at_last, first_token, pause), torch.where(answers, token, pause))
    code = torch.where(fixed, torch.where(at_last, first, zero), torch.where(answers, step, zero))
    return out, code


def force(logits: torch.Tensor, rows: torch.Tensor | None, token: torch.Tensor, code: torch.Tensor,
          temperature: torch.Tensor) -> torch.Tensor:
    """Leave one finite logit in each of ``rows`` of ``logits`` (all rows when None): ``code``
    times the row's temperature at ``token`` (vLLM divides a sampled row's logits by its
    temperature before it reports them, so the reported value is the code)."""
    value = (code.to(torch.float32) * temperature.to(torch.float32)).to(logits.dtype)
    if rows is None:
        logits.fill_(-math.inf)
        logits.scatter_(1, token.unsqueeze(1), value.unsqueeze(1))
    else:
        logits.index_fill_(0, rows, -math.inf)
        logits[rows, token] = value
    return logits


__all__ = ["GREEDY_BELOW", "RequestSettings", "decide", "feed", "force", "pause_table"]
