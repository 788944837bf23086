"""The engine: decoding where rows advance on their own and come and go.

* :mod:`cyb.engine.engine`: :class:`Engine` (submit requests, step, read what each step
  decided).
* :mod:`cyb.engine.options`: :class:`EngineOptions`.
* :mod:`cyb.engine.scheduler`: the queue, the slots, admission, prefill chunks, preemption,
  compaction.
* :mod:`cyb.engine.cache`: the KV cache, blocks of columns and a block table per slot.
* :mod:`cyb.engine.blocks`: which blocks are free, held, or hold a cached prompt prefix (host).
* :mod:`cyb.engine.paging`: the blocks each row holds: admission, growth, release, prefix caching.
* :mod:`cyb.engine.runner`: one decoding step (a CUDA graph on CUDA) and prefill forwards.
* :mod:`cyb.engine.rows`: each slot's decoding state on the device and how a step moves it on.
* :mod:`cyb.engine.readout`: per-row decisions (greedy or sampled, each row's own stream).
* :mod:`cyb.engine.layout`: where each pause layout puts a request's positions.
* :mod:`cyb.engine.requests`: :class:`Request` in, :class:`Emitted` out.
"""

from .engine import Engine, EngineOptions, choose_positions, unsupported_reason
from .requests import Emitted, Request

__all__ = ["Emitted", "Engine", "EngineOptions", "Request", "choose_positions", "unsupported_reason"]
