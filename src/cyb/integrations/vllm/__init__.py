"""Shared-pause models in vLLM: a vLLM plugin (``pip install -e '.[vllm]'``, then
``vllm serve RUN_FOLDER``).

vLLM loads :func:`register` through its ``vllm.general_plugins`` entry point in every process
it starts.  From then on a cyb model is served like any other: ``vllm serve``, ``vllm.LLM``, its
OpenAI server, its batching and cache.  What the plugin adds, each piece in its own module:

* :mod:`~cyb.integrations.vllm.engine_args`: when vLLM is given a cyb folder (a run folder, its
  ``final/`` model, a checkpoint), the engine's arguments are set for it: the model folder, the
  renderer, the readout, the model class of shared positions, the logprobs mode; or the model is
  refused in one line (private or gated pauses, LoRA folders, pause-step adapters).
* :mod:`~cyb.integrations.vllm.renderer`: prompts laid out with their pauses, as training
  laid them out.
* :mod:`~cyb.integrations.vllm.model`: shared positions, vLLM's model with its positions
  divided by ``M``; pauses that advance positions run as the plain model.
* :mod:`~cyb.integrations.vllm.readout`: the readout, a logits processor with per-request
  state; a request picks its mode with ``extra_args={"mode": "fixed" | "adaptive"}``.  Its
  classes satisfy the loaders of both of vLLM's model runners, and keep their state as the
  runner at hand calls them (:mod:`~cyb.integrations.vllm.readout_v1` for the V1 runner of the
  CPU build, :mod:`~cyb.integrations.vllm.readout_v2` for Model Runner V2, vLLM's runner on a
  GPU); what they decide is :mod:`~cyb.integrations.vllm.decisions`.
* :mod:`~cyb.integrations.vllm.pauses`: what needs no vLLM: the settings, the refusals, the
  prompt layout and :func:`steps_per_token`, which reads each token's steps from an output.

docs/how-to/vllm.md shows it run, and which models and modes vLLM can serve.
"""

from __future__ import annotations

from .pauses import ServedPauses, Unservable, real_tokens, steps_per_token

_registered = False


def register() -> None:
    """vLLM's entry point (``vllm.general_plugins``): registers the renderer, the model classes
    of shared positions and the engine-argument hook.  Safe to call more than once."""
    global _registered
    if _registered:
        return
    _registered = True
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.renderers.registry import RENDERER_REGISTRY
    from vllm.tokenizers.registry import TokenizerRegistry

    from . import engine_args, model, renderer

    TokenizerRegistry.register(engine_args.TOKENIZER_MODE, "vllm.tokenizers.hf", "CachedHfTokenizer")
    RENDERER_REGISTRY.register(engine_args.TOKENIZER_MODE, renderer.__name__, "PauseRenderer")
    for arch in sorted(ModelRegistry.get_supported_archs()):
        if arch.endswith("ForCausalLM") and not arch.startswith(model.PREFIX):
            ModelRegistry.register_model(model.shared_name(arch), f"{model.__name__}:{model.shared_name(arch)}")
    engine_args.install()


__all__ = ["ServedPauses", "Unservable", "real_tokens", "register", "steps_per_token"]
