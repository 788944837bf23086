"""Learned gates of the ``gated`` pause layout (:mod:`cyb.visibility`).

Each attention module of a gated model holds ``pause_gate``, a float32 parameter of one value
per query head: the bias added to the attention logit of a query to another (earlier) token's
pause.  It starts at ``init`` (default :data:`GATE_INIT`: ``exp(-8)`` of the weight the key
would otherwise get, so the gate is almost closed and a freshly wrapped pretrained model keeps
its quality) and trains with the model at its own learning rate (``method.pause_gate_lr``;
:func:`gate_parameters` lets the optimiser find them).  A bias of 0 is the paper's shared
layout, minus infinity the private one.

The gates live inside the Hugging Face modules (``model.layers.N.self_attn.pause_gate``), so
they are saved with the model's weights, sharded with their layer under FSDP and recomputed
with it under activation checkpointing; :func:`load_gates` puts saved values back, since a
plain Hugging Face load drops the keys its classes do not know.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from ..visibility import GATE_INIT
from . import hf

#: the attribute of each attention module that holds its gate
GATE_NAME = "pause_gate"


def attention_modules(hf_model) -> list[torch.nn.Module]:
    """The self-attention module of every decoder layer, in order."""
    decoder = hf.decoder_of(hf_model)
    num_layers = getattr(hf.text_config(hf_model.config), "num_hidden_layers", None)
    out = []
    for layer in hf.decoder_layers(decoder, num_layers):
        attn = getattr(layer, "self_attn", None)
        if attn is None:
            raise TypeError(f"{type(layer).__name__} has no self_attn: gated pauses support decoders whose "
                            "layers name their attention self_attn (Llama, Mistral, Qwen, Gemma)")
        out.append(attn)
    return out


def add_gates(hf_model, init: float = GATE_INIT) -> None:
    """Give every attention module a gate of ``init`` per query head (kept where present)."""
    heads = int(hf.text_config(hf_model.config).num_attention_heads)
    for attn in attention_modules(hf_model):
        if not hasattr(attn, GATE_NAME):
            device = next(attn.parameters()).device
            attn.register_parameter(GATE_NAME, torch.nn.Parameter(
                torch.full((heads,), float(init), dtype=torch.float32, device=device)))


def fill_gates(hf_model, value: float) -> None:
    """Set every gate of ``hf_model`` to ``value``."""
    with torch.no_grad():
        for attn in attention_modules(hf_model):
            gate_of(attn).fill_(float(value))


def annealed_bias(init: float, steps: int, step: int) -> float:
    """The bias of gates opened on a schedule, at optimiser step ``step`` (counted from 1):
    ``init`` rising linearly to 0 over ``steps`` steps, then 0."""
    return float(init) * max(0.0, 1.0 - step / steps)


def gate_of(module) -> torch.Tensor | None:
    """The gate bias ``[heads]`` of an attention module, or None."""
    return getattr(module, GATE_NAME, None)


def required_gate(module) -> torch.Tensor:
    """The gate bias ``[heads]`` of an attention module that a gated layout reached."""
    gate = gate_of(module)
    if gate is None:
        raise ValueError("a gated pause layout reached an attention module without a gate")
    return gate


def gate_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Every gate parameter of ``model`` (any wrapper around a gated Hugging Face model)."""
    return [p for n, p in model.named_parameters() if n.rsplit(".", 1)[-1] == GATE_NAME]


def gate_values(hf_model) -> torch.Tensor:
    """``[layers, heads]``: the gates' current biases (for reports)."""
    return torch.stack([gate_of(a).detach().float().cpu() for a in attention_modules(hf_model)])


def gate_summary(model: torch.nn.Module) -> dict:
    """``{"pause_gate_mean", "pause_gate_max"}`` over every gate of ``model`` (whole tensors
    under FSDP), or ``{}`` for a model without gates: what a training log records."""
    params = gate_parameters(model)
    if not params:
        return {}
    values = torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().float().flatten()
                        for p in params])
    return {"pause_gate_mean": float(values.mean()), "pause_gate_max": float(values.max())}


def load_gates(hf_model, folder) -> int:
    """Put the gates saved in ``folder``'s safetensors into ``hf_model`` (returns how many were
    found; 0 for a folder saved without gates, whose gates keep their starting value)."""
    from safetensors import safe_open

    folder = Path(folder)
    if not folder.is_dir():
        return 0
    params = dict(hf_model.named_parameters())
    found = 0
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                if key.rsplit(".", 1)[-1] != GATE_NAME:
                    continue
                target = params.get(key, params.get(key.split(".", 1)[-1]))
                if target is None:
                    continue
                with torch.no_grad():
                    target.copy_(st.get_tensor(key).to(target.dtype))
                found += 1
    return found


@contextmanager
def quiet_load(gated: bool):
    """Loading a gated model's Hugging Face weights: no report of the gate keys its classes do not
    know (:func:`load_gates` puts them in)."""
    if not gated:
        yield
        return
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)


def gated_attention_bias(module, mask: torch.Tensor, foreign: torch.Tensor) -> torch.Tensor:
    """The additive mask ``[B, heads, T, K]`` of a gated layer: 0 where ``mask`` (bool ``[B, 1,
    T, K]``) allows, minus infinity where it does not, plus the module's gate on ``foreign``
    (bool ``[B, 1, T, K]``, :func:`cyb.visibility.foreign_pauses`).  Differentiable in the gate."""
    gate = required_gate(module)
    zero = torch.zeros((), dtype=torch.float32, device=mask.device)
    base = torch.where(mask, zero, float("-inf"))
    return base + torch.where(foreign, gate.view(1, -1, 1, 1), zero)


class ForeignAttention:
    """What the gates let through, recorded while a gated model runs (:func:`foreign_attention`):
    per layer, the mean share of a query's attention that lands on other (earlier) tokens'
    pauses, over every query that has such a pause in view, and over the heads.  Large logits
    on those keys can outweigh a closed-looking gate, so this, not the bias, says how shared a
    gated model's pauses are in effect (0: private).  Padded positions count as queries too
    (they see earlier pauses like any other); a batch without padding is measured exactly."""

    def __init__(self, modules: list[torch.nn.Module]):
        self._layer = {id(m): i for i, m in enumerate(modules)}
        self._mass = [0.0] * len(modules)
        self._queries = [0] * len(modules)

    @torch.no_grad()
    def add(self, module, query: torch.Tensor, key: torch.Tensor, bias: torch.Tensor,
            foreign: torch.Tensor, scaling: float | None) -> None:
        """One layer's call: ``query`` ``[B, heads, T, dim]``, ``key`` ``[B, kv_heads, K, dim]``,
        ``bias`` the additive mask ``[B, heads, T, K]``, ``foreign`` bool ``[B, 1, T, K]``."""
        layer = self._layer.get(id(module))
        if layer is None:
            return
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        scores = (query.float() @ key.float().transpose(-1, -2)) * scale + bias.float()
        probs = torch.nan_to_num(scores.softmax(-1))  # a row with nothing in view gives 0
        mass = (probs * foreign).sum(-1)  # [B, heads, T]
        seen = foreign.any(-1).expand_as(mass)  # queries with another token's pause in view
        self._mass[layer] += float(mass[seen].sum())
        self._queries[layer] += int(seen.sum())

    def per_layer(self) -> list[float]:
        """The mean share per layer, in [0, 1] (0 for a layer that saw no such query)."""
        return [m / q if q else 0.0 for m, q in zip(self._mass, self._queries)]


_RECORDER: ForeignAttention | None = None


@contextmanager
def foreign_attention(hf_model):
    """Record, while the block runs, how much attention the gated layers of ``hf_model`` put on
    other tokens' pauses: yields a :class:`ForeignAttention` (the dense gated path records), or
    None for a model without gates."""
    global _RECORDER
    if not gate_parameters(hf_model):
        yield None
        return
    recorder = ForeignAttention(attention_modules(hf_model))
    _RECORDER = recorder
    try:
        yield recorder
    finally:
        _RECORDER = None


def recording() -> bool:
    """Whether :func:`foreign_attention` is recording (its numbers come from the dense path)."""
    return _RECORDER is not None


def record_foreign_attention(module, query, key, bias, foreign, scaling) -> None:
    """Hand one gated layer's call to the recorder of :func:`foreign_attention`, if any."""
    if _RECORDER is not None:
        _RECORDER.add(module, query, key, bias, foreign, scaling)


__all__ = ["GATE_INIT", "ForeignAttention", "foreign_attention", "record_foreign_attention", "recording", "GATE_NAME", "add_gates", "annealed_bias", "attention_modules", "fill_gates", "gate_of",
           "gate_parameters", "gate_summary", "gate_values", "gated_attention_bias", "load_gates", "quiet_load",
           "required_gate"]
