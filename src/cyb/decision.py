"""Reading a token out of a block of ``M`` steps: greedy sequential decision or sampling.

At step ``i < M`` the model either says ``<don't know>`` (dk: look at step ``i + 1``) or answers
with a token; at step ``M`` it must answer.  Models without dk (TBYS) answer at step ``M``;
baselines have ``M = 1``.

* Greedy (the paper's downstream evaluation): at step ``i`` take the argmax over
  ``{dk} U V`` of the softmax with the dk prior; dk -> next step; at step ``M`` the argmax
  without dk.
* Sampling: dk with probability ``d_i``, else a token from the distribution renormalised
  without dk, with temperature, top-k and top-p; at step ``M`` always a token.
"""

from __future__ import annotations

import torch


def _step_logits(logits: torch.Tensor, dk_id: int | None, dk_bias: float) -> torch.Tensor:
    z = logits.float()
    if dk_id is not None and dk_bias:
        z = z.clone()
        z[..., dk_id] += dk_bias
    return z


def greedy_decision(logits: torch.Tensor, *, dk_id: int | None = None, dk_bias: float = 0.0,
                    num_valid_steps: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy sequential readout of blocks of steps.

    Args:
        logits: ``[..., M, V]`` the logits of the ``M`` steps of each block.
        dk_id, dk_bias: the dk id (None: answer at step ``M``) and its prior bias.
        num_valid_steps: ``[...]`` optional number of steps each block has (Recipe 2: ``W``);
            the answer is forced at the last valid step.

    Returns:
        ``(token [...], steps_used [...])`` with ``steps_used`` in ``1..M``.
    """
    m = logits.shape[-2]
    z = _step_logits(logits, dk_id, dk_bias)
    last = torch.full(z.shape[:-2], m, dtype=torch.long, device=z.device)
    if num_valid_steps is not None:
        last = num_valid_steps.long().clamp(1, m)
    if dk_id is None:
        tokens = z.argmax(-1)  # [..., M]
        steps = last
    else:
        best = z.argmax(-1)
        wants_dk = best == dk_id
        z_no_dk = z.clone()
        z_no_dk[..., dk_id] = float("-inf")
        tokens = z_no_dk.argmax(-1)
        step_idx = torch.arange(1, m + 1, device=z.device)
        # answer at the first step that is not dk, or at the last valid step
        answers = (~wants_dk) | (step_idx >= last.unsqueeze(-1))
        steps = torch.where(answers, step_idx, torch.full_like(step_idx, m + 1)).amin(-1)
    token = tokens.gather(-1, (steps - 1).unsqueeze(-1)).squeeze(-1)
    return token, steps


def filter_logits(z: torch.Tensor, *, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Mask logits outside the top-k / nucleus top-p set with ``-inf`` (``[..., V]``)."""
    if top_k is not None and top_k > 0 and top_k < z.shape[-1]:
        kth = z.topk(top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p is not None and 0.0 < top_p < 1.0:
        sorted_z, order = z.sort(dim=-1, descending=True)
        probs = sorted_z.softmax(-1)
        cum = probs.cumsum(-1)
        drop_sorted = (cum - probs) >= top_p  # keep the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return z


def sample_decision(logits: torch.Tensor, *, dk_id: int | None = None, dk_bias: float = 0.0,
                    temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                    generator: torch.Generator | None = None,
                    num_valid_steps: torch.Tensor | None = None,
                    uniforms: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled sequential readout; same shapes as :func:`greedy_decision`.

    dk is taken with probability ``d_i`` (temperature does not change it); the token is drawn
    from the tempered, filtered distribution without dk.

    All randomness comes from ``uniforms`` ``[..., M + 1]`` in ``[0, 1)``: ``u_i`` for the dk
    decision at step ``i`` (dk when ``u_i < d_i``) and ``u_{M+1}`` for the token (inverse CDF
    over the vocabulary).  None: drawn with :func:`draw_uniforms` from ``generator``.  Given
    the uniforms the decision is a fixed-shape device computation with no host read (it can be
    captured in a CUDA graph), so decoders that feed the same uniforms decide alike.
    """
    if temperature <= 0:
        return greedy_decision(logits, dk_id=dk_id, dk_bias=dk_bias, num_valid_steps=num_valid_steps)
    m = logits.shape[-2]
    z = _step_logits(logits, dk_id, dk_bias)
    lead = z.shape[:-2]
    last = torch.full(lead, m, dtype=torch.long, device=z.device)
    if num_valid_steps is not None:
        last = num_valid_steps.long().clamp(1, m)
    if uniforms is None:
        uniforms = draw_uniforms(tuple(lead), m, generator).to(z.device)
    elif tuple(uniforms.shape) != (*lead, m + 1):
        raise ValueError(f"uniforms must have shape {(*lead, m + 1)}, got {tuple(uniforms.shape)}")
    step_idx = torch.arange(1, m + 1, device=z.device)
    if dk_id is None:
        steps = last
    else:
        d = z.softmax(-1)[..., dk_id]  # [..., M]
        answers = (uniforms[..., :m] >= d) | (step_idx >= last.unsqueeze(-1))
        steps = torch.where(answers, step_idx, torch.full_like(step_idx, m + 1)).amin(-1)
    chosen = z.gather(-2, (steps - 1).view(*lead, 1, 1).expand(*lead, 1, z.shape[-1])).squeeze(-2)
    if dk_id is not None:
        chosen = chosen.clone()
        chosen[..., dk_id] = float("-inf")
    chosen = filter_logits(chosen / temperature, top_k=top_k, top_p=top_p)
    token = inverse_cdf(chosen.softmax(-1), uniforms[..., m])
    return token, steps


def draw_uniforms(lead: tuple, num_steps: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``[*lead, num_steps + 1]`` float32 uniforms in ``[0, 1)`` from a CPU generator: what
    :func:`sample_decision` consumes for one decision per entry of ``lead``."""
    return torch.rand((*lead, num_steps + 1), generator=generator, device="cpu")


# ----------------------------------------------------------------------------- per-row streams
#
# Decoders that batch prompts draw each row's randomness from that row's own stream: the
# uniforms of a decision are a hash of (the row's key, the index of the token being decided,
# the lane), computed with integer tensor operations on whatever device the row lives on.  A
# row's samples then depend on its key and nothing else: not on the batch, its neighbours, the
# slot it runs in, when it joined, or the decoder (and, being a pure function, the computation
# can be captured in a CUDA graph).  Lanes of one token: ``0 .. M-1`` the dk draws of steps
# ``1 .. M``, ``M`` the token draw (the layout :func:`sample_decision` consumes).

_MASK32 = 0xFFFFFFFF
#: keys are drawn below this bound (non-negative int64)
KEY_LIMIT = 1 << 62


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for int64 ``x`` in ``[0, 2**32)`` without int64 overflow (the
    product is formed from 16-bit halves)."""
    lo = (x & 0xFFFF) * c
    hi = ((x >> 16) * c) & 0xFFFF
    return (lo + (hi << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash with full avalanche (lowbias32) on int64 tensors in ``[0, 2**32)``."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def stream_uniforms(key: torch.Tensor, counter: torch.Tensor, lanes: int) -> torch.Tensor:
    """``[..., lanes]`` float32 uniforms in ``[0, 1)`` of the streams ``key`` (int64 in ``[0,
    2**62)``) at ``counter`` (int64 >= 0, the index of the token being decided), for lanes ``0 ..
    lanes-1``; ``key`` and ``counter`` broadcast.  Exact integer arithmetic: the same values
    on every device, 24 random bits each."""
    key, counter = torch.broadcast_tensors(key.long(), counter.long())
    lane = torch.arange(lanes, dtype=torch.long, device=key.device)
    k0 = (key & _MASK32).unsqueeze(-1)
    k1 = ((key >> 32) & _MASK32).unsqueeze(-1)
    c = (counter & _MASK32).unsqueeze(-1)
    h = _mix32((lane + 0x9E3779B9) & _MASK32)
    h = _mix32(h ^ c)
    h = _mix32(h ^ k1)
    h = _mix32(h ^ k0)
    return (h >> 8).float() * (1.0 / (1 << 24))


def row_keys(count: int, *, seed: int | None = None, generator: torch.Generator | None = None) -> list[int]:
    """Keys of ``count`` row streams: from ``seed`` (row ``i`` of a call with seed ``s`` always
    gets the same key, whatever else is in the call), else drawn from ``generator``, else
    fresh random ones."""
    if seed is not None:
        base = torch.tensor([seed & _MASK32, (seed >> 32) & _MASK32], dtype=torch.long)
        rows = torch.arange(count, dtype=torch.long)
        hi = _mix32(_mix32(rows ^ base[1]) ^ 0x5BD1E995)
        lo = _mix32(_mix32(hi ^ rows) ^ base[0])
        return [int(v) for v in ((hi & 0x3FFFFFFF) << 32) | lo]
    if generator is None:
        generator = torch.Generator()
        generator.seed()
    return [int(v) for v in torch.randint(0, KEY_LIMIT, (count,), generator=generator, dtype=torch.long)]


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``[...]`` long: the first index whose cumulative probability exceeds ``u`` times the
    total, for ``probs [..., V]`` and ``u [...]`` in ``[0, 1)``; never an index of probability 0."""
    cdf = probs.float().cumsum(-1)
    x = (u.to(cdf.dtype) * cdf[..., -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf.contiguous(), x.contiguous(), right=True).squeeze(-1)
    return idx.clamp(max=probs.shape[-1] - 1)
