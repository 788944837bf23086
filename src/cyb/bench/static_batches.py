"""The previous release's static-batch decoders, kept as the baseline of ``cyb bench decode``.

Before the engine (:mod:`cyb.engine`), generation ran a fixed batch of left-padded prompts on a
preallocated cache with each step a CUDA graph: every row fed its whole block (the token and its
``M - 1`` pauses) at every step, finished rows stayed in the batch until the longest ended, and a
new prompt waited for the whole batch.  The benchmark times these decoders beside the engine on
the same model and prompts; nothing else uses them.  Greedy only.

What follows is their description as it was.

Decoding on a preallocated KV cache, with the decode step captured as a CUDA graph on CUDA.

:class:`StaticFixedDecoder` and :class:`StaticAdaptiveDecoder` make the same decisions as the
eager :class:`~cyb.generation.decoders.FixedDecoder` and
:class:`~cyb.generation.decoders.AdaptiveDecoder` (greedy or sampled, through the same
:class:`~cyb.generation.decoders.StepReadout`), but every tensor of a decode step has a fixed
shape and address:

* :class:`StaticKVCache` holds each layer's keys and values in ``[B, heads, capacity, dim]``
  buffers and writes new steps at the slots of a device tensor (``index_copy_``); attention
  runs over the first ``limit`` slots with an explicit 4-D mask (slots not yet written, padding
  of the prompt and, within the new block, later steps are masked out).  With
  :data:`ATTENTION_BUCKET_MIN_ROWS` rows or more, ``limit`` covers the slots written so far,
  rounded up to :data:`ATTENTION_BUCKET` times a power of two, and each limit is its own CUDA
  graph, captured when decoding reaches it: attention does not read the empty end of the cache,
  which at large batches is a large part of a step's memory traffic, for a few extra captures
  per call.  Smaller batches attend over the whole capacity with one graph (reading the empty
  slots costs them less than a capture).  :class:`StaticCacheOptions` changes these choices
  (``cyb bench decode --whole-cache --capacity-multiple N`` measures them);
* the step's inputs (ids, positions, slots, the adaptive state) live in fixed tensors that the
  step itself advances: the decision is made on the device and becomes the next step's input
  (fixed mode: the decided token heads the next block of ``M``; adaptive mode: the token at a
  new position, or ``<pause_i>`` after a dk), so on CUDA the whole step -- decoder, output
  projection, readout, input update -- is captured as a CUDA graph (once per attention limit)
  and each decode step is one ``graph.replay()``.  Elsewhere the same step runs eagerly (``cuda_graph=False``).

Fixed mode feeds ``M`` positions per step.  Adaptive mode has two decoders:

* :class:`StaticBlockAdaptiveDecoder` (greedy; what :mod:`~cyb.generation.registry` picks for
  it): one replay per real token.  It feeds the whole block ``[x, <pause_1>, ..., <pause_{M-1}>]`` as
  fixed mode does; attention within a block is causal, so step ``i`` of the block is computed
  exactly as adaptive mode computes it after ``i - 1`` dk decisions.  The sequential readout
  gives the stop step ``s``, and the block's slots after ``s`` are marked invalid in the
  cache's mask (the next real token sits at the position adaptive mode gives it), so every
  later step sees what adaptive mode would have cached.  Same tokens, steps and ``d`` as the
  one-position decoder, in one replay per token instead of ``E[S]``; it saves latency where a
  step costs about the same for 1 and ``M`` positions (small batches on a GPU), not FLOPs.
* :class:`StaticAdaptiveDecoder` (greedy or sampled): one position per step (a one-position
  graph replayed once per step: every row feeds its real token or its next pause, as its last
  decision says), so a row that rarely says dk costs about one position per token.

Rows never leave the batch: the caller ignores the rows it has finished (their steps still
run, at positions clamped below ``max_position_embeddings``).  Sampling takes its uniforms
from the readout's CPU generator before each step (a host-to-device copy into a fixed buffer),
drawn for every row exactly as the eager decoders draw them, so both paths sample alike.

Supported: decoders whose attention layers call ``cache.update(keys, values, layer_idx, ...)``
and accept a 4-D attention mask (Llama, Mistral without sliding window, Qwen2/3, Gemma 1), full
attention only (sliding-window models are refused: :func:`unsupported_reason`).  The tensors
returned by :meth:`_StaticDecoder.step` are overwritten by the next step: read them
(``.tolist()``) before stepping again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..model import hf
from ..generation.decoders import StepOutput, StepReadout, adaptive_update, attention_mask_4d, cut_block
from ..generation.decoders import fresh_d, prompt_layout

#: attention covers the written slots rounded up to this times a power of two (one graph each)
ATTENTION_BUCKET = 256
#: batches with fewer rows attend over the whole cache (one graph per call)
ATTENTION_BUCKET_MIN_ROWS = 8
#: the cache's slots per row are rounded up to a multiple of this
CAPACITY_MULTIPLE = 128


@dataclass(frozen=True)
class StaticCacheOptions:
    """How a static decoder sizes its cache and how much of it attention reads (the defaults are
    the library's, the module constants above).

    Attributes:
        attention_limits: batches of :attr:`bucket_min_rows` rows or more attend over the slots
            written so far, rounded up to :attr:`attention_bucket` times a power of two (one CUDA
            graph per limit); False: every batch attends over the whole cache (one graph).
        attention_bucket: the smallest attention limit, in slots.
        bucket_min_rows: smaller batches attend over the whole cache.
        capacity_multiple: the cache's slots per row are rounded up to a multiple of this
            (attention kernels run faster on aligned key lengths).
    """

    attention_limits: bool = True
    attention_bucket: int = ATTENTION_BUCKET
    bucket_min_rows: int = ATTENTION_BUCKET_MIN_ROWS
    capacity_multiple: int = CAPACITY_MULTIPLE

    def __post_init__(self) -> None:
        for name in ("attention_bucket", "bucket_min_rows", "capacity_multiple"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


class StaticKVCache:
    """Keys and values of every layer in preallocated ``[B, heads, capacity, head_dim]`` buffers.

    Buffers are allocated by the first forward (their shapes come from its keys and values).
    Each :meth:`update` writes the new steps at the slot indices in :attr:`slots` (a long device
    tensor with one index per new step) and returns the whole buffers.

    Args:
        capacity: slots per row (prompt steps plus every decoded step).
    """

    is_compileable = True  # fixed shapes and addresses (read by some transformers versions)

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.limit = capacity  # slots that attention covers (a prefix of the buffers)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.slots: torch.Tensor | None = None
        self.length = 0  # slots written so far (host-side count)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[B, heads, T, dim]`` keys/values at :attr:`slots` (``T`` of them) and return
        the first :attr:`limit` slots, ``[B, heads, limit, dim]``, of layer ``layer_idx``."""
        if layer_idx == len(self.keys):
            b, h, _, dk = key_states.shape
            self.keys.append(key_states.new_zeros(b, h, self.capacity, dk))
            self.values.append(value_states.new_zeros(b, h, self.capacity, value_states.shape[-1]))
        elif layer_idx > len(self.keys):
            raise RuntimeError(f"layer {layer_idx} updated before layer {len(self.keys)}")
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k.index_copy_(2, self.slots, key_states.to(k.dtype))
        v.index_copy_(2, self.slots, value_states.to(v.dtype))
        return k[:, :, :self.limit], v[:, :, :self.limit]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length


def unsupported_reason(model) -> str | None:
    """Why ``model`` (a :class:`cyb.PauseModel`) cannot decode on a :class:`StaticKVCache`,
    or None when it can."""
    if model.pause_visibility == "gated":
        return "the model's pauses are gated, which decode without a cache"
    if hf.has_sliding_window(model.config):
        return "the model has sliding-window layers (static decoding supports full attention only)"
    impl = hf.attention_of(model.hf_model)
    if impl not in (None, "sdpa", "eager", hf.PAUSE_ATTENTION):
        return f"static decoding needs sdpa or eager attention, the model uses {impl!r}"
    return None


def check_supported(model) -> None:
    """Raise unless ``model`` (a :class:`cyb.PauseModel`) can decode on a :class:`StaticKVCache`."""
    reason = unsupported_reason(model)
    if reason is not None:
        raise ValueError(f"static decoding is not available: {reason}; use the eager decoder")


class _StaticDecoder:
    """Shared machinery: cache, masks, the fixed step inputs, capture and replay.

    Args:
        model: a :class:`cyb.PauseModel` in eval mode.
        ids: ``[B, P]`` prompt ids, left-padded; ``mask``: ``[B, P]`` 1 for tokens, 0 for padding.
        readout: the decision rule (default: greedy).
        max_new_tokens: real tokens to generate at most per row; sizes the cache.
        cuda_graph: capture the decode step as a CUDA graph (default: on CUDA).
        cache_options: the cache's size and attention limits (default: :class:`StaticCacheOptions`).
    """

    keeps_rows = True
    mode = "fixed"
    #: how the prompt pass lays the prompt out (:func:`~cyb.generation.decoders.prompt_layout`)
    prompt_mode = "fixed"

    def __init__(self, model, ids: torch.Tensor, mask: torch.Tensor,
                 readout: StepReadout | None = None, *, max_new_tokens: int,
                 cuda_graph: bool | None = None,
                 cache_options: StaticCacheOptions | None = None) -> None:
        check_supported(model)
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        self.model = model
        self.vocab = model.vocab
        self.m = self.vocab.num_steps
        self.advance = self.vocab.position_scheme == "advance"
        self.device = ids.device
        self.use_graph = (self.device.type == "cuda") if cuda_graph is None else bool(cuda_graph)
        if self.use_graph and self.device.type != "cuda":
            raise ValueError("cuda_graph=True needs the prompts on a CUDA device")
        self.ids, self.mask = ids, mask
        self.num_rows = ids.shape[0]
        self.readout = readout if readout is not None else StepReadout(self.vocab, model.dk_bias)
        self.decoder = model.decoder
        self.cache_arg = hf.cache_arg_name(self.decoder)
        self.additive = model.dtype if hf.attention_of(model.hf_model) == "eager" else None
        self.pause_ids = self.vocab.pause_id_tensor(self.device)
        self.max_new_tokens = max_new_tokens
        self.options = cache_options if cache_options is not None else StaticCacheOptions()
        limit = getattr(hf.text_config(model.config), "max_position_embeddings", None)
        self.max_position = limit - 1 if isinstance(limit, int) else None
        # a multiple of capacity_multiple: attention kernels run faster on aligned key lengths
        needed = self._prompt_steps() + self._decode_slots()
        multiple = self.options.capacity_multiple
        self.capacity = -(-needed // multiple) * multiple
        self.cache = StaticKVCache(self.capacity)
        self.valid = torch.ones(self.num_rows, self.capacity, dtype=torch.bool, device=self.device)
        self.uniforms: torch.Tensor | None = None  # [B, width] buffer when sampling
        self.slots: torch.Tensor | None = None  # slots the next step writes
        self.graph = None  # the graph of the current attention limit
        self.graph_out: StepOutput | None = None
        self.graphs_captured = 0
        self.capture_ms = 0.0  # host time of every capture so far (warm-up steps included)
        self.steps_taken = 0
        self.prompt_positions: torch.Tensor | None = None

    # ------------------------------------------------------------------ to define
    def _prompt_steps(self) -> int:
        raise NotImplementedError

    def _decode_slots(self) -> int:
        """Slots the decode steps may write, plus what the capture's warm-up writes ahead."""
        raise NotImplementedError

    def _first(self, hidden: torch.Tensor, pos: torch.Tensor, t: int) -> StepOutput:
        """Decide on the prompt's hidden states and set up the step inputs."""
        raise NotImplementedError

    def _step_body(self) -> StepOutput:
        """One decode step on the fixed inputs, which it then advances to the next step."""
        raise NotImplementedError

    def _state(self) -> list[torch.Tensor]:
        """The step inputs the step advances (saved and restored around the capture warm-up)."""
        raise NotImplementedError

    #: uniforms per row per decision (when sampling)
    width = 0
    #: positions each row feeds per step
    positions_per_step = 1
    #: cache slots each step leaves written for later steps (None: positions_per_step)
    slots_per_step: int | None = None

    @property
    def _slot_advance(self) -> int:
        return self.positions_per_step if self.slots_per_step is None else self.slots_per_step

    # ------------------------------------------------------------------ pieces
    def _forward(self, input_ids, position_ids, slots) -> torch.Tensor:
        self.cache.slots = slots
        mask = attention_mask_4d(self.valid[:, :self.cache.limit], slots, additive_dtype=self.additive)
        out = self.decoder(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                           use_cache=True, **{self.cache_arg: self.cache})
        return out.last_hidden_state

    def _draw(self) -> None:
        """Sampling is not kept in the baseline (greedy decisions draw nothing)."""
        if self.readout.random:
            raise ValueError("the static-batch baseline decoders are greedy only")

    def _clamp(self, pos: torch.Tensor) -> torch.Tensor:
        """Positions of finished rows may run past the model's limit: clamp them (in place)."""
        return pos if self.max_position is None else pos.clamp_(max=self.max_position)

    # ------------------------------------------------------------------ public
    def start(self) -> StepOutput:
        """Run the prompts (eagerly) and make every row's first decision."""
        input_ids, pos, valid, next_pos = prompt_layout(self.ids, self.mask, self.vocab, self.prompt_mode)
        t = input_ids.shape[1]
        self.valid[:, :t] = valid.bool()
        self.cache.limit = self._limit_for(t)
        hidden = self._forward(input_ids, pos, torch.arange(t, device=self.device))
        self.cache.length = t
        self.prompt_positions = valid.sum(-1)
        self._draw()
        return self._first(hidden, next_pos, t)

    def _limit_for(self, slots_used: int) -> int:
        """The attention limit that covers ``slots_used`` slots: the options' attention bucket
        times the smallest power of two that covers them, at most the capacity (the capacity
        without attention limits, and for batches of fewer than ``bucket_min_rows`` rows)."""
        opts = self.options
        if not opts.attention_limits or self.num_rows < opts.bucket_min_rows:
            return self.capacity
        limit = opts.attention_bucket
        while limit < slots_used:
            limit *= 2
        return min(self.capacity, limit)

    def capture(self) -> None:
        """Capture the decode step as a CUDA graph for the next step's attention limit (after
        :meth:`start`; done by :meth:`step` when ``cuda_graph``, again whenever decoding
        outgrows the limit).  The limit also covers the two warm-up steps that run on a side
        stream first; the inputs are then put back, and what the warm-up wrote is rewritten by
        the real steps.  The previous limit's graph is dropped (its memory goes back once its
        last outputs are released)."""
        if self.slots is None:
            raise RuntimeError("call start() before capture()")
        if self.readout.random and self.uniforms is None:
            raise RuntimeError("sampling: the uniforms buffer is made by start()")
        t0 = time.perf_counter()
        self.graph = self.graph_out = None
        self.cache.limit = self._limit_for(self.cache.length + 3 * self.positions_per_step)
        state = self._state()
        saved = [t.clone() for t in state]
        main = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step_body()
        main.wait_stream(side)
        for t, v in zip(state, saved):
            t.copy_(v)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.graph_out = self._step_body()
        self.graph = graph
        self.graphs_captured += 1
        torch.cuda.synchronize(self.device)  # a capture is rare: time it whole
        self.capture_ms += (time.perf_counter() - t0) * 1e3

    def _check_room(self) -> None:
        raise NotImplementedError

    def step(self) -> StepOutput:
        """Feed what the last decisions ask for and decide again."""
        if self.slots is None:
            raise RuntimeError("call start() before step()")
        self._check_room()
        self._draw()
        needed = self._limit_for(self.cache.length + self.positions_per_step)
        if self.use_graph:
            if self.graph is None or needed > self.cache.limit:
                self.capture()
            self.graph.replay()
            out = self.graph_out
        else:
            self.cache.limit = needed
            out = self._step_body()
        self.cache.length += self._slot_advance
        self.steps_taken += 1
        return out


class StaticFixedDecoder(_StaticDecoder):
    """Fixed mode (Recipe 1): each step feeds every row's last token and its ``M-1`` pauses."""

    mode = "fixed"

    def __init__(self, model, ids, mask, readout=None, *, max_new_tokens, cuda_graph=None,
                 cache_options=None) -> None:
        super().__init__(model, ids, mask, readout, max_new_tokens=max_new_tokens, cuda_graph=cuda_graph,
                         cache_options=cache_options)
        self.positions_per_step = self.m
        self.width = self.m + 1
        self.pos_increment = self.m if self.advance else 1
        self.step_ids = self.step_pos = None

    def _prompt_steps(self) -> int:
        return self.ids.shape[1] * self.m

    def _decode_slots(self) -> int:
        # max_new_tokens - 1 blocks decoded, and two blocks that the capture's warm-up writes
        return (self.max_new_tokens + 1) * self.m

    def _decide(self, block_hidden: torch.Tensor) -> StepOutput:
        return self.readout.block(self.model.logits(block_hidden), self.uniforms)

    def _first(self, hidden, next_pos, t) -> StepOutput:
        m, b = self.m, self.num_rows
        out = self._decide(hidden[:, -m:])
        self.step_ids = self.pause_ids.unsqueeze(0).repeat(b, 1)
        self.step_ids[:, 0] = out.token
        offsets = torch.arange(m, device=self.device) * int(self.advance)
        self.step_pos = next_pos.unsqueeze(1) + offsets
        self.slots = torch.arange(t, t + m, device=self.device)
        return out

    def _state(self):
        return [self.step_ids, self.step_pos, self.slots]

    def _step_body(self) -> StepOutput:
        hidden = self._forward(self.step_ids, self.step_pos, self.slots)
        out = self._decide(hidden)
        self.step_ids[:, 0].copy_(out.token)
        self._clamp(self.step_pos.add_(self.pos_increment))
        self.slots.add_(self.m)
        return out

    def _check_room(self) -> None:
        if self.steps_taken + 1 >= self.max_new_tokens:
            raise RuntimeError(f"max_new_tokens = {self.max_new_tokens} decisions already made "
                               "(the cache is sized for them)")


class StaticAdaptiveDecoder(_StaticDecoder):
    """Adaptive mode (Recipe 2): each step feeds one position per row -- its answer at a new
    position, or the next pause after a dk -- decided on the device by the previous step."""

    mode = "adaptive"
    prompt_mode = "adaptive"

    def __init__(self, model, ids, mask, readout=None, *, max_new_tokens, cuda_graph=None,
                 cache_options=None) -> None:
        super().__init__(model, ids, mask, readout, max_new_tokens=max_new_tokens, cuda_graph=cuda_graph,
                         cache_options=cache_options)
        self.width = 3
        self.feed = self.pos = self.step_idx = self.d_acc = None

    def _prompt_steps(self) -> int:
        return (self.ids.shape[1] - 1) * self.m + 1

    def _decode_slots(self) -> int:
        # a row makes at most M decisions per token, the first in start(); +2: capture warm-up
        return self.max_new_tokens * self.m + 2

    def _apply(self, logits: torch.Tensor) -> tuple[StepOutput, list[torch.Tensor]]:
        out, feed, pos, step_idx, d_acc = adaptive_update(self, logits, self.uniforms)
        return out, [feed, pos, step_idx, d_acc]

    def _first(self, hidden, next_pos, t) -> StepOutput:
        b = self.num_rows
        self.pos = next_pos
        self.step_idx = torch.ones(b, dtype=torch.long, device=self.device)
        self.d_acc = fresh_d(b, self.m, self.device)
        out, (self.feed, self.pos, self.step_idx, self.d_acc) = self._apply(
            self.model.logits(hidden[:, -1]))
        self._clamp(self.pos)
        self.slots = torch.tensor([t], dtype=torch.long, device=self.device)
        return out

    def _state(self):
        return [self.feed, self.pos, self.step_idx, self.d_acc, self.slots]

    def _step_body(self) -> StepOutput:
        hidden = self._forward(self.feed.unsqueeze(1), self.pos.unsqueeze(1), self.slots)
        out, new = self._apply(self.model.logits(hidden[:, -1]))
        for t, v in zip((self.feed, self.pos, self.step_idx, self.d_acc), new):
            t.copy_(v)
        self._clamp(self.pos)
        self.slots.add_(1)
        return out

    def _check_room(self) -> None:
        if self.cache.length + 1 > self.capacity - 2:
            raise RuntimeError(f"the cache holds {self.capacity} slots, all used: at most "
                               f"max_new_tokens * M = {self.max_new_tokens * self.m} decisions")


class StaticBlockAdaptiveDecoder(StaticFixedDecoder):
    """Adaptive mode, greedy, one replay per real token: each step feeds a row's token with its
    ``M - 1`` pauses (as fixed mode does), reads the block out sequentially and marks the
    block's steps after the stop step ``s`` invalid, so that what later steps attend to and the
    positions of later tokens are those of adaptive mode (see the module docstring).

    The prompt pass lays the last prompt token out with its pauses too, and its block is cut
    at its stop step alike.  Outputs follow adaptive mode: ``d`` is NaN for the steps after
    ``s`` (``d_M = 0``), ``expected_steps`` is None.  ``positions_per_step`` is ``M``: the
    positions that go through the network, of which ``s`` stay visible.
    """

    mode = "adaptive"
    prompt_mode = "fixed"

    def __init__(self, model, ids, mask, readout=None, *, max_new_tokens, cuda_graph=None,
                 cache_options=None) -> None:
        super().__init__(model, ids, mask, readout, max_new_tokens=max_new_tokens, cuda_graph=cuda_graph,
                         cache_options=cache_options)
        if self.readout.random:
            raise ValueError("block-adaptive decoding is greedy; sampling in adaptive mode "
                             "uses StaticAdaptiveDecoder")
        self.step_in_block = torch.arange(self.m, device=self.device)

    def _decide(self, block_hidden: torch.Tensor) -> StepOutput:
        kept, out = cut_block(self.readout.block(self.model.logits(block_hidden)), self.step_in_block)
        # the steps adaptive mode never runs are invisible to later steps
        self.valid.index_copy_(1, self.slots_of_block, kept)
        return out

    def _first(self, hidden, next_pos, t) -> StepOutput:
        self.slots_of_block = torch.arange(t - self.m, t, device=self.device)  # the prompt's last
        out = super()._first(hidden, next_pos, t)
        self.slots_of_block = self.slots  # from here on the block each step feeds (advanced in place)
        self._rewind(out.steps)
        return out

    def _rewind(self, steps: torch.Tensor) -> None:
        """Under the advance scheme the next token follows the ``s``-th step, not the ``M``-th:
        move the next block's positions back by ``M - s`` (in place)."""
        if self.advance:
            self.step_pos.sub_((self.m - steps).unsqueeze(1))

    def _state(self):
        return [self.step_ids, self.step_pos, self.slots, self.valid]

    def _step_body(self) -> StepOutput:
        out = super()._step_body()
        self._rewind(out.steps)
        return out


class StaticPrivateDecoder(StaticFixedDecoder):
    """Private pauses on a static cache: the cache holds one slot per real token.  Each step
    writes a row's token and its ``M - 1`` pauses at slots ``n .. n + M - 1``, where ``n`` is
    the token's own slot, attends causally over the slots (the cached real tokens, then the
    block), and moves ``n`` on by one: the next token overwrites the pauses.  The prompt pass
    runs the prompt's real tokens and the last one's pauses.  Fixed and adaptive mode make the
    same decisions (greedy or sampled: :mod:`cyb.generation.private` says why); adaptive mode
    reports ``d`` only up to the stop step."""

    slots_per_step = 1

    def __init__(self, model, ids, mask, readout=None, *, max_new_tokens, cuda_graph=None,
                 cache_options=None, mode: str = "fixed") -> None:
        if model.pause_visibility != "private":
            raise ValueError("StaticPrivateDecoder needs a model with private pauses")
        super().__init__(model, ids, mask, readout, max_new_tokens=max_new_tokens, cuda_graph=cuda_graph,
                         cache_options=cache_options)
        self.mode = mode
        self.step_in_block = torch.arange(self.m, device=self.device)

    def _prompt_steps(self) -> int:
        return self.ids.shape[1] + self.m - 1

    def _decode_slots(self) -> int:
        # one slot per decided token, the block's M, and two steps of capture warm-up
        return self.max_new_tokens + self.m + 2

    def _decide(self, block_hidden: torch.Tensor) -> StepOutput:
        out = super()._decide(block_hidden)
        return cut_block(out, self.step_in_block)[1] if self.mode == "adaptive" else out

    def start(self) -> StepOutput:
        from ..generation.private import private_prompt

        input_ids, pos, valid, next_pos = private_prompt(self.ids, self.mask, self.vocab)
        t, p = input_ids.shape[1], self.ids.shape[1]
        self.valid[:, :t] = valid
        self.cache.limit = self._limit_for(t)
        hidden = self._forward(input_ids, pos, torch.arange(t, device=self.device))
        self.cache.length = p  # the last token's pauses are overwritten by the first new block
        self.prompt_positions = valid.sum(-1)
        self._draw()
        return self._first(hidden, next_pos, p)

    def _step_body(self) -> StepOutput:
        hidden = self._forward(self.step_ids, self.step_pos, self.slots)
        out = self._decide(hidden)
        self.step_ids[:, 0].copy_(out.token)
        self._clamp(self.step_pos.add_(self.pos_increment))
        self.slots.add_(1)
        return out

    def _check_room(self) -> None:
        if self.steps_taken + 1 >= self.max_new_tokens:
            raise RuntimeError(f"max_new_tokens = {self.max_new_tokens} decisions already made "
                               "(the cache is sized for them)")
