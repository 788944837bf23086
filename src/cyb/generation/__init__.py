"""Generation with pauses: the public API and its decoders.

* :mod:`cyb.generation.api`: :func:`generate`, :func:`stream`, :class:`GenerationConfig`,
  :class:`GenerationResult` (fixed or adaptive mode, greedy or sampled readout, batched prompts).
* :mod:`cyb.generation.decoders`: the eager fixed (Recipe 1) and adaptive (Recipe 2) decode
  loops on :meth:`cyb.PauseModel.hidden_states` with a ``DynamicCache``, and the per-block /
  per-step readout.
* :mod:`cyb.generation.static`: the same decisions on a preallocated KV cache, each decode step
  replayed as a CUDA graph on CUDA (the default there).
* :mod:`cyb.generation.registry`: the decoders by name (``graph``, ``static``, ``eager``), what
  ``auto`` means for a model, and :func:`~cyb.generation.registry.make_decoder`.
* :mod:`cyb.generation.text`: prompt encoding, incremental detokenisation and stop strings.
* :mod:`cyb.generation.shade`: ANSI background colours by steps used (``cyb generate --shade``).
"""

from .api import GenerationConfig, GenerationResult, generate, stream

__all__ = ["GenerationConfig", "GenerationResult", "generate", "stream"]
