"""Decoding a model with private pauses: a KV cache of real tokens only.

Under private pauses (:mod:`cyb.visibility`) no token ever attends to another token's pauses,
so a token's pause block ``[x, <pause_1>, ..., <pause_{M-1}>]`` needs the cached real tokens
and itself, and nothing of it but ``x`` is needed later.  The decoders here therefore:

* run the prompt as its real tokens only (positions as in training), with the last token's
  pauses after it, in one causal pass;
* feed each new token with its pauses, attend to the real-token cache plus the block (causal
  within it), read the block out, and keep only the real token's keys and values
  (:class:`RealTokenCache`): the cache grows by one entry per token, whatever ``M``.

A later token's context does not depend on where an earlier token stopped, so the sequential
readout of a whole block *is* adaptive decoding: fixed and adaptive mode make the same
decisions (greedy or sampled, with the same uniforms), and differ only in what they report
(adaptive mode: ``d`` is NaN after the stop step) and in what they compute:

* :class:`PrivateBlockDecoder`: one forward of ``M`` positions per token for every row (what a
  GPU at small batch wants: ``M`` positions cost about one).
* :class:`PrivateSparseDecoder` (adaptive mode): one position per row for the real token, then
  one forward of the ``M - 1`` pauses for only the rows whose readout said dk at step 1, over a
  view of their cache rows (what large batches and CPUs want: a row that rarely pauses costs
  about one position per token).  It reads which rows pause on the host, once per token.

:class:`~cyb.generation.static.StaticPrivateDecoder` is the same on a preallocated cache with
CUDA graphs.
"""

from __future__ import annotations

import torch

from ..layout import expand
from ..model import attention, hf
from ..runtime import growing_attention
from .decoders import StepOutput, StepReadout, cut_block


class RealTokenCache:
    """Keys and values of real tokens only, per layer ``[B, heads, N, dim]``.

    :meth:`update` (called by every attention layer) returns the cached entries followed by the
    new ones and keeps the new ones aside; :meth:`keep` then stores the first ``count`` of
    them (the real tokens of the block just run) and drops the rest (its pauses).
    """

    is_compileable = False

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._new: list[tuple[torch.Tensor, torch.Tensor]] = []

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        if layer_idx == 0:
            self._new = []
        self._new.append((key_states, value_states))
        if layer_idx >= len(self.keys):
            return key_states, value_states
        return (torch.cat([self.keys[layer_idx], key_states], dim=2),
                torch.cat([self.values[layer_idx], value_states], dim=2))

    def keep(self, count: int) -> None:
        """Store the first ``count`` new entries of every layer (after a forward)."""
        for i, (k, v) in enumerate(self._new):
            k, v = k[:, :, :count], v[:, :, :count]
            if i < len(self.keys):
                self.keys[i] = torch.cat([self.keys[i], k], dim=2)
                self.values[i] = torch.cat([self.values[i], v], dim=2)
            else:
                self.keys.append(k)
                self.values.append(v)
        self._new = []

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.keys = [k.index_select(0, indices) for k in self.keys]
        self.values = [v.index_select(0, indices) for v in self.values]

    def rows(self, indices: torch.Tensor) -> "_RowView":
        """A read-only view of rows ``indices`` (a forward over it stores nothing)."""
        return _RowView(self, indices)


class _RowView:
    """The cached entries of some rows, followed by a forward's new entries (not stored)."""

    is_compileable = False

    def __init__(self, cache: RealTokenCache, indices: torch.Tensor) -> None:
        self.cache, self.indices = cache, indices

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        k = self.cache.keys[layer_idx].index_select(0, self.indices)
        v = self.cache.values[layer_idx].index_select(0, self.indices)
        return torch.cat([k, key_states], dim=2), torch.cat([v, value_states], dim=2)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.cache.get_seq_length(layer_idx)


def block_masks(valid: torch.Tensor, key_pos: torch.Tensor, query_pos: torch.Tensor, config, *,
                additive_dtype: torch.dtype | None = None):
    """Masks for ``T`` new steps after ``K - T`` cached ones: ``[B, 1, T, K]`` (or a dict per
    layer type, :func:`cyb.model.attention.layer_windows`).  A new step sees the valid cached
    real tokens and the new steps up to itself; sliding windows are measured in positions
    (``key_pos [B, K]``, ``query_pos [B, T]``)."""
    b, k = valid.shape
    t = query_pos.shape[1]
    cols = torch.arange(k, device=valid.device)
    query_cols = torch.arange(k - t, k, device=valid.device)
    causal = cols.unsqueeze(0) <= query_cols.unsqueeze(1)  # [T, K]
    own = cols.unsqueeze(0) == query_cols.unsqueeze(1)
    allowed = (valid[:, None, :] & causal) | own  # [B, T, K]
    return attention.per_layer_masks(allowed, query_pos, key_pos, config, additive_dtype=additive_dtype)


def private_prompt(ids: torch.Tensor, mask: torch.Tensor, vocab):
    """What the prompt pass of a private decoder feeds: the prompt's real tokens (left-padded)
    then the last token's ``M - 1`` pauses, ``(input_ids, position_ids, valid, next_pos)``,
    with the positions training gives them (:func:`cyb.layout.expand`) and ``next_pos [B]``
    the position of the first new token."""
    m = vocab.num_steps
    lay = expand(ids, vocab, attention_mask=mask, check_ids=False)
    real_pos = lay.position_ids[:, ::m]
    last_block = lay.position_ids[:, -m:]
    input_ids = torch.cat([ids, lay.input_ids[:, -m + 1:]], dim=1) if m > 1 else ids
    pos = torch.cat([real_pos, last_block[:, 1:]], dim=1)
    pauses = torch.ones((ids.shape[0], m - 1), dtype=torch.bool, device=ids.device)
    valid = torch.cat([mask.bool(), pauses], dim=1)
    return input_ids, pos, valid, last_block[:, -1] + 1


class _PrivateDecoder:
    """Shared state of the eager private decoders: the real-token cache, its valid entries
    and positions, the original row of every batch row."""

    keeps_rows = False

    def __init__(self, model, ids: torch.Tensor, mask: torch.Tensor, readout: StepReadout, *,
                 mode: str) -> None:
        if model.pause_visibility != "private":
            raise ValueError("real-token decoding needs a model with private pauses")
        self.model, self.readout, self.mode = model, readout, mode
        self.vocab = model.vocab
        self.m = self.vocab.num_steps
        self.advance = self.vocab.position_scheme == "advance"
        self.ids, self.mask = ids, mask
        self.device = ids.device
        self.cache = RealTokenCache()
        self.valid: torch.Tensor | None = None  # [b, N] valid cached real tokens
        self.key_pos: torch.Tensor | None = None  # [b, N] their positions
        self.additive = model.dtype if hf.is_eager(model.hf_model) else None
        self.pause_ids = self.vocab.pause_id_tensor(self.device)
        self.offsets = torch.arange(self.m, device=self.device) * int(self.advance)
        self.num_rows = ids.shape[0]
        self.rows = torch.arange(self.num_rows, device=self.device)
        self.prompt_positions: torch.Tensor | None = None
        self.next_pos: torch.Tensor | None = None
        self.token: torch.Tensor | None = None
        self.step_in_block = torch.arange(self.m, device=self.device)
        self.last_positions: list[int] | None = None  # positions each row ran for the last token
        self.decided = 0  # tokens each row has decided

    def _run(self, cache, input_ids, position_ids, valid_new, key_valid, key_pos, *, check=False):
        """Forward of new steps over ``cache`` (the real-token cache or a row view)."""
        valid = torch.cat([key_valid, valid_new], dim=1) if key_valid is not None else valid_new
        kpos = torch.cat([key_pos, position_ids], dim=1) if key_pos is not None else position_ids
        attn = block_masks(valid, kpos, position_ids, self.model.config, additive_dtype=self.additive)
        with growing_attention(self.device):  # the key length grows every call
            hidden, _ = self.model.hidden_states(input_ids, position_ids, attn, past_key_values=cache,
                                                 check_positions=check)
        return hidden

    def _store(self, count: int, valid_new: torch.Tensor, pos_new: torch.Tensor) -> None:
        self.cache.keep(count)
        v, p = valid_new[:, :count], pos_new[:, :count]
        self.valid = v if self.valid is None else torch.cat([self.valid, v], dim=1)
        self.key_pos = p if self.key_pos is None else torch.cat([self.key_pos, p], dim=1)

    def _uniforms(self) -> torch.Tensor | None:
        """The uniforms of this token's decision of the rows still in the batch (None when
        greedy); every call decides one token per row."""
        u = self.readout.uniforms(self.rows, self.decided)
        self.decided += 1
        return u

    def _report(self, out: StepOutput) -> StepOutput:
        self.token = out.token
        if self.mode == "adaptive":
            return cut_block(out, self.step_in_block)[1]
        return out

    def start(self) -> StepOutput:
        input_ids, pos, valid, self.next_pos = private_prompt(self.ids, self.mask, self.vocab)
        p = self.ids.shape[1]
        hidden = self._run(self.cache, input_ids, pos, valid, None, None, check=True)
        self._store(p, valid, pos)
        self.prompt_positions = valid.sum(-1)
        out = self.readout.block(self.model.logits(hidden[:, -self.m:]), self._uniforms())
        self.last_positions = None
        return self._report(out)

    def _block_inputs(self, rows: torch.Tensor | None = None):
        token, next_pos = self.token, self.next_pos
        if rows is not None:
            token, next_pos = token.index_select(0, rows), next_pos.index_select(0, rows)
        b = token.shape[0]
        ids = torch.cat([token.unsqueeze(1), self.pause_ids[1:].expand(b, self.m - 1)], dim=1)
        return ids, next_pos.unsqueeze(1) + self.offsets

    def _advance(self) -> None:
        self.next_pos = self.next_pos + (self.m if self.advance else 1)

    def keep(self, index: list[int]) -> None:
        """Keep only the rows ``index`` (positions in the current batch), cache included."""
        idx = torch.tensor(index, dtype=torch.long, device=self.device)
        self.cache.batch_select_indices(idx)
        for name in ("valid", "key_pos", "rows", "token", "next_pos"):
            setattr(self, name, getattr(self, name).index_select(0, idx))


class PrivateBlockDecoder(_PrivateDecoder):
    """Every row feeds its token and ``M - 1`` pauses in one forward; the cache keeps the token."""

    def __init__(self, model, ids, mask, readout, *, mode: str = "fixed") -> None:
        super().__init__(model, ids, mask, readout, mode=mode)
        self.positions_per_step = self.m

    def step(self) -> StepOutput:
        ids, pos = self._block_inputs()
        ones = torch.ones_like(ids, dtype=torch.bool)
        hidden = self._run(self.cache, ids, pos, ones, self.valid, self.key_pos)
        self._store(1, ones, pos)
        self._advance()
        return self._report(self.readout.block(self.model.logits(hidden), self._uniforms()))


class PrivateSparseDecoder(_PrivateDecoder):
    """Adaptive mode: the real token for every row, its pauses only for the rows that say dk
    at step 1 (over a view of their cache rows); ``last_positions`` says per row how many
    positions ran (1 or ``M``)."""

    positions_per_step = 1

    def __init__(self, model, ids, mask, readout, *, mode: str = "adaptive") -> None:
        super().__init__(model, ids, mask, readout, mode=mode)

    def step(self) -> StepOutput:
        ids, pos = self._block_inputs()
        b, m = ids.shape
        ones = torch.ones((b, 1), dtype=torch.bool, device=self.device)
        hidden = self._run(self.cache, ids[:, :1], pos[:, :1], ones, self.valid, self.key_pos)
        z1 = self.model.logits(hidden[:, 0])  # [b, V]
        logits = z1.unsqueeze(1).repeat(1, m, 1)  # steps 2..M filled in below where they run
        uniforms = self._uniforms()
        first = self.readout.block(logits, uniforms)
        paused = (first.steps > 1).nonzero().flatten()
        n = int(paused.numel())
        if n:
            rows = paused
            view = self.cache.rows(rows)
            pause_valid = torch.ones((n, m - 1), dtype=torch.bool, device=self.device)
            # keys: the rows' cached tokens, then their real token (stored below), then pauses
            k_valid = torch.cat([self.valid.index_select(0, rows), ones[:n]], dim=1)
            k_pos = torch.cat([self.key_pos.index_select(0, rows), pos[rows, :1]], dim=1)
            view_cache = _Appended(view, self.cache, rows)
            h = self._run(view_cache, ids[rows, 1:], pos[rows, 1:], pause_valid, k_valid, k_pos)
            logits[rows, 1:] = self.model.logits(h).to(logits.dtype)
            out = self.readout.block(logits, uniforms)
        else:
            out = first
        self._store(1, ones, pos[:, :1])
        self._advance()
        counts = [1] * b
        for r in paused.tolist():
            counts[r] = m
        self.last_positions = counts
        return self._report(out)


class _Appended:
    """Rows ``rows`` of the real-token cache plus the real token just fed (still held aside by
    the cache), followed by the new pause entries: the keys a pause step attends to."""

    is_compileable = False

    def __init__(self, view: _RowView, cache: RealTokenCache, rows: torch.Tensor) -> None:
        self.view, self.cache, self.rows = view, cache, rows
        self.real = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in cache._new]

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        k, v = self.view.update(*self.real[layer_idx], layer_idx)
        return torch.cat([k, key_states], dim=2), torch.cat([v, value_states], dim=2)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.cache.get_seq_length(layer_idx) + 1


def private_decoder(model, ids, mask, readout: StepReadout, *, mode: str,
                    sparse: bool | None = None) -> _PrivateDecoder:
    """The eager real-token decoder of ``mode``.  Adaptive mode: :class:`PrivateSparseDecoder`
    on a CPU or for batches of :data:`SPARSE_MIN_ROWS` rows or more (``sparse`` forces the
    choice), else :class:`PrivateBlockDecoder`."""
    if mode == "fixed":
        return PrivateBlockDecoder(model, ids, mask, readout, mode=mode)
    if sparse is None:
        sparse = ids.device.type != "cuda" or ids.shape[0] >= SPARSE_MIN_ROWS
    cls = PrivateSparseDecoder if sparse else PrivateBlockDecoder
    return cls(model, ids, mask, readout, mode=mode)


#: from this many rows on, adaptive private decoding on CUDA computes pauses only where asked
SPARSE_MIN_ROWS = 64
