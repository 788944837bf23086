"""Decode loops with a KV cache: fixed pauses (Recipe 1) and adaptive pauses (Recipe 2).

Both loops run a batch of left-padded prompts through :meth:`cyb.PauseModel.hidden_states`
with explicit positions, an explicit attention mask over the cached and the new steps (4-D,
built here; 2-D for models with sliding-window layers), and a ``DynamicCache``.  Finished rows
are dropped from the batch (cache included) by the caller.  A decode step reads nothing back
to the host: the caller makes the one read per step (the decisions).  These are the eager
decoders; :mod:`cyb.generation.static` runs the same decisions on a preallocated cache.

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

from ..decision import greedy_decision, sample_decision, stream_uniforms
from ..layout import PauseVocab, expand
from ..losses import expected_stop_step
from ..model import hf
from ..runtime import growing_attention
from ..visibility import inserted_steps


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
        keys: ``[B]`` long, each prompt's random stream (:func:`cyb.decision.stream_uniforms`;
            needed when sampling).

    When sampling, the uniforms of a decision come from the row's own stream at the index of
    the token being decided (:meth:`uniforms`), so that every decoder, whatever its batch,
    decides alike.
    """

    def __init__(self, vocab: PauseVocab, dk_bias: float, *, sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 keys: torch.Tensor | None = None) -> None:
        self.num_steps = vocab.num_steps
        self.dk_id = vocab.dk_id
        self.dk_bias = float(dk_bias)
        self.sample = sample
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        if self.random and keys is None:
            raise ValueError("sampling needs the rows' stream keys (keys=...)")
        self.keys = keys
        banned = sorted(set(vocab.pause_ids))
        self._banned = torch.tensor(banned, dtype=torch.long) if banned else None
        self._dk = torch.tensor([vocab.dk_id if vocab.dk_id is not None else 0], dtype=torch.long)

    @property
    def random(self) -> bool:
        """Whether decisions consume uniforms (sampling at a temperature above 0)."""
        return self.sample and self.temperature > 0

    def uniforms(self, rows: torch.Tensor, counter) -> torch.Tensor | None:
        """``[b, M + 1]`` uniforms of the decision of rows ``rows`` (original prompt indices) on
        the token of index ``counter`` (an int or ``[b]``); None when greedy."""
        if not self.random:
            return None
        if self.keys.device != rows.device:
            self.keys = self.keys.to(rows.device)
        counter = torch.as_tensor(counter, dtype=torch.long, device=rows.device)
        return stream_uniforms(self.keys.index_select(0, rows), counter, self.num_steps + 1)

    def step_uniforms(self, rows: torch.Tensor, counter, step: torch.Tensor) -> torch.Tensor | None:
        """``[b, 3]`` uniforms of one step (:meth:`step`): the dk draw of step ``step`` and the
        token draw of the row's block, as the block readout would use them."""
        u = self.uniforms(rows, counter)
        if u is None:
            return None
        dk = u.gather(1, (step - 1).clamp(max=self.num_steps - 1).unsqueeze(1))
        return torch.cat([dk, torch.zeros_like(dk), u[:, -1:]], dim=1)

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

    def _decide(self, z: torch.Tensor, num_valid_steps: torch.Tensor | None = None,
                uniforms: torch.Tensor | None = None):
        if self.sample:
            return sample_decision(z, dk_id=self.dk_id, dk_bias=self.dk_bias,
                                   temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                                   num_valid_steps=num_valid_steps,
                                   uniforms=uniforms)
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

    def block(self, logits: torch.Tensor, uniforms: torch.Tensor | None = None) -> StepOutput:
        """Sequential readout of blocks: ``logits [b, M, V]`` -> a token per row;
        ``uniforms [b, M + 1]`` when sampling (:meth:`uniforms`)."""
        z = self._logits(logits)
        token, steps = self._decide(z, uniforms=uniforms)
        log_d, log_not_d = self._log_d(z)
        expected = expected_stop_step(log_d, log_not_d).float()
        d = log_d.exp()
        d[..., -1] = 0.0
        answered = torch.ones_like(token, dtype=torch.bool)
        return StepOutput(answered, token, steps, d, expected)

    def step(self, logits: torch.Tensor, last: torch.Tensor,
             uniforms: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Decision at one step: ``logits [b, V]``, ``last [b]`` (answer forced) ->
        ``(token [b], answered [b] bool, d [b])``; where not answered the model said dk.
        ``uniforms [b, 3]`` when sampling (:meth:`step_uniforms`).

        The step is read out as a block of two steps with the same logits where the second is
        valid only if this step is not the last: :mod:`cyb.decision` then answers at step 1
        exactly when the sequential readout answers at this step (greedy: dk is not the argmax;
        sampling: ``u >= d``), and "step 2" means dk.
        """
        z = self._logits(logits)
        pair = z.unsqueeze(-2).expand(z.shape[0], 2, z.shape[-1])
        valid = 2 - last.long()  # 1 where the answer is forced
        token, steps = self._decide(pair, num_valid_steps=valid, uniforms=uniforms)
        answered = steps == 1
        log_d, _ = self._log_d(z)
        d = torch.where(last, torch.zeros_like(log_d), log_d.exp())
        return token, answered, d


def attention_mask_4d(valid: torch.Tensor, query_cols: torch.Tensor, *,
                      additive_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``[B, 1, T, K]`` attention mask for new steps at columns ``query_cols [T]`` of a cache
    of ``K`` columns whose valid ones are ``valid [B, K]`` (bool): a step sees the valid columns
    up to its own, and always itself (so that padding steps never have an empty softmax).
    Bool (sdpa), or additive in ``additive_dtype`` (0 or the dtype's minimum; eager attention).
    """
    cols = torch.arange(valid.shape[1], device=valid.device)
    upto = cols.unsqueeze(0) <= query_cols.unsqueeze(1)  # [T, K]
    own = cols.unsqueeze(0) == query_cols.unsqueeze(1)
    allowed = (valid[:, None, None, :] & upto) | own
    if additive_dtype is None:
        return allowed
    zero = torch.zeros((), dtype=additive_dtype, device=valid.device)
    return torch.where(allowed, zero, torch.finfo(additive_dtype).min)


def prompt_layout(ids: torch.Tensor, mask: torch.Tensor, vocab: PauseVocab, mode: str):
    """What the prompt pass feeds: ``(input_ids, position_ids, valid [B, T] long, next_pos [B])``.

    Fixed mode: every prompt token with its ``M-1`` pauses; ``next_pos`` is the position of the
    next real token.  Adaptive mode: the tokens before the last with all their pauses, then the
    last token alone (its block is decided step by step); ``next_pos`` is the last token's
    position.  ``ids``/``mask`` ``[B, P]`` are left-padded.
    """
    m, advance = vocab.num_steps, vocab.position_scheme == "advance"
    if mode == "fixed":
        lay = expand(ids, vocab, attention_mask=mask, check_ids=False)
        return lay.input_ids, lay.position_ids, lay.attention_mask, lay.position_ids[:, -1] + 1
    last = ids[:, -1:]
    earlier = mask[:, :-1].sum(-1)  # real tokens before the last (left padding: last is valid)
    last_pos = (earlier * m if advance else earlier).unsqueeze(1)
    if ids.shape[1] == 1:
        return last, last_pos, torch.ones_like(last), last_pos.squeeze(1)
    lay = expand(ids[:, :-1], vocab, attention_mask=mask[:, :-1], check_ids=False)
    return (torch.cat([lay.input_ids, last], 1), torch.cat([lay.position_ids, last_pos], 1),
            torch.cat([lay.attention_mask, torch.ones_like(last)], 1), last_pos.squeeze(1))


class _Decoder:
    """Shared state: the model, the ``DynamicCache``, the valid steps and the original row of
    every batch row.

    No decode step reads a device value on the host: positions are checked by the caller up
    front, and models without sliding-window layers get a 4-D mask built here (bool for sdpa,
    additive for eager attention), so that the model's own mask building (which reads the mask
    on the host to decide whether it may skip it) never runs.  Sliding-window models get the
    2-D mask and the model's per-layer masks.
    """

    #: positions each row feeds per :meth:`step` (after the prompt)
    positions_per_step = 1
    #: whether finished rows stay in the batch (static decoders) rather than leave it
    keeps_rows = False
    mode = "fixed"

    def __init__(self, model, ids: torch.Tensor, mask: torch.Tensor, readout: StepReadout) -> None:
        self.model = model
        self.vocab: PauseVocab = model.vocab
        self.m = self.vocab.num_steps
        self.advance = self.vocab.position_scheme == "advance"
        self.readout = readout
        self.ids, self.mask = ids, mask
        self.device = ids.device
        self.cache = model.new_cache()
        self.valid: torch.Tensor | None = None  # [b, cached] bool: valid steps in the cache
        self.four_d = not hf.has_sliding_window(model.config)
        self.additive = model.dtype if hf.attention_of(model.hf_model) == "eager" else None
        self.pause_ids = self.vocab.pause_id_tensor(ids.device)  # [M]: slot j is <pause_j>
        self.prompt_positions: torch.Tensor | None = None  # [B] valid steps of each prompt
        self.num_rows = ids.shape[0]
        self.rows = torch.arange(self.num_rows, device=ids.device)  # original row of each row
        self.decided = 0  # tokens each row has decided (decoders that decide one per step)

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, new_valid: torch.Tensor,
                 *, check_positions: bool = False):
        new_valid = new_valid.bool()
        self.valid = new_valid if self.valid is None else torch.cat([self.valid, new_valid], dim=1)
        if self.four_d:
            k, t = self.valid.shape[1], input_ids.shape[1]
            query = torch.arange(k - t, k, device=self.device)
            attn = attention_mask_4d(self.valid, query, additive_dtype=self.additive)
        else:
            attn = self.valid.long()
        with growing_attention(self.device):
            hidden, self.cache = self.model.hidden_states(
                input_ids, position_ids, attn, past_key_values=self.cache, use_cache=True,
                check_positions=check_positions)
        return hidden

    def _uniforms(self) -> torch.Tensor | None:
        """The uniforms of this decision of the rows still in the batch, all deciding their
        token of index :attr:`decided` (None when greedy)."""
        return self.readout.uniforms(self.rows, self.decided)

    def keep(self, index: list[int]) -> None:
        """Keep only the rows ``index`` (positions in the current batch), cache included."""
        idx = torch.tensor(index, dtype=torch.long, device=self.device)
        self.cache.batch_select_indices(idx)
        self.valid = self.valid.index_select(0, idx)
        self.rows = self.rows.index_select(0, idx)
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
        self.offsets = torch.arange(self.m, device=self.device) * int(self.advance)

    def start(self) -> StepOutput:
        input_ids, pos, valid, self.next_pos = prompt_layout(self.ids, self.mask, self.vocab, "fixed")
        hidden = self._forward(input_ids, pos, valid, check_positions=True)
        self.prompt_positions = valid.sum(-1)
        return self._decide(hidden[:, -self.m:])

    def _decide(self, block_hidden: torch.Tensor) -> StepOutput:
        out = self.readout.block(self.model.logits(block_hidden), self._uniforms())
        self.decided += 1
        self.token = out.token
        return out

    def step(self) -> StepOutput:
        b, m = self.token.shape[0], self.m
        ids = torch.cat([self.token.unsqueeze(1), self.pause_ids[1:].expand(b, m - 1)], dim=1)
        pos = self.next_pos.unsqueeze(1) + self.offsets  # shared scheme: all alike
        self.next_pos = self.next_pos + (m if self.advance else 1)
        hidden = self._forward(ids, pos, torch.ones_like(ids, dtype=torch.bool))
        return self._decide(hidden)

    def _select(self, idx: torch.Tensor) -> None:
        self.token = self.token.index_select(0, idx)
        self.next_pos = self.next_pos.index_select(0, idx)


class AdaptiveDecoder(_Decoder):
    """Recipe 2 at inference: one step per forward; a pause only after a dk decision."""

    mode = "adaptive"

    def __init__(self, model, ids, mask, readout) -> None:
        super().__init__(model, ids, mask, readout)
        self.feed = self.pos = self.step_idx = self.d_acc = self.counter = None

    def start(self) -> StepOutput:
        b = self.ids.shape[0]
        input_ids, pos, valid, self.pos = prompt_layout(self.ids, self.mask, self.vocab, "adaptive")
        hidden = self._forward(input_ids, pos, valid, check_positions=True)
        self.prompt_positions = valid.sum(-1)
        self.step_idx = torch.ones(b, dtype=torch.long, device=self.device)
        self.d_acc = fresh_d(b, self.m, self.device)
        self.counter = torch.zeros(b, dtype=torch.long, device=self.device)
        return self._decide(hidden[:, -1])

    def _decide(self, hidden: torch.Tensor) -> StepOutput:
        uniforms = self.readout.step_uniforms(self.rows, self.counter, self.step_idx)
        out, self.feed, self.pos, self.step_idx, self.d_acc = adaptive_update(
            self, self.model.logits(hidden), uniforms)
        self.counter = self.counter + out.answered.long()
        return out

    def step(self) -> StepOutput:
        hidden = self._forward(self.feed.unsqueeze(1), self.pos.unsqueeze(1),
                               torch.ones_like(self.feed, dtype=torch.bool).unsqueeze(1))
        return self._decide(hidden[:, -1])

    def _select(self, idx: torch.Tensor) -> None:
        for name in ("feed", "pos", "step_idx", "d_acc", "counter"):
            setattr(self, name, getattr(self, name).index_select(0, idx))


class _Recompute:
    """Decoding without a cache, for layouts whose attention a cache of keys and values does not
    capture (gated pauses: a later token's logits on every earlier pause carry the gates).  Each
    forward runs the whole row fed so far again, its blocks read from the ids (a pause belongs
    to the real token before it: :func:`cyb.visibility.inserted_steps`), and returns the new
    positions' hidden states.  Mixed into a cached decoder, it makes that decoder's decisions
    at a forward over the whole row per step."""

    row_ids: torch.Tensor | None = None  # [b, T] every position fed so far
    row_pos: torch.Tensor | None = None

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, new_valid: torch.Tensor,
                 *, check_positions: bool = False):
        def grown(row, new):
            return new if row is None else torch.cat([row, new], dim=1)

        self.row_ids = grown(self.row_ids, input_ids)
        self.row_pos = grown(self.row_pos, position_ids.expand_as(input_ids))
        self.valid = grown(self.valid, new_valid.bool())
        steps = inserted_steps(torch.isin(self.row_ids, self.pause_ids[1:]), self.valid)  # (slot 0: a placeholder)
        hidden, _ = self.model.hidden_states(self.row_ids, self.row_pos, self.valid.long(), steps=steps,
                                             check_positions=check_positions)
        return hidden[:, -input_ids.shape[1]:]

    def keep(self, index: list[int]) -> None:
        idx = torch.tensor(index, dtype=torch.long, device=self.device)
        self.row_ids, self.row_pos, self.valid, self.rows = (
            x.index_select(0, idx) for x in (self.row_ids, self.row_pos, self.valid, self.rows))
        self._select(idx)


class RecomputeFixedDecoder(_Recompute, FixedDecoder):
    """:class:`FixedDecoder` without a cache (:class:`_Recompute`)."""


class RecomputeAdaptiveDecoder(_Recompute, AdaptiveDecoder):
    """:class:`AdaptiveDecoder` (one position per step) without a cache (:class:`_Recompute`)."""


class BlockAdaptiveDecoder(FixedDecoder):
    """Adaptive mode, one forward per real token: each step feeds a row's token with its
    ``M - 1`` pauses (as fixed mode does); the sequential readout gives the stop step ``s`` and
    the block's steps after ``s`` are marked invalid, so later steps attend to what adaptive
    mode would have cached and later tokens take adaptive mode's positions.  Attention within a
    block is causal and a row's uniforms depend on the token it decides, not on the step, so
    the decisions (greedy or sampled) are those of :class:`AdaptiveDecoder`;
    ``positions_per_step`` is ``M``.  Chosen by :mod:`~cyb.generation.registry` on CUDA, where a
    forward of ``M`` positions costs about what one of a single position costs and the host
    time per forward dominates."""

    mode = "adaptive"

    def __init__(self, model, ids, mask, readout) -> None:
        super().__init__(model, ids, mask, readout)
        self.step_in_block = torch.arange(self.m, device=self.device)

    def _decide(self, block_hidden: torch.Tensor) -> StepOutput:
        uniforms = self._uniforms()
        self.decided += 1
        kept, out = cut_block(self.readout.block(self.model.logits(block_hidden), uniforms), self.step_in_block)
        self.valid[:, -self.m:] = kept  # the block just fed ends the cache
        if self.advance:  # the next token follows step s, not step M
            self.next_pos = self.next_pos - (self.m - out.steps)
        self.token = out.token
        return out


def cut_block(out: StepOutput, step_in_block: torch.Tensor) -> tuple[torch.Tensor, StepOutput]:
    """A block's sequential readout ``out`` as adaptive mode reports it: ``(kept [b, M] bool,
    output)``, where ``kept`` marks the steps ``1..s`` that adaptive mode runs (``s`` =
    ``out.steps``; ``step_in_block`` = ``arange(M)``) and the output's ``d`` is NaN for the
    steps after ``s`` (``d_M = 0``), without ``E[S]``."""
    kept = step_in_block < out.steps.unsqueeze(1)
    d = torch.where(kept, out.d, torch.nan)
    d[:, -1] = 0.0
    return kept, StepOutput(out.answered, out.token, out.steps, d)


def fresh_d(b: int, m: int, device) -> torch.Tensor:
    """``[b, M]``: NaN for steps not run yet, ``d_M = 0`` by definition."""
    d = torch.full((b, m), math.nan, dtype=torch.float32, device=device)
    d[:, -1] = 0.0
    return d


def adaptive_update(dec, logits: torch.Tensor, uniforms: torch.Tensor | None):
    """One adaptive decision from ``logits [b, V]`` of the step just fed, given the decoder's
    ``step_idx``, ``pos``, ``d_acc``, ``readout``, ``pause_ids``, ``m``, ``advance``:
    ``(StepOutput, feed, pos, step_idx, d_acc)``, the last four being what to feed next (the
    answer at a new position, or ``<pause_i>`` after a dk at step ``i``) and the new state."""
    m, i = dec.m, dec.step_idx
    token, answered, d = dec.readout.step(logits, i == m, uniforms)
    d_acc = dec.d_acc.scatter(1, (i - 1).unsqueeze(1), d.unsqueeze(1))
    out = StepOutput(answered, token, i.clone(), d_acc)  # (a static step updates i in place)
    pause = dec.pause_ids[i.clamp(max=m - 1)]
    feed = torch.where(answered, token, pause)
    pos = dec.pos + torch.where(answered, 1, 1 if dec.advance else 0)
    step_idx = torch.where(answered, torch.ones_like(i), i + 1)
    d_next = torch.where(answered.unsqueeze(1), fresh_d(1, m, d_acc.device), d_acc)
    return out, feed, pos, step_idx, d_next
