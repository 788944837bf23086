"""Decode loops with a KV cache: fixed pauses (Recipe 1) and adaptive pauses (Recipe 2).

Both loops run a batch of left-padded prompts through :meth:`cyb.PauseModel.hidden_states`
with explicit positions, an explicit 2-D attention mask over the cached and the new steps, and
a ``DynamicCache``.  Finished rows are dropped from the batch (cache included) by the caller.

* **Fixed** (the paper's inference): the prompt is laid out with :func:`cyb.layout.expand`
  (``M-1`` pauses after every token) and run in one pass; the block of the last prompt token
  gives the first new token.  Then each new token and its ``M-1`` pauses (inputs known in
  advance) go through the network in ONE forward of ``M`` positions, and the sequential readout
  of that block (:mod:`cyb.decision`) gives the next token.  The cache grows by ``M`` per token.
* **Adaptive**: the prompt's tokens except the last are laid out with all their pauses (as the
  model saw text in Recipe 1 training); from the last prompt token on, one step is fed at a time:
  a real token, then ``<pause_1>``, ``<pause_2>``, ... only while the readout at the step says
  dk, at most ``M`` steps, the answer forced at step ``M``.  A model without dk (TBYS) reads out
  at step ``M``, so it always takes ``M`` steps; a baseline (``M = 1``) takes one.

Pause ids are never real tokens: their logits are set to ``-inf`` before any decision and before
``d`` is computed (a trained model gives them ~0 probability, since they are never targets).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..decision import greedy_decision, sample_decision
from ..layout import PauseVocab, expand
from ..losses import expected_stop_step


@dataclass
class StepOutput:
    """What one decoding step decided for the ``b`` rows in the batch (device tensors).

    Attributes:
        answered: ``[b]`` bool, rows that produced a real token at this step (fixed: all).
        token: ``[b]`` long, the token (meaningful where ``answered``).
        steps: ``[b]`` long, steps used by that token, ``1..M``.
        d: ``[b, M]`` float32, ``d_i`` of each step of that token; ``d_M = 0``; NaN for steps
            before ``M`` that were never run (adaptive mode).
        expected_steps: ``[b]`` float32 ``E[S]`` of the block (fixed mode), else None.
    """

    answered: torch.Tensor
    token: torch.Tensor
    steps: torch.Tensor
    d: torch.Tensor
    expected_steps: torch.Tensor | None = None


class StepReadout:
    """Decisions from logits with the model's dk id and prior: per block or per single step.

    Args:
        vocab: the model's pause vocabulary (``M``, pause ids, dk id).
        dk_bias: the dk prior offset on the dk logit (:attr:`cyb.PauseModel.dk_bias`).
        sample: sample (dk with probability ``d_i``, token from the tempered, filtered
            distribution) instead of the greedy sequential decision.
        temperature, top_k, top_p: sampling parameters (:func:`cyb.decision.sample_decision`).
        generator: a CPU ``torch.Generator`` for reproducible sampling.
    """

    def __init__(self, vocab: PauseVocab, dk_bias: float, *, sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 generator: torch.Generator | None = None) -> None:
        self.num_steps = vocab.num_steps
        self.dk_id = vocab.dk_id
        self.dk_bias = float(dk_bias)
        self.sample = sample
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.generator = generator
        banned = sorted(set(vocab.pause_ids))
        self._banned = torch.tensor(banned, dtype=torch.long) if banned else None
        self._dk = torch.tensor([vocab.dk_id if vocab.dk_id is not None else 0], dtype=torch.long)

    def _on(self, device) -> None:
        """Move the index tensors to the logits' device once (not a copy per step)."""
        if self._dk.device != device:
            self._dk = self._dk.to(device)
            if self._banned is not None:
                self._banned = self._banned.to(device)

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        self._on(logits.device)
        z = logits.float()
        if self._banned is not None:
            z = z.index_fill(-1, self._banned, -math.inf)
        return z

    def _decide(self, z: torch.Tensor, num_valid_steps: torch.Tensor | None = None):
        if self.sample:
            return sample_decision(z, dk_id=self.dk_id, dk_bias=self.dk_bias,
                                   temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                                   generator=self.generator, num_valid_steps=num_valid_steps)
        return greedy_decision(z, dk_id=self.dk_id, dk_bias=self.dk_bias,
                               num_valid_steps=num_valid_steps)

    def _log_d(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log d, log(1-d))`` of float logits ``[..., V]``; without dk ``d = 1`` (TBYS)."""
        if self.dk_id is None:
            zeros = torch.zeros(z.shape[:-1], dtype=z.dtype, device=z.device)
            return zeros, torch.full_like(zeros, -math.inf)
        zb = z[..., self.dk_id] + self.dk_bias
        rest = torch.logsumexp(z.index_fill(-1, self._dk, -math.inf), -1)
        total = torch.logaddexp(rest, zb)
        return zb - total, rest - total

    def block(self, logits: torch.Tensor) -> StepOutput:
        """Sequential readout of blocks: ``logits [b, M, V]`` -> a token per row."""
        z = self._logits(logits)
        token, steps = self._decide(z)
        log_d, log_not_d = self._log_d(z)
        expected = expected_stop_step(log_d, log_not_d).float()
        d = log_d.exp()
        d[..., -1] = 0.0
        answered = torch.ones_like(token, dtype=torch.bool)
        return StepOutput(answered, token, steps, d, expected)

    def step(self, logits: torch.Tensor, last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Decision at one step: ``logits [b, V]``, ``last [b]`` (answer forced) ->
        ``(token [b], answered [b] bool, d [b])``; where not answered the model said dk.

        The step is read out as a block of two steps with the same logits where the second is
        valid only if this step is not the last: :mod:`cyb.decision` then answers at step 1
        exactly when the sequential readout answers at this step (greedy: dk is not the argmax;
        sampling: ``u >= d``), and "step 2" means dk.
        """
        z = self._logits(logits)
        pair = z.unsqueeze(-2).expand(z.shape[0], 2, z.shape[-1])
        valid = 2 - last.long()  # 1 where the answer is forced
        token, steps = self._decide(pair, num_valid_steps=valid)
        answered = steps == 1
        log_d, _ = self._log_d(z)
        d = torch.where(last, torch.zeros_like(log_d), log_d.exp())
        return token, answered, d


class _Decoder:
    """Shared state: the model, the cache and the 2-D attention mask over all fed steps."""

    #: positions each row feeds per :meth:`step` (after the prompt)
    positions_per_step = 1

    def __init__(self, model, ids: torch.Tensor, mask: torch.Tensor, readout: StepReadout) -> None:
        self.model = model
        self.vocab: PauseVocab = model.vocab
        self.m = self.vocab.num_steps
        self.advance = self.vocab.position_scheme == "advance"
        self.readout = readout
        self.ids, self.mask = ids, mask
        self.cache = model.new_cache()
        self.attn: torch.Tensor | None = None
        self.pause_ids = self.vocab.pause_id_tensor(ids.device)  # [M]: slot j is <pause_j>
        self.prompt_positions: torch.Tensor | None = None  # [B] valid steps of each prompt

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, new_mask: torch.Tensor):
        self.attn = new_mask if self.attn is None else torch.cat([self.attn, new_mask], dim=1)
        hidden, self.cache = self.model.hidden_states(
            input_ids, position_ids, self.attn, past_key_values=self.cache, use_cache=True)
        return hidden

    def keep(self, index: list[int]) -> None:
        """Keep only the rows ``index`` (positions in the current batch), cache included."""
        idx = torch.tensor(index, dtype=torch.long, device=self.attn.device)
        self.cache.batch_select_indices(idx)
        self.attn = self.attn.index_select(0, idx)
        self._select(idx)

    def _select(self, idx: torch.Tensor) -> None:
        raise NotImplementedError

    def start(self) -> StepOutput:
        """Run the prompts and decide the first new token (or the first dk) of every row."""
        raise NotImplementedError

    def step(self) -> StepOutput:
        """Feed what the last decision asks for and decide again."""
        raise NotImplementedError


class FixedDecoder(_Decoder):
    """Recipe 1: every real token is fed with its ``M-1`` pauses in one forward of ``M`` steps."""

    def __init__(self, model, ids, mask, readout) -> None:
        super().__init__(model, ids, mask, readout)
        self.positions_per_step = self.m
        self.next_pos: torch.Tensor | None = None  # [b] position of the next real token
        self.token: torch.Tensor | None = None  # [b] last decided token

    def start(self) -> StepOutput:
        lay = expand(self.ids, self.vocab, attention_mask=self.mask, check_ids=False)
        hidden = self._forward(lay.input_ids, lay.position_ids, lay.attention_mask)
        self.prompt_positions = lay.attention_mask.sum(-1)
        self.next_pos = lay.position_ids[:, -1] + 1
        return self._decide(hidden[:, -self.m:])

    def _decide(self, block_hidden: torch.Tensor) -> StepOutput:
        out = self.readout.block(self.model.logits(block_hidden))
        self.token = out.token
        return out

    def step(self) -> StepOutput:
        b, m = self.token.shape[0], self.m
        ids = self.pause_ids.unsqueeze(0).repeat(b, 1)
        ids[:, 0] = self.token
        offsets = torch.arange(m, device=ids.device) * int(self.advance)  # shared: all alike
        pos = self.next_pos.unsqueeze(1) + offsets
        self.next_pos = self.next_pos + (m if self.advance else 1)
        hidden = self._forward(ids, pos, torch.ones_like(ids))
        return self._decide(hidden)

    def _select(self, idx: torch.Tensor) -> None:
        self.token = self.token.index_select(0, idx)
        self.next_pos = self.next_pos.index_select(0, idx)


class AdaptiveDecoder(_Decoder):
    """Recipe 2 at inference: one step per forward; a pause only after a dk decision."""

    def __init__(self, model, ids, mask, readout) -> None:
        super().__init__(model, ids, mask, readout)
        self.feed = self.pos = self.step_idx = self.d_acc = None

    def start(self) -> StepOutput:
        ids, mask = self.ids, self.mask
        b, device = ids.shape[0], ids.device
        last = ids[:, -1:]
        earlier = mask[:, :-1].sum(-1)  # real tokens before the last (left padding: last is valid)
        last_pos = (earlier * self.m if self.advance else earlier).unsqueeze(1)
        if ids.shape[1] > 1:
            lay = expand(ids[:, :-1], self.vocab, attention_mask=mask[:, :-1], check_ids=False)
            input_ids = torch.cat([lay.input_ids, last], 1)
            pos = torch.cat([lay.position_ids, last_pos], 1)
            new_mask = torch.cat([lay.attention_mask, torch.ones_like(last)], 1)
        else:
            input_ids, pos, new_mask = last, last_pos, torch.ones_like(last)
        hidden = self._forward(input_ids, pos, new_mask)
        self.prompt_positions = new_mask.sum(-1)
        self.pos = last_pos.squeeze(1)
        self.step_idx = torch.ones(b, dtype=torch.long, device=device)
        self.d_acc = self._fresh_d(b, device)
        return self._decide(hidden[:, -1])

    def _decide(self, hidden: torch.Tensor) -> StepOutput:
        m, i = self.m, self.step_idx
        token, answered, d = self.readout.step(self.model.logits(hidden), i == m)
        d_acc = self.d_acc.scatter(1, (i - 1).unsqueeze(1), d.unsqueeze(1))
        out = StepOutput(answered, token, i, d_acc)
        # What to feed next: the answer at a new position, or <pause_i> after a dk at step i.
        pause = self.pause_ids[i.clamp(max=m - 1)]
        self.feed = torch.where(answered, token, pause)
        self.pos = self.pos + torch.where(answered, 1, 1 if self.advance else 0)
        self.step_idx = torch.where(answered, torch.ones_like(i), i + 1)
        self.d_acc = torch.where(answered.unsqueeze(1), self._fresh_d(1, d_acc.device), d_acc)
        return out

    def _fresh_d(self, b: int, device) -> torch.Tensor:
        """``[b, M]``: NaN for steps not run yet, ``d_M = 0`` by definition."""
        d = torch.full((b, self.m), math.nan, dtype=torch.float32, device=device)
        d[:, -1] = 0.0
        return d

    def step(self) -> StepOutput:
        hidden = self._forward(self.feed.unsqueeze(1), self.pos.unsqueeze(1),
                               torch.ones_like(self.feed).unsqueeze(1))
        return self._decide(hidden[:, -1])

    def _select(self, idx: torch.Tensor) -> None:
        for name in ("feed", "pos", "step_idx", "d_acc"):
            setattr(self, name, getattr(self, name).index_select(0, idx))
