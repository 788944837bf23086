"""The memory plan of a training run: an analytic estimate of the peak memory per GPU.

:func:`estimate` reads a :class:`~cyb.config.RunConfig` (and the model's shape) and returns a
:class:`MemoryEstimate`: bytes per process for the weights, the gradients and AdamW state of the
trainable parameters, the activations kept for backward, the readout, FSDP's gathered buffers
and the bf16 copies autocast makes of float32 weights, and the peak they add up to.  ``cyb
train`` asks for it before it builds the model on a GPU and refuses a run whose peak exceeds the
GPU's free memory (``train.memory_check``); ``cyb bench memory`` sets it beside measured peaks.

What the training loop keeps (``cyb.train``):

* parameters in ``model.dtype`` (``auto`` = float32), no separate master copy; gradients in the
  same dtype; AdamW's two moments in the same dtype (``torch.optim.AdamW`` keeps its state like
  its parameter);
* under bf16 autocast with float32 parameters, autocast caches a bf16 copy of every weight a
  matmul reads until the step's backward is done; FSDP2 with mixed precision gathers bf16
  parameters instead (one block at a time, the root module's embedding and head for the whole
  step);
* activations: per decoder block and position the tensors autograd saves (counted below, for
  Llama/Gemma-style blocks with causal SDPA: rows without padding need no ``T x T`` mask); with
  ``model.gradient_checkpointing`` only each block's input plus one block recomputed in
  backward;
* the readout: the fused loss (CUDA default, :mod:`cyb.kernels.chunked`) holds two chunks of
  logits and a float32 ``[V, H]`` weight-gradient accumulator, never the full logits; the naive
  readout holds the full ``[N, V]`` logits and their gradient;
* the sequence holds ``positions_per_row`` steps per row (real tokens x M for Recipe 1, from
  the method's :class:`~cyb.methods.MethodSpec`).

Gradient accumulation (several micro-batches per step) keeps the gradients alive during the
next micro-batch's forward; with one micro-batch they replace the activations during backward,
so the peak is the larger of the two phases.  The count is an estimate (the allocator's
fragmentation and kernel workspaces come on top); ``cyb bench memory`` measures how close it is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from . import families

GIB = float(2**30)


class MemoryPlanError(ValueError):
    """A run's estimated peak memory exceeds what the device has free."""


@dataclass(frozen=True)
class ModelShape:
    """What the memory of a decoder-only model depends on."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    model_type: str = "llama"
    sliding_window: int | None = None
    sliding_layers: int = 0

    @classmethod
    def from_hf_config(cls, config, vocab: int | None = None) -> "ModelShape":
        """From a Hugging Face config (the text part of a multimodal one); ``vocab`` overrides
        its vocabulary size (e.g. after pause tokens are added)."""
        from .model.hf import text_config

        c = text_config(config)
        heads = int(c.num_attention_heads)
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        window = getattr(c, "sliding_window", None)
        kinds = getattr(c, "layer_types", None)
        sliding = (sum(k == "sliding_attention" for k in kinds) if kinds else int(c.num_hidden_layers)) if window else 0
        return cls(hidden=int(c.hidden_size), layers=int(c.num_hidden_layers), heads=heads,
                   kv_heads=int(getattr(c, "num_key_value_heads", None) or heads),
                   head_dim=int(head_dim), intermediate=int(c.intermediate_size),
                   vocab=int(vocab if vocab is not None else c.vocab_size),
                   tied=bool(getattr(config, "tie_word_embeddings", getattr(c, "tie_word_embeddings", True))),
                   model_type=str(getattr(c, "model_type", "llama")),
                   sliding_window=int(window) if window else None, sliding_layers=sliding)

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linears(self) -> dict[str, tuple[int, int]]:
        """``{name: (in_features, out_features)}`` of the linear modules of one block."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    @property
    def family(self) -> families.Family:
        """The family of its ``model_type`` (:mod:`cyb.families`: norms, biases); another
        architecture is counted as a Llama."""
        return families.of_model_type(self.model_type) or families.family("llama")

    @property
    def norms_per_layer(self) -> int:
        return self.family.norms_per_layer

    def layer_params(self) -> int:
        """Parameters of one block (linears, norms, biases)."""
        n = sum(a * b for a, b in self.linears().values()) + self.norms_per_layer * self.hidden
        if self.family.qk_norm:
            n += 2 * self.head_dim
        if self.family.qkv_bias:
            n += self.q_dim + 2 * self.kv_dim
        return n

    def embedding_params(self) -> int:
        """Input embedding plus the output head when untied."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def params(self) -> int:
        """All parameters (tied matrices once)."""
        return self.embedding_params() + self.layers * self.layer_params() + self.hidden


def _lora_settings(cfg):
    """``(rank, target_modules)`` of the run's ``lora`` section; rank 0 without one."""
    lora = getattr(cfg, "lora", None)
    rank = int(getattr(lora, "rank", 0) or 0) if lora is not None else 0
    targets = getattr(lora, "target_modules", None) if lora is not None else None
    return rank, targets


def lora_trainable(shape: ModelShape, rank: int, target_modules=None, num_new_rows: int = 0) -> int:
    """Trainable parameters of LoRA of ``rank``: ``rank x (in + out)`` per targeted linear
    per block, plus the embedding rows of the ``num_new_rows`` pause/dk tokens (and their
    output rows when the head is untied).

    ``target_modules``: names from :data:`cyb.families.PROJECTIONS`, ``"all-linear"``, or None
    (all of them); other names are not counted.
    """
    lin = shape.linears()
    if target_modules is None or target_modules == "all-linear" or list(target_modules) == ["all-linear"]:
        names = list(lin)
    else:
        names = [n for n in ([target_modules] if isinstance(target_modules, str) else target_modules) if n in lin]
    adapters = shape.layers * sum(rank * (lin[n][0] + lin[n][1]) for n in names)
    return adapters + num_new_rows * shape.hidden * (1 if shape.tied else 2)


@dataclass
class MemoryEstimate:
    """Bytes per process of a training run's peak, and how they were counted.

    The parts: ``weights`` (this process's share of the parameters), ``autocast_copies`` (bf16
    copies of float32 weights under autocast), ``fsdp_buffers`` (gathered bf16 parameters and
    unsharded gradients of FSDP2), ``gradients`` and ``optimizer`` (AdamW's two moments) of the
    trainable parameters, ``activations`` (saved for backward, per micro-batch), ``readout``
    (logits chunks or full logits, the output-weight gradient accumulator) and ``workspace``
    (gradients of one block's activations in backward).
    """

    weights: int
    autocast_copies: int
    fsdp_buffers: int
    gradients: int
    optimizer: int
    activations: int
    readout: int
    workspace: int
    params: int
    trainable: int
    positions: int
    micro_batch: int
    accumulation: int
    world_size: int
    sharded: bool
    checkpointing: bool
    param_bytes: int
    compute_bytes: int
    fused_readout: bool
    lora_rank: int = 0
    activation_bytes_per_token_layer: int = 0
    notes: list = field(default_factory=list)

    @property
    def persistent(self) -> int:
        """What lives through the whole step: weights, AdamW state, autocast copies, FSDP buffers."""
        return self.weights + self.optimizer + self.autocast_copies + self.fsdp_buffers

    @property
    def forward_backward(self) -> int:
        """Activations, readout and backward workspace (and the gradients when accumulating)."""
        grads = self.gradients if self.accumulation > 1 else 0
        return self.activations + self.readout + self.workspace + grads

    @property
    def peak(self) -> int:
        """The estimated peak: persistent memory plus the larger of forward/backward and the
        optimiser step (all gradients alive)."""
        return self.persistent + max(self.forward_backward, self.gradients)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(peak=self.peak, peak_gib=self.peak / GIB)
        return d

    def parts(self) -> list[tuple[str, int]]:
        """``(name, bytes)`` of every part, in the order of :meth:`describe`."""
        return [("weights", self.weights), ("autocast bf16 copies", self.autocast_copies),
                ("FSDP gathered buffers", self.fsdp_buffers), ("gradients", self.gradients),
                ("AdamW state", self.optimizer), ("activations", self.activations),
                ("readout", self.readout), ("backward workspace", self.workspace)]

    def describe(self) -> str:
        """A readable breakdown, one part per line, in GiB."""
        trainable = (f"{self.trainable / 1e6:,.1f} M trainable" +
                     (f" (LoRA rank {self.lora_rank})" if self.lora_rank else ""))
        shard = f", FSDP over {self.world_size} processes" if self.sharded else (
            f", {self.world_size} processes" if self.world_size > 1 else "")
        lines = [f"estimated peak memory per GPU: {self.peak / GIB:.1f} GiB "
                 f"({self.params / 1e6:,.1f} M parameters, {trainable}; micro-batch "
                 f"{self.micro_batch} x {self.positions} positions; {self.param_bytes}-byte parameters, "
                 f"{self.compute_bytes}-byte compute; gradient checkpointing "
                 f"{'on' if self.checkpointing else 'off'}; "
                 f"{'fused' if self.fused_readout else 'naive'} readout{shard})"]
        for name, value in self.parts():
            if value:
                lines.append(f"  {name:<22} {value / GIB:8.2f} GiB")
        if self.accumulation > 1:
            lines.append(f"  (gradients counted during forward/backward too: {self.accumulation} "
                         "micro-batches per step)")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def positions_per_row(cfg, real_tokens: int | None = None) -> int:
    """Positions (real tokens and pauses) of one training row, at most (the method's layout), for
    rows of ``real_tokens`` real tokens (default: packed text's ``data.block_len``)."""
    me, spec = cfg.method, cfg.method.spec
    real = real_tokens if real_tokens is not None else spec.context(me, cfg.data.block_len)
    if spec.layout == "blocks":
        return real * me.num_steps  # Recipe 2 rows are padded to at most this
    if spec.layout == "inserted":
        extra = me.num_steps - 1 if me.tbys_scheme == "append" else int(round(me.random_pause_fraction * real))
        return real + extra
    return real


def _dtype_bytes(name: str) -> int:
    return {"auto": 4, "float32": 4, "bfloat16": 2, "float16": 2}[name]


def activation_bytes_per_token(shape: ModelShape, param_bytes: int, compute_bytes: int) -> int:
    """Bytes autograd saves per position in one decoder block (no checkpointing).

    ``p``: parameter (residual stream) bytes, ``a``: compute bytes (2 under bf16 autocast).
    Norms: Llama-style (``x.float()``, normalise, ``weight * x.to(dtype)``) save the float32
    input and the normalised input in the residual dtype, ``H x (4 + p)``; Gemma-style
    (``(1 + weight) * norm(x.float())``) two float32 tensors, ``8 H``; then the next matmuls'
    input, ``a H``, or one bf16 cast per matmul when autocast casts a float32 residual stream
    (Gemma 2/3 add two norms after attention and MLP, and Gemma 3 / Qwen 3 per-head norms on
    queries and keys). Attention (SDPA,
    causal, grouped-query heads not repeated): rotated queries, keys, values and the output,
    ``a x (2 q + 2 kv)``, and a float32 log-sum-exp per head. MLP: gate, activation, up and
    their product, ``a x 4 I``.
    """
    h, q, kv, i = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    p, a = param_bytes, compute_bytes
    # the matmul inputs after the two norms: one tensor, or under autocast with float32
    # weights a bf16 cast per consumer (q, k, v; gate, up)
    casts = 2 if p == a else 5
    if shape.family.float32_norms:
        norms = 2 * 8 * h + casts * a * h + (2 * 8 * h if shape.norms_per_layer == 4 else 0)
        qk_norm = 8 * (q + kv)
    else:
        norms = 2 * (4 + p) * h + casts * a * h
        qk_norm = (4 + p) * (q + kv)
    if not shape.family.qk_norm:
        qk_norm = 0
    return norms + qk_norm + a * (2 * q + 2 * kv) + 4 * shape.heads + a * 4 * i


def _readout_bytes(shape: ModelShape, n: int, *, fused: bool, triton: bool, head_trainable: bool,
                   param_bytes: int, compute_bytes: int, device_type: str) -> int:
    """Bytes of the readout of ``n`` positions on top of the decoder (see the module text)."""
    from .kernels import chunked

    v, h, p, a = shape.vocab, shape.hidden, param_bytes, compute_bytes
    if not fused:  # full logits, their gradient, float32 chunks of the readout
        from .readout import _rows_per_chunk

        return 2 * n * v * a + 3 * min(n, _rows_per_chunk(v)) * v * 4 + (v * h * p if head_trainable else 0)
    total = 4 * n * 4 + n * h * (a + p)  # per-row readouts; the hidden gradient (and its cast)
    if a != p:
        total += v * h * a + n * h * a  # the weight and hidden cast once to the compute dtype
    if head_trainable:
        total += v * h * 4 + (v * h * p if p != 4 else 0)  # float32 accumulator (and its cast)
    if triton and device_type == "cuda":
        rows = max(1, chunked.TRITON_CHUNK_ELEMENTS // v)
        cap = max(rows, chunked.TRITON_LOSS_MAX_CHUNK_ELEMENTS // v)
        rows = min(max(rows, -(-n // chunked.LOSS_MAX_CHUNKS)), cap)
        per_logit = a
    else:
        rows = max(1, chunked.TORCH_CHUNK_ELEMENTS["cuda" if device_type == "cuda" else "cpu"] // v)
        per_logit = 16  # a float32 copy, a log-sum-exp temporary, the gradient and its cast
    chunks = 2 if device_type == "cuda" else 1  # the next chunk is computed on a side stream
    return total + chunks * min(rows, n) * v * per_logit


def gated_mask_bytes(rows: int, heads: int, positions: int, compute_bytes: int) -> int:
    """Bytes one layer of a gated pause model keeps for backward beyond a shared one: the
    additive mask ``[rows, heads, T, T]`` in the compute dtype and the bool ``[rows, 1, T, T]``
    of other tokens' pauses."""
    return rows * positions * positions * (heads * compute_bytes + 1)


def gated_kernel(cfg, shape: ModelShape, device_type: str, compute_bytes: int, positions: int) -> str:
    """``"flex"``, ``"split"`` or ``"dense"``: how a gated model's attention trains on rows of
    ``positions`` (:func:`cyb.model.attention.choose_kernel`'s ``auto``): the split attention on
    rows longer than :data:`~cyb.model.attention.GATED_FLEX_MAX_POSITIONS` on CUDA in bf16 with
    Recipe 1 blocks and full attention, FlexAttention elsewhere on CUDA, the dense mask off it."""
    from .model.attention import GATED_FLEX_MAX_POSITIONS

    if device_type != "cuda":
        return "dense"
    split = (compute_bytes == 2 and cfg.method.recipe != 2 and cfg.method.spec.layout != "inserted"
             and shape.head_dim <= 256 and not (shape.sliding_window and shape.sliding_layers))
    return "split" if split and positions > GATED_FLEX_MAX_POSITIONS else "flex"


def gated_flex_bytes(tokens: int, shape: ModelShape, compute_bytes: int) -> int:
    """What one gated layer through FlexAttention keeps for backward beyond a shared one: the
    kernel's own copy of the attention output, the output over earlier tokens' pauses alone and
    the float32 share of the attention they take, per query head (:func:`cyb.model.attention.gated_flex`)."""
    return tokens * (2 * shape.q_dim * compute_bytes + 4 * shape.heads)


def gated_split_bytes(tokens: int, shape: ModelShape, compute_bytes: int) -> tuple[int, int]:
    """``(kept, workspace)``: what one gated layer through the split attention keeps for backward
    beyond a shared one (the merged and the earlier pauses' attention outputs, and two float32
    log-sum-exps per query head: 1.16 GiB counted for the 134 M Llama at 4 x 8,192 positions,
    1.09 measured, docs/record/benchmarks/training.md), and what its backward holds at once (float32 gradients
    of queries, keys and values, and the step-head copies of the queries, outputs and their
    gradients)."""
    kept = tokens * (2 * shape.q_dim * compute_bytes + 8 * shape.heads)
    workspace = tokens * (shape.q_dim * (4 + 3 * compute_bytes) + 8 * shape.kv_dim)
    return kept, workspace


def estimate(cfg, shape: ModelShape, *, world_size: int = 1, device_type: str = "cuda",
             trainable: int | None = None, params: int | None = None,
             triton: bool | None = None, shard_size: int | None = None,
             real_tokens: int | None = None) -> MemoryEstimate:
    """The peak memory per process of training ``cfg`` on a model of ``shape``.

    Args:
        cfg: the run's :class:`~cyb.config.RunConfig` (its ``lora`` section, when the
            configuration has one, with ``rank > 0`` makes only the adapters and the new
            pause/dk rows trainable).
        shape: the model's :class:`ModelShape` (``vocab`` including the pause and dk rows).
        world_size: processes; FSDP (``train.distributed: fsdp``) divides the weights,
            gradients and AdamW state by it.
        shard_size: the processes one copy of the weights is sharded over, where that is not
            ``world_size`` (``train.distributed: hsdp``: the processes of one node).
        device_type: ``"cuda"`` (bf16 autocast under ``train.precision: auto``, the fused
            readout under ``train.loss_impl: auto``) or ``"cpu"``.
        trainable, params: exact counts from a built model (``requires_grad``), replacing the
            analytic ones.
        triton: whether the fused readout runs its triton kernels (default: on CUDA when triton
            is installed).
        real_tokens: real tokens per training row where the data say (a task's rows are as long
            as its longest example); default ``data.block_len`` (packed text, and the most a
            task's row is counted at before its data are built).

    Returns:
        a :class:`MemoryEstimate` (bytes).
    """
    t, m = cfg.train, cfg.model
    notes: list[str] = []
    p = _dtype_bytes(m.dtype)
    bf16 = t.precision == "bf16" or (t.precision == "auto" and device_type == "cuda")
    a = 2 if (bf16 or p == 2) else 4
    shards = world_size if shard_size is None else shard_size
    sharded = t.distributed in ("fsdp", "hsdp") and shards > 1
    per_rank = max(t.batch_size // max(world_size, 1), 1)
    micro = t.micro_batch_size or per_rank
    accum = max(per_rank // micro, 1)
    n_pos = positions_per_row(cfg, real_tokens)
    tokens = micro * n_pos

    rank, targets = _lora_settings(cfg)
    total = params if params is not None else shape.params()
    if trainable is None:
        new_rows = cfg.method.spec.model_steps(cfg.method.num_steps) if cfg.method.uses_pauses else 0
        trainable = lora_trainable(shape, rank, targets, new_rows) if rank > 0 else total
    adapters_fp32 = rank > 0  # LoRA adapters are kept in float32
    grad_bytes = 4 if adapters_fp32 else p
    # with LoRA the pause/dk rows stay trainable, so the readout may still need its float32
    # output-weight gradient (counted: the safe side)
    head_trainable = rank == 0 or cfg.method.uses_pauses

    shard = shards if sharded else 1
    weights = -(-total * p // shard)
    gradients = -(-trainable * grad_bytes // shard)
    optimizer = -(-2 * trainable * grad_bytes // shard)
    if world_size > 1 and not sharded:
        gradients *= 2  # DDP's gradient buckets hold a second copy
    linear_params = shape.layers * sum(i * o for i, o in shape.linears().values())
    autocast_copies = 0
    fsdp_buffers = 0
    if sharded:
        gathered = 2 if bf16 else p
        root = shape.embedding_params() + shape.hidden  # kept gathered through the step
        fsdp_buffers = (root + 2 * shape.layer_params()) * gathered + 2 * shape.layer_params() * 4
        notes.append("FSDP: the model is built whole on every GPU before it is sharded, so "
                     f"{total * p / GIB:.1f} GiB must fit once at start-up")
    elif bf16 and p == 4:
        autocast_copies = linear_params * 2

    per_token_layer = activation_bytes_per_token(shape, p, a)
    layer_act = tokens * per_token_layer
    if m.gradient_checkpointing:
        activations = shape.layers * tokens * shape.hidden * p + layer_act
    else:
        activations = shape.layers * layer_act
    if shape.sliding_window and n_pos > shape.sliding_window and shape.sliding_layers:
        # sliding-window layers need a [B, 1, T, T] mask (boolean, and its additive form for
        # SDPA), and SDPA with a mask gets keys and values repeated for every query head
        activations += micro * n_pos * n_pos * (1 + a)
        repeated = 1 if m.gradient_checkpointing else shape.sliding_layers
        activations += repeated * tokens * a * 2 * (shape.q_dim - shape.kv_dim)
        notes.append(f"{shape.sliding_layers} sliding-window layers (window {shape.sliding_window} < "
                     f"{n_pos} positions): a {n_pos} x {n_pos} mask per row")
    gated_mask = 0
    kept_layers = 1 if m.gradient_checkpointing else shape.layers
    if cfg.method.uses_pauses and cfg.method.pause_visibility == "private" and device_type == "cuda":
        # FlexAttention over the real-first order keeps each layer's attention output once more
        # (0.56 GiB counted for the 134 M Llama at 4 x 8,192 positions, 0.61 measured)
        activations += kept_layers * tokens * shape.q_dim * a
        notes.append("private pauses: FlexAttention keeps each layer's attention output once more")
    if cfg.method.uses_pauses and cfg.method.pause_visibility == "gated":
        kernel = gated_kernel(cfg, shape, device_type, a, n_pos)
        if kernel == "split":
            kept, gated_mask = gated_split_bytes(tokens, shape, a)
            activations += kept_layers * kept
            notes.append("gated pauses: the split attention (causal FlashAttention calls, no T x T mask), "
                         f"{kept / GIB:.2f} GiB kept per layer")
        elif kernel == "flex":
            kept = gated_flex_bytes(tokens, shape, a)
            activations += kept_layers * kept
            notes.append("gated pauses: FlexAttention with the gate in its scores (no T x T mask), "
                         f"{kept / GIB:.2f} GiB kept per layer")
        else:
            # every layer builds its [B, heads, T, T] additive mask (the gates in it) and keeps
            # it, with the bool mask of other tokens' pauses, for backward; backward makes its
            # gradient
            gated_mask = gated_mask_bytes(micro, shape.heads, n_pos, a)
            activations += kept_layers * gated_mask
            notes.append(f"gated pauses: a [{micro}, {shape.heads}, {n_pos}, {n_pos}] additive mask per layer "
                         f"({gated_mask / GIB:.2f} GiB each)")
    # outside the blocks: the final norm, the rotary tables (residual dtype) and the token ids
    final_norm = 8 if shape.family.float32_norms else 4 + p
    activations += tokens * (final_norm * shape.hidden + 2 * shape.head_dim * p + 12)
    workspace = tokens * (2 * shape.intermediate * a + 2 * shape.q_dim * a + 2 * shape.hidden * 4) + gated_mask

    if triton is None:
        from .kernels import triton_available

        triton = device_type == "cuda" and triton_available()
    # (Recipe 1 blocks and no-pause rows go through the fused loss, Recipe 2 and inserted pauses
    # through the chunked fused readout: both hold chunks of logits, counted alike)
    fused = t.loss_impl == "fused" or (t.loss_impl == "auto" and device_type == "cuda")
    readout = _readout_bytes(shape, tokens, fused=fused, triton=triton, head_trainable=head_trainable,
                             param_bytes=p, compute_bytes=a, device_type=device_type)
    if rank > 0:
        notes.append("LoRA: activations counted as for full fine-tuning (an upper bound: frozen "
                     "linears need not keep their inputs)")
    return MemoryEstimate(
        weights=weights, autocast_copies=autocast_copies, fsdp_buffers=fsdp_buffers,
        gradients=gradients, optimizer=optimizer, activations=activations, readout=readout,
        workspace=workspace, params=total, trainable=trainable, positions=n_pos, micro_batch=micro,
        accumulation=accum, world_size=world_size, sharded=sharded,
        checkpointing=m.gradient_checkpointing, param_bytes=p, compute_bytes=a, fused_readout=fused,
        lora_rank=rank, activation_bytes_per_token_layer=per_token_layer, notes=notes)


def run_shape(cfg, vocab: int | None = None) -> ModelShape | None:
    """The model shape of a run: from ``model.*`` for a model built from scratch (``vocab``:
    the tokenizer's size), else from the pretrained model's local ``config.json`` (None when it
    cannot be read without the network)."""
    from .build import hf_config_for

    new_rows = cfg.method.spec.model_steps(cfg.method.num_steps) if cfg.method.uses_pauses else 0
    if not cfg.model.name_or_path:
        if vocab is None:
            raise ValueError("vocab is needed for a model built from scratch")
        return ModelShape.from_hf_config(hf_config_for(cfg, vocab + new_rows))
    try:
        from transformers import AutoConfig

        from .model.sources import resolve_model_source

        config = AutoConfig.from_pretrained(resolve_model_source(cfg.model.name_or_path, fetch=False),
                                            local_files_only=True)
    except Exception:  # noqa: BLE001 (no local config: the check is skipped)
        return None
    return ModelShape.from_hf_config(config)


def suggestions(est: MemoryEstimate, cfg) -> list[str]:
    """Ways to make ``est`` smaller, the largest savings first (configuration overrides)."""
    out = []
    if not est.checkpointing and est.activations > est.gradients // 4:
        out.append("--set model.gradient_checkpointing=true (activations: keep one block's input "
                   "per block and recompute)")
    if est.micro_batch > 1:
        out.append(f"--set train.micro_batch_size={max(est.micro_batch // 2, 1)} (activations scale "
                   "with the micro-batch; the batch stays the same through accumulation)")
    if est.lora_rank == 0 and hasattr(cfg, "lora"):
        out.append("--set lora.rank=16 (LoRA: gradients and AdamW state of the adapters only)")
    if est.param_bytes == 4:
        out.append("--set model.dtype=bfloat16 (2-byte weights, gradients and AdamW state)")
    if not est.sharded:
        out.append("torchrun --nproc_per_node=N ... --set train.distributed=fsdp (weights, gradients "
                   "and AdamW state divided over N GPUs)")
    if not est.fused_readout:
        out.append("--set train.loss_impl=fused (no full logits)")
    return out


def device_capacity(device) -> int | None:
    """Free memory of a CUDA ``device`` in bytes (None for other devices: no check)."""
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


def check_fits(est: MemoryEstimate, capacity: int, cfg) -> None:
    """Raise :class:`MemoryPlanError` (estimate, breakdown, suggestions) when ``est.peak``
    exceeds ``capacity`` bytes."""
    if est.peak <= capacity:
        return
    tips = "\n".join(f"  - {s}" for s in suggestions(est, cfg))
    raise MemoryPlanError(
        f"this run needs about {est.peak / GIB:.1f} GiB per GPU but the GPU has "
        f"{capacity / GIB:.1f} GiB free; not starting.\n{est.describe()}\n"
        + (f"to fit, try:\n{tips}\n" if tips else "")
        + "to start anyway (the estimate may be off): --set train.memory_check=false")


__all__ = ["GIB", "MemoryEstimate", "MemoryPlanError", "ModelShape",
           "activation_bytes_per_token", "check_fits", "device_capacity", "estimate", "gated_flex_bytes",
           "gated_kernel", "gated_mask_bytes", "lora_trainable", "positions_per_row", "run_shape", "suggestions"]
