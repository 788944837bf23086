"""The parts of :mod:`cyb.generate`: decode loops, text streaming, terminal shading.

* :mod:`cyb.generation.decoders`: the fixed (Recipe 1) and adaptive (Recipe 2) decode loops on
  :meth:`cyb.PauseModel.hidden_states` with a KV cache, and the per-block / per-step readout.
* :mod:`cyb.generation.text`: prompt encoding, incremental detokenisation and stop strings.
* :mod:`cyb.generation.shade`: ANSI background colours by steps used (``cyb generate --shade``).

The public entry points live in :mod:`cyb.generate`.
"""
