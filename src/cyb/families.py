"""The model families a run builds from scratch: one frozen :class:`Family` per family, the only
place that knows them.

A family is a Hugging Face decoder-only architecture with rotary positions: its name in
``model.arch``, the ``model_type`` transformers builds it with, how the ``model.*`` fields of a
from-scratch run map onto its transformers config, and the quirks of its blocks that the memory
estimate counts (:mod:`cyb.memory_estimate`; they hold for pretrained models of the same
``model_type`` too).  The configuration check of ``model.arch``, ``cyb train --help-config``,
:func:`cyb.build.hf_config_for` and the memory estimate ask this table; pretrained models of
any family load through ``model.name_or_path`` without it.

Adding a family: one :class:`Family` in :data:`FAMILIES`, and a tiny config of it in
``tests/test_model.py`` (``tiny_config``: masks, cache and saving are checked on every family);
``tests/test_families.py`` and ``tests/test_memory.py`` build a model of every family from the
table and hold its config and the estimate's parameter count against it.

Nothing here imports torch or transformers until a config is built, so reading a configuration
stays light.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The attention and MLP projections that every family here names alike: LoRA's default
#: targets and the linear layers the memory estimate counts.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Family:
    """What a model family is.

    Attributes:
        name: the value of ``model.arch``.
        model_type: the ``model_type`` a from-scratch model is built with
            (``transformers.AutoConfig.for_model``).
        aliases: other ``model_type`` values of the family's pretrained models (Gemma 3's
            multimodal ``gemma3`` holds a ``gemma3_text`` model).
        head_dim: its config takes ``head_dim``, set even when it is ``hidden_size /
            num_heads`` (other families get it only when ``model.head_dim`` is set).
        query_scale: ``query_pre_attn_scalar`` is set to the head width (Gemma 2/3 scale the
            queries by it).
        fixed: config fields every from-scratch model of the family sets to a fixed value
            (Mistral: no sliding window).
        norms_per_layer: norms per decoder block (Gemma 2/3 add two after attention and MLP).
        qk_norm: per-head norms on queries and keys (Gemma 3, Qwen 3).
        qkv_bias: biases on the q, k and v projections (Qwen 2).
        float32_norms: its norms compute ``(1 + w) * norm(x.float())`` in float32 (Gemma).
    """

    name: str
    model_type: str
    aliases: tuple[str, ...] = ()
    head_dim: bool = False
    query_scale: bool = False
    fixed: tuple[tuple[str, Any], ...] = ()
    norms_per_layer: int = 2
    qk_norm: bool = False
    qkv_bias: bool = False
    float32_norms: bool = False

    @property
    def model_types(self) -> tuple[str, ...]:
        """Every ``model_type`` of the family (its own first)."""
        return (self.model_type, *self.aliases)

    def config_fields(self, model, vocab_size: int) -> dict:
        """The transformers config fields of a from-scratch model: ``model`` is a run's ``model``
        section (any object with the :class:`~cyb.config.ModelConfig` fields)."""
        heads = model.num_heads
        head_dim = model.head_dim or model.hidden_size // heads
        kw = dict(vocab_size=vocab_size, hidden_size=model.hidden_size,
                  intermediate_size=model.intermediate_size or 4 * model.hidden_size,
                  num_hidden_layers=model.num_layers, num_attention_heads=heads,
                  num_key_value_heads=model.num_kv_heads or heads,
                  max_position_embeddings=model.max_position_embeddings,
                  tie_word_embeddings=model.tie_embeddings)
        if model.head_dim is not None or self.head_dim:
            kw["head_dim"] = head_dim
        if self.query_scale:
            kw["query_pre_attn_scalar"] = head_dim
        kw.update(self.fixed)
        return kw

    def hf_config(self, model, vocab_size: int, **extra):
        """A transformers config of a from-scratch model (:meth:`config_fields` plus ``extra``,
        e.g. the tokenizer's special ids)."""
        from transformers import AutoConfig

        return AutoConfig.for_model(self.model_type, **self.config_fields(model, vocab_size), **extra)


_GEMMA = dict(head_dim=True, float32_norms=True)
FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("llama", "llama"),
    Family("mistral", "mistral", fixed=(("sliding_window", None),)),
    Family("qwen2", "qwen2", qkv_bias=True),
    Family("qwen3", "qwen3", head_dim=True, qk_norm=True),
    Family("gemma", "gemma", **_GEMMA),
    Family("gemma2", "gemma2", query_scale=True, norms_per_layer=4, **_GEMMA),
    Family("gemma3", "gemma3_text", aliases=("gemma3",), query_scale=True, norms_per_layer=4, qk_norm=True,
           **_GEMMA),
)}

#: Family names in the order of ``--help-config``.
NAMES = tuple(FAMILIES)


def family(name: str) -> Family:
    """The :class:`Family` called ``name``; ValueError naming the known families otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(NAMES)}") from None


def of_model_type(model_type: str) -> Family | None:
    """The family whose models have ``model_type`` (a from-scratch or pretrained config's), or
    None for another architecture."""
    return next((f for f in FAMILIES.values() if model_type in f.model_types), None)


__all__ = ["FAMILIES", "Family", "NAMES", "PROJECTIONS", "family", "of_model_type"]
