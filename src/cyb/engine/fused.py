"""Fewer, larger kernels for the engine's graphed forwards: the model's small operations compiled.

At small batches a decoding step is bound by the number of kernels it launches, not by the
bytes it reads: a 134 M Llama launches about 85 matrix products and 300 elementwise, copy and
reduce kernels per step (RMSNorm alone is six per call).  :func:`fused_small_ops` compiles, with
``torch.compile``, the code of the model's own norm and MLP modules and of its rotary embedding
function, each into a few fused kernels, and runs them while the body of a decoding step or of
a prefill forward is captured into a CUDA graph (:mod:`cyb.engine.runner`), where their launches
are recorded once and replayed.
The maths is the modules' own code, traced, not a copy of it; only the graphs that are captured
inside the context use it, so the model's other forwards (training, ``generate()`` without the
engine) are untouched.

Measured on an H200 (134 M Llama, bf16, ``results/benchmarks/engine/fused/``): a token at batch 1
took 1.41 ms, 0.85 ms fused.
"""

from __future__ import annotations

import contextlib
import functools
import sys

import torch

#: names of the rotary function in the modeling modules of Hugging Face decoders
ROTARY = "apply_rotary_pos_emb"


def _is_norm(module: torch.nn.Module) -> bool:
    name = type(module).__name__
    return name.endswith("RMSNorm") and not any(True for _ in module.children())


def _is_gated_mlp(module: torch.nn.Module) -> bool:
    return all(hasattr(module, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn"))


@functools.lru_cache(maxsize=None)
def _compiled(fn):
    """``fn`` compiled once per process, for shapes that change (the rows of a step)."""
    return torch.compile(fn, dynamic=True)


def fusable(model) -> list[torch.nn.Module]:
    """The modules of ``model`` (a :class:`cyb.PauseModel`) whose forward :func:`fused_small_ops`
    compiles: RMSNorms without children and gated MLPs (``gate_proj``, ``up_proj``, ``down_proj``,
    ``act_fn``)."""
    return [m for m in model.hf_model.modules() if _is_norm(m) or _is_gated_mlp(m)]


@contextlib.contextmanager
def fused_small_ops(model):
    """While inside, ``model``'s norms and gated MLPs (:func:`fusable`) and its modeling module's
    rotary function run compiled (see the module docstring); on exit everything is as before."""
    modules = fusable(model)
    for m in modules:
        forward = _compiled(type(m).forward)
        m.forward = functools.partial(forward, m)  # an instance attribute: this module only
    rotary_home = _rotary_home(model)
    original = getattr(rotary_home, ROTARY, None) if rotary_home is not None else None
    if original is not None:
        setattr(rotary_home, ROTARY, _compiled(original))
    try:
        yield
    finally:
        for m in modules:
            del m.forward
        if original is not None:
            setattr(rotary_home, ROTARY, original)


def _rotary_home(model):
    """The Python module that defines ``model``'s attention layers, when it applies rotary
    embeddings through a module-level :data:`ROTARY` function (every Llama-like decoder)."""
    from ..model import gates

    for attn in gates.attention_modules(model.hf_model):
        home = sys.modules.get(type(attn).__module__)
        return home if home is not None and callable(getattr(home, ROTARY, None)) else None
    return None


__all__ = ["fusable", "fused_small_ops"]
