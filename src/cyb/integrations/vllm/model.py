"""The model class of shared positions: vLLM's own architecture with its positions divided by
``M`` before the rotary embedding.

vLLM gives the ``k``-th token of a sequence position ``k``.  In fixed mode every real token is
followed by exactly ``M - 1`` pauses (the prompt is laid out so by the plugin's renderer, and
the readout forces the block's pauses), so the position training gave token ``k`` and its
pauses is ``k // M``.  ``CybShared<Arch>`` is ``<Arch>`` (vLLM's class for the saved model's
architecture, e.g. ``LlamaForCausalLM``) whose ``forward`` does that division and nothing else:
weights, attention, cache and logits are vLLM's.  Models whose pauses advance positions run as
the plain architecture.
"""

from __future__ import annotations

PREFIX = "CybShared"


def shared_name(architecture: str) -> str:
    """The registered name of the shared-positions class of ``architecture``."""
    return PREFIX + architecture


def _build(architecture: str):
    from vllm.model_executor.models.registry import ModelRegistry

    from .readout import pauses_of

    base = ModelRegistry._try_load_model_cls(architecture)
    if base is None:
        raise ValueError(f"vLLM has no model class for the architecture {architecture!r}")

    def __init__(self, *, vllm_config, prefix: str = "", **kwargs):
        base.__init__(self, vllm_config=vllm_config, prefix=prefix, **kwargs)
        pauses = pauses_of(vllm_config.model_config.hf_config)
        self.cyb_num_steps = pauses.num_steps if pauses is not None else 1

    def forward(self, input_ids, positions, *args, **kwargs):
        return base.forward(self, input_ids, positions // self.cyb_num_steps, *args, **kwargs)

    name = shared_name(architecture)
    return type(name, (base,), {"__init__": __init__, "forward": forward, "__module__": __name__,
                                "__qualname__": name})


def __getattr__(name: str):
    # CybShared<Arch>, built on first use from vLLM's class of <Arch>
    if name.startswith(PREFIX) and len(name) > len(PREFIX):
        cls = _build(name[len(PREFIX):])
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
