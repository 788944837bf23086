"""Generation with pauses: the public API and its decoders.

* :mod:`cyb.generation.api`: :func:`generate`, :func:`stream`, :class:`GenerationConfig`,
  :class:`GenerationResult` (fixed or adaptive mode, greedy or sampled readout, many prompts
  through the engine).
* :mod:`cyb.generation.decoders`: the eager fixed (Recipe 1) and adaptive (Recipe 2) decode
  loops on :meth:`cyb.PauseModel.hidden_states` with a ``DynamicCache``, and the per-block /
  per-step readout.
* :mod:`cyb.generation.private`: the eager decoders of private pauses (a cache of real tokens).
* :mod:`cyb.generation.registry`: the decoders by name (``graph`` and ``static``: the engine,
  :mod:`cyb.engine`, with and without CUDA graphs; ``eager``), what ``auto`` means for a model,
  and :func:`~cyb.generation.registry.make_decoder` (the eager ones).
* :mod:`cyb.generation.text`: prompt encoding, incremental detokenisation and stop strings.
* :mod:`cyb.generation.shade`: ANSI background colours by steps used (``cyb generate --shade``).
"""

from .api import GenerationConfig, GenerationResult, generate, stream

__all__ = ["GenerationConfig", "GenerationResult", "generate", "stream"]
