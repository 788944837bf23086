"""Attention of private and gated pause layouts (:mod:`cyb.visibility`), and which kernel runs it
(:func:`choose_kernel`).

Three ways to run the same mask:

* **Dense** (:func:`dense_masks`, the reference; what the CPU uses): a ``[B, 1, T, T]`` mask in
  the layout's own order, bool for sdpa and additive for eager attention, passed to the decoder
  as a ready 4-D mask.
* **Block-sparse** (:func:`flex_masks`, CUDA): the row is reordered real tokens first
  (:func:`cyb.visibility.real_first_order`) and run through FlexAttention with a ``BlockMask``,
  which skips every tile that no query attends to.  Under private pauses a row of ``L`` real
  tokens and ``M`` steps then costs about ``M L^2 / 2`` attention products, against
  ``(M L)^2 / 2`` for the paper's shared layout.  Gated pauses keep the layout's order and the
  causal mask, the gate added to the scores (:func:`gated_flex`); what they run on CUDA on rows
  of up to :data:`GATED_FLEX_MAX_POSITIONS`.
* **Split** (:func:`cyb.kernels.split_attention.split_attention`, Recipe 1 layouts): causal
  FlashAttention calls over the real keys (and, gated, the earlier pauses) merged with the own
  block's pauses by log-sum-exp; no mask at all.  What longer gated rows run on CUDA in bf16/fp16.

The decoder must route a ``BlockMask`` to FlexAttention, a split layout (the ``pause_split``
argument) to the split attention and any other mask to its usual kernel:
:func:`use_pause_attention` gives a model whose attention is sdpa the registered attention
implementation :data:`PAUSE_ATTENTION` that does exactly that (through ``transformers``'
``AttentionInterface``, the library's extension point; nothing is patched).  The switch is
permanent for the model object, so that activation checkpointing, which recomputes layers in
backward, sees the same kernel choice.

Models with sliding-window layers get one mask per layer type (a dict keyed
``"full_attention"`` / ``"sliding_attention"``, as the Gemma 2/3 and Qwen 2/3 decoders accept);
the window is measured in positions, so under private pauses it spans as many real tokens as
the base model's.  A model whose every layer slides (Mistral with a window) gets the sliding
mask alone.
"""

from __future__ import annotations

import functools

import torch

from .. import visibility as vis
from . import gates, hf

PAUSE_ATTENTION = hf.PAUSE_ATTENTION
#: FlexAttention's forward tiles on CUDA: 64 x 64 ran the private mask's forward and backward
#: faster than the defaults on an H200 (benchmarks/flex_variants.py)
FORWARD_TILES = {"BLOCK_M": 64, "BLOCK_N": 64}
#: and its backward tiles at head sizes up to :data:`BACKWARD_TILES_MAX_HEAD_DIM`: 13% off one
#: layer's private attention at 4 x 2048 on an H200 (docs/record/benchmarks/training.md, ``flex-options/``)
BACKWARD_TILES = {"bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 32,
                  "bwd_num_warps": 4, "bwd_num_stages": 3}
BACKWARD_TILES_MAX_HEAD_DIM = 64


def kernel_options(device: torch.device, head_dim: int) -> dict | None:
    """FlexAttention's ``kernel_options`` for a call on ``device`` with heads of ``head_dim``
    (``None`` off CUDA: the kernel's own choice)."""
    if device.type != "cuda":
        return None
    if head_dim <= BACKWARD_TILES_MAX_HEAD_DIM:
        return {**FORWARD_TILES, **BACKWARD_TILES}
    return dict(FORWARD_TILES)


@functools.lru_cache(maxsize=None)
def _registered() -> bool:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(PAUSE_ATTENTION, _pause_attention)
    AttentionMaskInterface.register(PAUSE_ATTENTION, sdpa_mask)
    return True


def flex_available() -> bool:
    """Whether this torch has FlexAttention."""
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def _block_mask_type():
    try:
        from torch.nn.attention.flex_attention import BlockMask
    except ImportError:
        return None
    return BlockMask


@functools.lru_cache(maxsize=None)
def _flex_kernel(compiled: bool):
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False) if compiled else flex_attention


def _pause_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                     scaling: float | None = None, **kwargs):
    """sdpa, except that a ``BlockMask`` runs FlexAttention (same contract as the
    ``transformers`` attention functions: ``(output [B, T, heads, dim], None)``).

    ``pause_blocks=(token, step)`` (``[B', T]`` each, in the order of the queries and keys)
    marks a gated layout: the module's gate (:mod:`cyb.model.gates`) is added to the logits of
    keys that are pauses of earlier tokens.  ``pause_foreign`` (bool ``[B, 1, T, K]``) says
    which keys those are directly, for queries against a cache (:mod:`cyb.engine`).
    ``pause_rows=(last, foreign, query_pos, key_pos, block_table)`` runs a decoding step's attention
    over each row's own columns
    (:func:`cyb.kernels.row_attention.row_attention`; the mask is not read), and
    ``pause_varlen=(last, query_start, foreign, foreign_below, query_pos, key_pos, block_table,
    max_queries)`` a
    mixed step's, the rows' queries flattened into one sequence
    (:func:`cyb.kernels.row_attention.row_attention_varlen`).  ``pause_causal``
    runs causal self-attention over the keys given (sdpa's causal kernels; the mask is not read:
    a prefill chunk that starts a row)."""
    if kwargs.pop("pause_causal", False):  # a fresh prefill chunk: causal over itself, the mask unread
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs)
    rows = kwargs.pop("pause_rows", None)
    if rows is not None:
        return _row_attention(module, query, key, value, rows, scaling, kwargs), None
    varlen = kwargs.pop("pause_varlen", None)
    if varlen is not None:
        return _row_attention_varlen(module, query, key, value, varlen, scaling, kwargs), None
    blocks = kwargs.pop("pause_blocks", None)
    foreign = kwargs.pop("pause_foreign", None)
    split = kwargs.pop("pause_split", None)
    if split is not None:
        return _split_attention(module, query, key, value, split, dropout, scaling, kwargs), None
    block_mask_type = _block_mask_type()
    if block_mask_type is None or not isinstance(attention_mask, block_mask_type):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        if blocks is not None or foreign is not None:
            if foreign is None:
                foreign = vis.foreign_pauses(*blocks).unsqueeze(1)
            attention_mask = gates.gated_attention_bias(module, attention_mask, foreign).to(query.dtype)
            gates.record_foreign_attention(module, query, key, attention_mask, foreign, scaling)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if dropout and module.training:
        raise ValueError("private pauses on CUDA run FlexAttention, which has no attention dropout: "
                         "set the model's attention_dropout to 0")
    if kwargs.get("softcap") is not None:
        raise ValueError("attention logit softcapping is not supported with FlexAttention here")
    heads, kv_heads = query.shape[1], key.shape[1]
    gqa = heads != kv_heads
    if gqa and heads & (heads - 1):  # the kernel wants a power-of-two group layout
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
        gqa = False
    if torch.compiler.is_compiling():  # a compiled model fuses the plain kernel (no cached wrapper)
        from torch.nn.attention.flex_attention import flex_attention as kernel
    else:
        kernel = _flex_kernel(query.device.type == "cuda")
    # (the layers hand over [B, heads, T, dim] views of [B, T, heads, dim]; the kernel reads
    # contiguous heads much faster)
    options = kernel_options(query.device, query.shape[-1])

    def flex(score_mod=None, return_lse=False):
        return kernel(query, key, value, score_mod=score_mod, block_mask=attention_mask, scale=scaling,
                      enable_gqa=gqa, return_lse=return_lse, kernel_options=options)

    query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
    out = flex() if blocks is None else gated_flex(flex, gates.required_gate(module), *blocks)
    return out.transpose(1, 2).contiguous(), None


def _split_attention(module, query, key, value, split: tuple, dropout: float, scaling, kwargs):
    """A Recipe 1 layout's attention as causal calls (:mod:`cyb.kernels.split_attention`);
    ``split = (M, gated)``."""
    from ..kernels.split_attention import split_attention

    if dropout and module.training:
        raise ValueError("the split pause attention has no attention dropout: set the model's "
                         "attention_dropout to 0")
    if kwargs.get("softcap") is not None or kwargs.get("sliding_window") is not None:
        raise ValueError("the split pause attention has no logit softcap or sliding window")
    num_steps, gated = split
    gate = gates.required_gate(module) if gated else None
    return split_attention(query, key, value, num_steps, scale=scaling, gate=gate)


def _row_attention(module, query, key, value, rows: tuple, scaling, kwargs):
    """A decoding step's attention, each row over its own columns; ``rows = (last [n, Q],
    foreign [n, W] or None, query_pos, key_pos, block_table)``: gated pauses' columns that get
    the module's gate, the positions a sliding window counts in (None: it counts columns), and
    the rows' block tables ``[n, B]`` when ``key`` and ``value`` are pools of blocks (None: rows).
    The window is the layer's own (``sliding_window``; None: full attention)."""
    from ..kernels.row_attention import row_attention

    last, foreign, query_pos, key_pos, table = rows
    key, value, common = _row_arguments(module, key, value, foreign, query_pos, key_pos, table, scaling, kwargs)
    return row_attention(query, key, value, last, **common)


def _row_attention_varlen(module, query, key, value, rows: tuple, scaling, kwargs):
    """A mixed step's attention (decoding rows and prompt chunks in one forward): ``query
    [1, heads, T, D]`` holds every row's queries in turn; ``rows = (last [T], query_start [n + 1],
    foreign, foreign_below [T] or None, query_pos [T], key_pos, block_table, max_queries)``: gated
    pauses' columns get the gate only below each query's ``foreign_below`` (its own token's first
    column), the rest as :func:`_row_attention` for ``n`` rows.  Returns ``[1, T, heads, D]``."""
    from ..kernels.row_attention import row_attention_varlen

    last, starts, foreign, below, query_pos, key_pos, table, most = rows
    key, value, common = _row_arguments(module, key, value, foreign, query_pos, key_pos, table, scaling, kwargs)
    out = row_attention_varlen(query[0].transpose(0, 1), key, value, last, starts, max_queries=most,
                               foreign_below=below, **common)
    return out.unsqueeze(0)


def _row_arguments(module, key, value, foreign, query_pos, key_pos, table, scaling, kwargs):
    """``(key, value, keyword arguments)`` of a row attention call: the layer's window and gate,
    and the pools read through the block tables, or the rows gathered from them."""
    if kwargs.get("softcap") is not None:
        raise ValueError("the engine's row attention has no logit softcap")
    window = kwargs.get("sliding_window")
    gate = gates.required_gate(module) if foreign is not None else None
    if window is None:
        query_pos = key_pos = None
    paged = {}
    if table is not None:
        if _reads_block_tables(key.shape[2]):
            paged["block_table"] = table
        else:  # the rows' columns gathered from the pools
            key, value = paged_rows(key, table), paged_rows(value, table)
    return key, value, dict(scale=scaling, foreign=foreign, gate=gate, window=None if window is None else int(window),
                            query_pos=query_pos, key_pos=key_pos, **paged)


#: block sizes the row attention kernel reads through block tables (powers of two)
PAGED_KERNEL_BLOCKS = (16, 256)


@functools.lru_cache(maxsize=None)
def _kernel_takes_tables() -> bool:
    import inspect

    from ..kernels.row_attention import row_attention

    return "block_table" in inspect.signature(row_attention).parameters


def _reads_block_tables(block_size: int) -> bool:
    """Whether the row attention kernel reads pools of ``block_size`` columns through block
    tables itself (else the engine's rows are gathered for it)."""
    low, high = PAGED_KERNEL_BLOCKS
    return low <= block_size <= high and _kernel_takes_tables()


def paged_rows(pool: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The rows of a pool of blocks ``[blocks, kv_heads, block_size, dim]`` that ``table [n, B]``
    names, as rows of columns ``[n, kv_heads, B x block_size, dim]`` (a copy): column ``c`` of
    row ``i`` is ``pool[table[i, c // block_size], :, c % block_size]``."""
    n, b = table.shape
    _, kv_heads, size, dim = pool.shape
    return pool[table].permute(0, 2, 1, 3, 4).reshape(n, kv_heads, b * size, dim)


#: how a private or gated layout's attention runs (:func:`choose_kernel`)
PAUSE_KERNELS = ("auto", "dense", "flex", "split")

#: the longest row (positions) on which ``"auto"`` runs gated pauses through FlexAttention
#: rather than the split attention: a 134 M Llama's training step on an H200 took 0.71, 0.78 and
#: 0.89x the split's at 1,024, 2,048 and 4,096 positions, and 1.04x at 8,192 (docs/record/benchmarks/training.md)
GATED_FLEX_MAX_POSITIONS = 4096


def choose_kernel(requested: str, visibility: str, steps: vis.BlockSteps, hf_model, *,
                  half: bool, training: bool) -> str:
    """``"dense"``, ``"flex"`` or ``"split"`` for a private or gated layout.

    ``"auto"`` on CUDA: block-sparse FlexAttention for private pauses (it trained faster than
    the split attention at 256 and 512 real tokens per row, docs/record/benchmarks/training.md); for gated
    pauses FlexAttention with the gate in its scores (:func:`gated_flex`) on rows of up to
    :data:`GATED_FLEX_MAX_POSITIONS`, the split attention (causal FlashAttention calls,
    :mod:`cyb.kernels.split_attention`) on longer rows where it runs (Recipe 1 layouts in
    bf16/fp16, ``half``), else FlexAttention again; the dense mask while
    :func:`cyb.model.gates.foreign_attention` records, and everywhere off CUDA.  ``training``
    with attention dropout rules out the split and flex kernels.
    """
    if requested not in PAUSE_KERNELS:
        raise ValueError(f"pause_kernel must be one of {PAUSE_KERNELS}, got {requested!r}")
    ours = hf.attention_of(hf_model) == PAUSE_ATTENTION
    if requested in ("flex", "split") and not ours:
        raise ValueError(f"pause_kernel={requested!r} needs sdpa attention and a torch with FlexAttention")
    if requested == "split":
        why = split_supported(steps, hf_model.config)
        if why is not None:
            raise ValueError(f"pause_kernel='split' cannot run this layout: {why}")
    if requested != "auto":
        return requested
    dropout = training and bool(getattr(hf.text_config(hf_model.config), "attention_dropout", 0.0))
    if steps.valid.device.type != "cuda" or not ours or dropout:
        return "dense"
    if visibility != "gated":
        return "flex"
    if gates.recording():
        return "dense"
    longer = steps.valid.shape[1] > GATED_FLEX_MAX_POSITIONS
    if longer and half and split_supported(steps, hf_model.config) is None:
        return "split"
    return "flex"


def split_supported(steps: vis.BlockSteps, config) -> str | None:
    """Why a layout cannot run the split attention (:mod:`cyb.kernels.split_attention`), or None:
    it needs Recipe 1's layout (blocks of ``M`` steps), full attention in every layer, no
    attention logit softcap, and padding only at the start or the end of each row."""
    if steps.layout_key is None or steps.layout_key[0] != "recipe1":
        return "the layout is not Recipe 1's blocks of M steps"
    if any(w is not None for w in layer_windows(config).values()):
        return "the model has sliding-window layers"
    if getattr(hf.text_config(config), "attn_logit_softcapping", None) is not None:
        return "the model softcaps its attention logits"
    lead = hf.leading_padding(steps.valid)
    rolled = hf.roll_rows(steps.valid, lead)
    prefix = torch.arange(rolled.shape[1], device=rolled.device) < rolled.sum(1, keepdim=True)
    if not bool((rolled == prefix).all()):
        return "a row has padding between its tokens"
    return None


#: the shift on keys outside the earlier tokens' pauses in the gate's second forward: their
#: weight there is exp(-1e6) = 0, and a query with no such key gets a share of 0
_ELSEWHERE = -1.0e6


def _gate_score_mod(gate: torch.Tensor, token: torch.Tensor, step: torch.Tensor, elsewhere: float = 0.0):
    """FlexAttention's ``score_mod`` of a gated layer: ``gate [heads]`` added to the scores of
    keys that are pauses of earlier tokens (``token``, ``step``: ``[B', T]`` in the kernel's
    order), ``elsewhere`` to every other score."""
    def row(x, b):
        return x[b if x.shape[0] > 1 else 0]

    def mod(score, b, h, q, k):
        foreign = (row(token, b)[k] < row(token, b)[q]) & (row(step, b)[k] > 0)
        return score + torch.where(foreign, gate[h].to(score.dtype), torch.full_like(score, elsewhere))
    return mod


class _GateGradient(torch.autograd.Function):
    """The identity on ``out [B, heads, T, dim]``, whose backward also gives the gate's gradient:
    ``sum over rows and queries of share * (grad . (out_f - out))``, with ``out_f`` the attention
    over earlier tokens' pauses alone and ``share [B, heads, T]`` the part of the attention they
    take (the softmax's derivative by a bias on those keys)."""

    @staticmethod
    def forward(ctx, out, gate, out_f, share):
        ctx.save_for_backward(out, out_f, share)
        ctx.gate_dtype = gate.dtype
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        out, out_f, share = ctx.saved_tensors
        ct = share.dtype
        pull = (grad.to(ct) * (out_f.to(ct) - out.to(ct))).sum(-1)
        return grad, (share * pull).sum((0, 2)).to(ctx.gate_dtype), None, None


def gated_flex(flex, gate: torch.Tensor, token: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """Gated attention through FlexAttention (``flex(score_mod, return_lse)``, the layer's call):
    ``[B, heads, T, dim]``.  The kernel sees the gate detached, and the gate's gradient comes from
    a second forward over earlier tokens' pauses alone (:class:`_GateGradient`): the kernel's own
    gradient of a per-head bias adds every tile's share into a few values, which took 170x the
    whole call on an H200 (docs/record/benchmarks/training.md)."""
    fixed = gate.detach()
    if not (torch.is_grad_enabled() and gate.requires_grad):
        return flex(_gate_score_mod(fixed, token, step))
    out, lse = flex(_gate_score_mod(fixed, token, step), True)
    with torch.no_grad():
        out_f, lse_f = flex(_gate_score_mod(fixed, token, step, _ELSEWHERE), True)
        ct = torch.float64 if out.dtype == torch.float64 else torch.float32
        share = (lse_f.to(ct) - lse.to(ct)).exp()
    return _GateGradient.apply(out, gate, out_f, share)


def use_pause_attention(hf_model) -> bool:
    """Give a model with sdpa attention :data:`PAUSE_ATTENTION` (returns whether it has it now).
    Models with eager attention keep it (they take dense masks)."""
    impl = hf.attention_of(hf_model)
    if impl == PAUSE_ATTENTION:
        return True
    if impl != "sdpa" or not flex_available():
        return False
    _registered()
    setter = getattr(hf_model, "set_attn_implementation", None)
    if callable(setter):
        setter(PAUSE_ATTENTION)
    else:
        hf_model.config._attn_implementation = PAUSE_ATTENTION
    return hf.attention_of(hf_model) == PAUSE_ATTENTION


# ----------------------------------------------------------------------------- layer types


def layer_windows(config) -> dict[str, int | None]:
    """``{layer type: sliding window in positions, or None for full attention}`` of the
    model's layers.  Keys are ``"full_attention"`` and ``"sliding_attention"`` for models that
    name layer types, else the single key ``""`` (every layer alike)."""
    cfg = hf.text_config(config)
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if types is not None:
        out = {}
        for t in set(types):
            if "chunk" in str(t):
                raise ValueError(f"layer type {t!r} (chunked attention) is not supported with private pauses")
            out[str(t)] = int(window) if "sliding" in str(t) and window else None
        return out
    if window and getattr(cfg, "use_sliding_window", True):
        return {"": int(window)}
    return {"": None}


def _pack(masks: dict):
    return masks[""] if set(masks) == {""} else masks


# ----------------------------------------------------------------------------- dense


def dense_masks(steps: vis.BlockSteps, visibility: str, position_ids: torch.Tensor, config, *,
                additive_dtype: torch.dtype | None = None):
    """The pause mask as ready 4-D masks ``[B, 1, T, T]`` in the layout's order: one tensor, or
    a dict per layer type (:func:`layer_windows`).  Bool, or additive in ``additive_dtype``."""
    b, t = steps.valid.shape
    pos = position_ids.expand(b, t)
    return per_layer_masks(vis.visible(steps, visibility), pos, pos, config, additive_dtype=additive_dtype)


def per_layer_masks(allowed: torch.Tensor, query_pos: torch.Tensor, key_pos: torch.Tensor, config, *,
                    additive_dtype: torch.dtype | None = None):
    """``allowed [B, T, K]`` as the decoder's ready 4-D masks ``[B, 1, T, K]``: one tensor, or a
    dict per layer type whose sliding windows (in positions: ``query_pos [B, T]``, ``key_pos
    [B, K]``) cut it further.  Bool, or additive in ``additive_dtype``."""
    out = {}
    for kind, window in layer_windows(config).items():
        m = allowed
        if window is not None:
            m = m & ((query_pos.unsqueeze(2) - key_pos.unsqueeze(1)) < window)
        m = m.unsqueeze(1)
        if additive_dtype is not None:
            zero = torch.zeros((), dtype=additive_dtype, device=m.device)
            m = torch.where(m, zero, torch.finfo(additive_dtype).min)
        out[kind] = m
    return _pack(out)


# ----------------------------------------------------------------------------- block-sparse


#: block masks and orders of shared layouts without padding, by layout, visibility, windows
#: and device: a training run builds its mask once
_SHARED_MASKS: dict = {}


def flex_layout(steps: vis.BlockSteps, visibility: str, position_ids: torch.Tensor, config):
    """``(order, masks)``: the real-first order (:func:`cyb.visibility.real_first_order`) and
    the pause mask over it as FlexAttention ``BlockMask``\\ s (one, or a dict per layer type).

    One mask serves the whole batch when the layout is shared and nothing is padded; it is then
    built once per layout (:attr:`cyb.visibility.BlockSteps.layout_key`) and reused.
    """
    per_row = not steps.shared_layout or not bool(steps.valid.all())
    key = None
    windows = layer_windows(config)
    if not per_row and steps.layout_key is not None and all(w is None for w in windows.values()):
        # (windows are measured in positions, which the layout key does not fix)
        key = (steps.layout_key, visibility, tuple(sorted(windows)), str(steps.valid.device))
        if key in _SHARED_MASKS:
            return _SHARED_MASKS[key]
    order = vis.real_first_order(steps, visibility)
    made = order, flex_masks(steps, visibility, position_ids, config, order)
    if key is not None:
        if len(_SHARED_MASKS) > 16:
            _SHARED_MASKS.clear()
        _SHARED_MASKS[key] = made
    return made


def _windowed(base, pos: torch.Tensor, window: torch.Tensor, row):
    """``base`` limited to keys less than ``window`` positions back.  The window is a tensor, not
    a Python number: compiled kernels then read it as an input, and a model with another window
    in the same process cannot reuse a kernel built for this one."""
    def mod(bi, hi, q, k):
        return base(bi, hi, q, k) & ((row(pos, bi)[q] - row(pos, bi)[k]) < window)
    return mod


def flex_masks(steps: vis.BlockSteps, visibility: str, position_ids: torch.Tensor, config,
               order: torch.Tensor, *, compile_mask: bool | None = None):
    """The pause mask as FlexAttention ``BlockMask``\\ s over the row reordered by ``order``
    (``[B', T]``, :func:`cyb.visibility.real_first_order`): one, or a dict per layer type.

    One mask serves the whole batch when the layout is shared and nothing is padded.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    b, t = steps.valid.shape
    device = steps.valid.device
    tok = vis.reorder(steps.token, order)
    stp = vis.reorder(steps.step, order)
    exp = vis.reorder(steps.exported(visibility), order)
    per_row = not steps.shared_layout or not bool(steps.valid.all())
    valid = vis.reorder(steps.valid, order.expand(b, t)) if per_row else None
    pos = vis.reorder(position_ids.expand(b, t), order.expand(b, t))
    if not per_row:
        pos = pos[:1]
    if compile_mask is None:
        compile_mask = device.type == "cuda"

    def row(x, bi):
        return x[bi if x.shape[0] > 1 else 0]

    def base(bi, hi, q, k):
        tq, tk = row(tok, bi)[q], row(tok, bi)[k]
        same = (tq == tk) & (row(stp, bi)[k] <= row(stp, bi)[q])
        ok = same | ((tk < tq) & row(exp, bi)[k])
        if valid is not None:
            ok = ok & valid[bi][k]
        return ok | (q == k)

    out = {}
    for kind, window in layer_windows(config).items():
        mod = base if window is None else _windowed(base, pos, torch.tensor(window, device=device), row)
        out[kind] = create_block_mask(mod, B=b if per_row else None, H=None, Q_LEN=t, KV_LEN=t,
                                      device=device, _compile=compile_mask)
    return _pack(out)


__all__ = ["GATED_FLEX_MAX_POSITIONS", "PAUSE_ATTENTION", "PAUSE_KERNELS", "choose_kernel", "dense_masks", "flex_available", "flex_layout",
           "flex_masks", "gated_flex", "layer_windows", "paged_rows", "per_layer_masks", "split_supported",
           "use_pause_attention"]
