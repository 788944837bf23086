"""Fixed-mode greedy decoding on a preallocated KV cache; the decode step can be a CUDA graph.

:class:`StaticFixedDecoder` makes the same decisions as
:class:`cyb.generation.decoders.FixedDecoder` with a greedy
:class:`~cyb.generation.decoders.StepReadout` (Recipe 1: each new real token and its ``M-1``
pauses in one forward of ``M`` positions, the sequential readout of that block gives the next
token), but every tensor of a decode step has a fixed shape and address:

* :class:`StaticKVCache` holds each layer's keys and values in ``[B, heads, capacity, dim]``
  buffers and writes new steps at the slots of a device tensor (``index_copy_``); attention
  runs over all ``capacity`` slots with an explicit 4-D mask (slots not yet written, padding of
  the prompt and, within the new block, later steps are masked out);
* the step's inputs (ids, positions, slots) live in fixed tensors that the step itself advances
  (the decided token becomes the next block's first id), so on CUDA the whole step -- decoder,
  output projection, readout, input update -- is captured once as a CUDA graph and each decode
  step is one ``graph.replay()``.  Elsewhere the same step runs eagerly.

Supported: decoders whose attention layers call ``cache.update(keys, values, layer_idx, ...)``
and accept a 4-D attention mask (Llama, Mistral without sliding window, Qwen2/3, Gemma 1), full
attention only (sliding-window models are refused), greedy decisions only, a fixed batch (rows
do not leave it).  The tensors returned by :meth:`StaticFixedDecoder.step` are overwritten by
the next step: read them (``.tolist()``) before stepping again.
"""

from __future__ import annotations

import torch

from ..layout import expand
from ..model import hf
from .decoders import StepOutput, StepReadout


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
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.slots: torch.Tensor | None = None
        self.length = 0  # slots written so far (host-side count)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[B, heads, T, dim]`` keys/values at :attr:`slots` (``T`` of them) and return
        the full ``[B, heads, capacity, dim]`` buffers of layer ``layer_idx``."""
        if layer_idx == len(self.keys):
            b, h, _, dk = key_states.shape
            self.keys.append(key_states.new_zeros(b, h, self.capacity, dk))
            self.values.append(value_states.new_zeros(b, h, self.capacity, value_states.shape[-1]))
        elif layer_idx > len(self.keys):
            raise RuntimeError(f"layer {layer_idx} updated before layer {len(self.keys)}")
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k.index_copy_(2, self.slots, key_states.to(k.dtype))
        v.index_copy_(2, self.slots, value_states.to(v.dtype))
        return k, v

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length


def check_supported(model) -> None:
    """Raise unless ``model`` (a :class:`cyb.PauseModel`) can decode on a :class:`StaticKVCache`."""
    cfg = hf.text_config(model.config)
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is not None:
        sliding = any("sliding" in str(t) for t in layer_types)
    else:  # (Qwen2 keeps a window size with use_sliding_window = False)
        sliding = bool(getattr(cfg, "sliding_window", None)) and getattr(cfg, "use_sliding_window", True)
    if sliding:
        raise ValueError("static decoding supports full-attention models only; this model has "
                         "sliding-window layers (use cyb.generation)")
    impl = hf.attention_of(model.hf_model)
    if impl not in (None, "sdpa", "eager"):
        raise ValueError(f"static decoding needs sdpa or eager attention, got {impl!r}")


class StaticFixedDecoder:
    """Greedy fixed-mode decoding of a batch of left-padded prompts on a :class:`StaticKVCache`.

    Args:
        model: a :class:`cyb.PauseModel` in eval mode.
        ids: ``[B, P]`` prompt ids, left-padded; ``mask``: ``[B, P]`` 1 for tokens, 0 for padding.
        max_new_tokens: decisions to make at most (:meth:`start` gives the first, each
            :meth:`step` one more); sizes the cache.
        cuda_graph: capture the decode step as a CUDA graph (default: on CUDA).
    """

    def __init__(self, model, ids: torch.Tensor, mask: torch.Tensor, *, max_new_tokens: int,
                 cuda_graph: bool | None = None) -> None:
        check_supported(model)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.model = model
        self.vocab = model.vocab
        self.m = m = self.vocab.num_steps
        self.device = ids.device
        self.use_graph = (self.device.type == "cuda") if cuda_graph is None else bool(cuda_graph)
        if self.use_graph and self.device.type != "cuda":
            raise ValueError("cuda_graph=True needs the prompts on a CUDA device")
        self.ids, self.mask = ids, mask
        self.readout = StepReadout(self.vocab, model.dk_bias)
        self.decoder = model.decoder
        self.cache_arg = hf.cache_arg_name(self.decoder)
        self.bool_mask = hf.attention_of(model.hf_model) != "eager"  # sdpa takes a bool mask
        self.prompt_steps = ids.shape[1] * m
        self.max_new_tokens = max_new_tokens
        # one block more than the decisions need: capture's warm-up steps write ahead
        self.capacity = self.prompt_steps + (max_new_tokens + 1) * m
        self.cache = StaticKVCache(self.capacity)
        self.cols = torch.arange(self.capacity, device=self.device)
        self.valid = torch.ones(ids.shape[0], self.capacity, dtype=torch.bool, device=self.device)
        self.step_ids = self.step_pos = self.step_slots = None
        self.pos_increment = m if self.vocab.position_scheme == "advance" else 1
        self.graph = None
        self.graph_out: StepOutput | None = None
        self.steps_taken = 0
        self.prompt_positions: torch.Tensor | None = None

    # ------------------------------------------------------------------ pieces
    def _attention_mask(self, query_slots: torch.Tensor) -> torch.Tensor:
        """``[B, 1, T, capacity]`` mask for new steps at ``query_slots [T]``: a step sees valid
        slots up to its own, and always itself (so padding steps never have an empty softmax)."""
        upto = self.cols.unsqueeze(0) <= query_slots.unsqueeze(1)  # [T, capacity]
        own = self.cols.unsqueeze(0) == query_slots.unsqueeze(1)
        allowed = (self.valid[:, None, None, :] & upto) | own
        if self.bool_mask:
            return allowed
        dtype = self.model.dtype
        zero = torch.zeros((), dtype=dtype, device=self.device)
        return torch.where(allowed, zero, torch.finfo(dtype).min)

    def _forward(self, input_ids, position_ids, slots) -> torch.Tensor:
        self.cache.slots = slots
        out = self.decoder(input_ids=input_ids, attention_mask=self._attention_mask(slots),
                           position_ids=position_ids, use_cache=True, **{self.cache_arg: self.cache})
        return out.last_hidden_state

    def _decide(self, block_hidden: torch.Tensor) -> StepOutput:
        return self.readout.block(self.model.logits(block_hidden))

    def _step_body(self) -> StepOutput:
        """One decode step on the fixed inputs, which it then advances to the next step."""
        hidden = self._forward(self.step_ids, self.step_pos, self.step_slots)
        out = self._decide(hidden)
        self.step_ids[:, 0].copy_(out.token)
        self.step_pos.add_(self.pos_increment)
        self.step_slots.add_(self.m)
        return out

    # ------------------------------------------------------------------ public
    def start(self) -> StepOutput:
        """Run the prompts (eagerly) and decide the first new token of every row."""
        m = self.m
        lay = expand(self.ids, self.vocab, attention_mask=self.mask, check_ids=False)
        t = lay.input_ids.shape[1]
        self.valid[:, :t] = lay.attention_mask.bool()
        hidden = self._forward(lay.input_ids, lay.position_ids, torch.arange(t, device=self.device))
        self.cache.length = t
        self.prompt_positions = lay.attention_mask.sum(-1)
        out = self._decide(hidden[:, -m:])
        self.step_ids = self.vocab.pause_id_tensor(self.device).unsqueeze(0).repeat(self.ids.shape[0], 1)
        self.step_ids[:, 0] = out.token
        offsets = torch.arange(m, device=self.device) * int(self.vocab.position_scheme == "advance")
        self.step_pos = (lay.position_ids[:, -1] + 1).unsqueeze(1) + offsets
        self.step_slots = torch.arange(t, t + m, device=self.device)
        return out

    def capture(self) -> None:
        """Capture the decode step as a CUDA graph (after :meth:`start`; done by the first
        :meth:`step` when ``cuda_graph``).  Two warm-up steps run on a side stream first; the
        inputs are then put back, and what they wrote is rewritten by the real steps."""
        if self.step_ids is None:
            raise RuntimeError("call start() before capture()")
        state = (self.step_ids, self.step_pos, self.step_slots)
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

    def step(self) -> StepOutput:
        """Feed the last decided token with its pauses and decide the next one."""
        if self.step_ids is None:
            raise RuntimeError("call start() before step()")
        if self.steps_taken + 1 >= self.max_new_tokens:
            raise RuntimeError(f"max_new_tokens = {self.max_new_tokens} decisions already made "
                               "(the cache is sized for them)")
        if self.use_graph:
            if self.graph is None:
                self.capture()
            self.graph.replay()
            out = self.graph_out
        else:
            out = self._step_body()
        self.cache.length += self.m
        self.steps_taken += 1
        return out


@torch.inference_mode()
def greedy_tokens(decoder, num_tokens: int) -> list[list[int]]:
    """``[B][num_tokens]`` greedy tokens of a new (not yet started) ``FixedDecoder`` or
    :class:`StaticFixedDecoder`; each step's tokens are read before the next step."""
    out = decoder.start()
    rows = [[t] for t in out.token.tolist()]
    for _ in range(num_tokens - 1):
        out = decoder.step()
        for row, t in zip(rows, out.token.tolist()):
            row.append(t)
    return rows
