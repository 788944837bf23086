"""What the pause model needs to know about a Hugging Face causal LM, in one place.

Attention masks.  ``transformers`` (5.x) infers packed documents from position ids that do not
step by +1, but only when the 2-D ``attention_mask`` is None and there is no cache (see
``masking_utils._preprocess_mask_arguments``).  Passing an explicit 2-D mask, all ones when
nothing is padded, therefore always gives the plain causal + padding mask, and keeps each
layer's own pattern (the sliding windows of Gemma 2/3, Mistral, Qwen) that a single
hand-built 4-D mask would override.  Flash-attention kernels are refused: with no padding they
get no mask and derive sequence starts from ``position_ids == 0``, which pauses repeat.

Fully masked rows.  A padding step with no valid key in its causal (or sliding) window has an
empty softmax; some SDPA kernels (cuDNN attention, which torch 2.11 picks for bf16 on H200)
then return NaN gradients that reach shared weights.  Without a cache, each row is therefore
rolled so that its leading padding comes last, and padding that then forms a suffix is
unmasked: a valid step never sees a later one, so valid outputs are exactly unchanged (the
positions are explicit, causal order and distances between valid steps are kept), while every
padding step gets keys.  Masks with holes between valid steps keep their holes.

Naming.  The decoder's cache argument is ``past_key_values`` up to transformers 5.1x and
``cache`` after; the name is read from the decoder's signature.
"""

from __future__ import annotations

import inspect

import torch

SUPPORTED_ATTENTION = ("sdpa", "eager")
#: the attention implementation :mod:`cyb.model.attention` gives models with private pauses
#: (sdpa, and FlexAttention for block-sparse masks)
PAUSE_ATTENTION = "cyb_sdpa"


def check_attention(impl: str | None) -> None:
    """Raise unless ``impl`` is None (the library default: sdpa, else eager) or supported."""
    if impl is None or impl in SUPPORTED_ATTENTION or impl == PAUSE_ATTENTION:
        return
    hint = ""
    if "flash" in str(impl):
        hint = (": flash-attention derives sequence starts from position_ids == 0 and pauses repeat "
                "position ids, so every pause would start a new sequence")
    raise ValueError(
        f"attn_implementation={impl!r} is not supported{hint}; use 'sdpa' or 'eager'"
    )


def attention_of(hf_model) -> str | None:
    """The attention implementation the model runs with (``config._attn_implementation``)."""
    return getattr(hf_model.config, "_attn_implementation", None)


def is_eager(hf_model) -> bool:
    """Whether the model runs eager attention (additive masks) rather than sdpa (bool masks)."""
    return attention_of(hf_model) == "eager"


def text_config(config):
    """The text part of a (possibly multimodal) config."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def has_sliding_window(config) -> bool:
    """Whether any attention layer of the model uses a sliding window (or chunked attention)."""
    cfg = text_config(config)
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is not None:
        return any("sliding" in str(t) or "chunk" in str(t) for t in layer_types)
    # (Qwen2 keeps a window size with use_sliding_window = False)
    return bool(getattr(cfg, "sliding_window", None)) and bool(getattr(cfg, "use_sliding_window", True))


def decoder_of(hf_model) -> torch.nn.Module:
    """The decoder under the LM head (the module that returns ``last_hidden_state``)."""
    dec = None
    get = getattr(hf_model, "get_decoder", None)
    if callable(get):
        dec = get()
    if dec is None or dec is hf_model:
        prefix = getattr(hf_model, "base_model_prefix", "model")
        dec = getattr(hf_model, prefix, None) or getattr(hf_model, "model", None)
    if not isinstance(dec, torch.nn.Module) or dec is hf_model:
        raise TypeError(f"cannot find the decoder of {type(hf_model).__name__} (get_decoder() / .model)")
    return dec


def _params(module: torch.nn.Module) -> dict:
    return dict(inspect.signature(module.forward).parameters)


def cache_arg_name(decoder: torch.nn.Module) -> str:
    """``"cache"`` (transformers >= 5.2x) or ``"past_key_values"`` (earlier)."""
    params = _params(decoder)
    if "cache" in params:
        return "cache"
    if "past_key_values" in params:
        return "past_key_values"
    raise TypeError(
        f"{type(decoder).__name__}.forward takes neither 'cache' nor 'past_key_values'; "
        "incremental decoding is not possible with this model"
    )


def check_position_ids(decoder: torch.nn.Module) -> None:
    """Raise if the decoder does not take explicit ``position_ids`` (e.g. ALiBi models)."""
    if "position_ids" not in _params(decoder):
        raise TypeError(
            f"{type(decoder).__name__}.forward has no position_ids argument: pauses need explicit "
            "positions, so only models with position ids (rotary: Llama, Mistral, Qwen, Gemma...) "
            "are supported"
        )


def cache_of(output) -> object | None:
    """The cache object of a decoder output, under either name."""
    for name in ("cache", "past_key_values"):
        value = getattr(output, name, None)
        if value is not None:
            return value
    return None


def leading_padding(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` padding steps before the first valid one (0 for a row that is all padding)."""
    valid = attention_mask.bool()
    lead = valid.int().argmax(dim=1)  # first maximum: the first valid step, or 0
    return torch.where(valid.any(dim=1), lead, torch.zeros_like(lead))


def unmask_padding_suffix(attention_mask: torch.Tensor) -> torch.Tensor:
    """The mask with rows of the form ``1..1 0..0`` (or all 0) made all ones; others kept."""
    m = attention_mask.bool()
    has_hole = (m[:, 1:] & ~m[:, :-1]).any(dim=1)  # a valid step after a padding step
    return torch.where(has_hole.unsqueeze(1), attention_mask, torch.ones_like(attention_mask))


def roll_rows(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``y[b, j] = x[b, (j + shift[b]) % T]`` for ``x [B, T, ...]`` (negative shifts undo it)."""
    b, t = x.shape[:2]
    idx = (torch.arange(t, device=x.device).unsqueeze(0) + shift.unsqueeze(1)) % t
    idx = idx.view(b, t, *([1] * (x.dim() - 2))).expand_as(x)
    return torch.gather(x, 1, idx)


def padding_last(input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor):
    """Lay ``[B, T]`` rows out so that no step has an empty softmax (module docstring).

    Returns ``(input_ids, position_ids, attention_mask, lead)`` to run, where ``lead [B]`` is
    the roll to undo on the outputs with ``roll_rows(out, -lead)``, or None when nothing moved.
    """
    lead = leading_padding(attention_mask)
    if bool(lead.any()):
        input_ids, position_ids, attention_mask = (
            roll_rows(x, lead) for x in (input_ids, position_ids, attention_mask))
    else:
        lead = None
    return input_ids, position_ids, unmask_padding_suffix(attention_mask), lead


def check_positions(position_ids: torch.Tensor, config) -> None:
    """Raise if a position id is negative or beyond ``max_position_embeddings``."""
    if position_ids.numel() == 0:
        return
    lo, hi = (int(v) for v in torch.aminmax(position_ids))
    limit = getattr(text_config(config), "max_position_embeddings", None)
    if lo < 0:
        raise ValueError(f"position ids must be >= 0, got {lo}")
    if isinstance(limit, int) and hi >= limit:
        raise ValueError(
            f"position id {hi} is beyond the model's max_position_embeddings = {limit}; "
            "shorten the sequence"
        )


def embedding_weights(hf_model) -> list[torch.Tensor]:
    """The input embedding's weight and, where it is a tensor of its own (untied), the output
    projection's: the tensors that hold a token's rows."""
    weights = []
    for layer in (hf_model.get_input_embeddings(), hf_model.get_output_embeddings()):
        w = getattr(layer, "weight", None)
        if w is not None and not any(w is x for x in weights):
            weights.append(w)
    return weights


def decoder_layers(decoder: torch.nn.Module, num_layers: int | None) -> list[torch.nn.Module]:
    """The transformer blocks of the decoder, in order (for FSDP wrapping / compilation)."""
    layers = getattr(decoder, "layers", None)
    if isinstance(layers, torch.nn.ModuleList):
        return list(layers)
    for child in decoder.children():
        if isinstance(child, torch.nn.ModuleList) and (num_layers is None or len(child) == num_layers):
            return list(child)
    raise TypeError(f"cannot find the decoder layers of {type(decoder).__name__}")


def final_logit_softcap(config) -> float | None:
    """``final_logit_softcapping`` (Gemma 2 / 3): logits become ``c * tanh(z / c)``."""
    cap = getattr(text_config(config), "final_logit_softcapping", None)
    return float(cap) if cap else None


def logit_scale(hf_model) -> float | None:
    """A constant factor on the logits besides the softcap, or None.

    Cohere multiplies the head's output by ``logit_scale``; Granite divides it by
    ``logits_scaling``.
    """
    cfg = text_config(hf_model.config)
    scale = getattr(hf_model, "logit_scale", None)
    if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale != 1:
        return float(scale)
    div = getattr(cfg, "logits_scaling", None)
    if isinstance(div, (int, float)) and not isinstance(div, bool) and div != 1:
        return 1.0 / float(div)
    return None


def apply_logit_transforms(logits: torch.Tensor, hf_model, softcap: float | None) -> torch.Tensor:
    """The head's post-processing, in the order and with the operations of the HF forward."""
    scale = getattr(hf_model, "logit_scale", None)
    if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale != 1:
        logits = logits * scale
    div = getattr(text_config(hf_model.config), "logits_scaling", None)
    if isinstance(div, (int, float)) and not isinstance(div, bool) and div != 1:
        logits = logits / div
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def dtype_kwargs(torch_dtype) -> dict:
    """``{"dtype": ...}`` (transformers >= 4.56) or ``{"torch_dtype": ...}``; ``{}`` for None."""
    if torch_dtype is None:
        return {}
    if isinstance(torch_dtype, str) and torch_dtype != "auto":
        resolved = getattr(torch, torch_dtype, None)
        if not isinstance(resolved, torch.dtype):
            raise ValueError(
                f"torch_dtype={torch_dtype!r} is not a torch dtype name (e.g. 'float32', "
                "'bfloat16', 'float16', or 'auto')"
            )
        torch_dtype = resolved
    import transformers
    from packaging.version import Version

    key = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    return {key: torch_dtype}
