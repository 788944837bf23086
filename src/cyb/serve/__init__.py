"""``cyb serve``: an OpenAI-compatible HTTP server for pause models, on the engine.

One :class:`cyb.engine.Engine` runs in a process of its own (:mod:`.engine_process`, the
default), which loads the model, or in a thread of the server's process (:mod:`.worker`);
requests reach it through a queue, and the tokens of each step go back to the requests'
handlers on the event loop.  The parts:

* :mod:`.options`: :class:`ServeOptions`, what the command line sets (address, limits, key).
* :mod:`.served`: :class:`ServedModel`, the model as the server sees it (name, tokenizer, EOS
  ids, the context a request may fill, prompts to ids).
* :mod:`.protocol`: request bodies checked and turned into :class:`~.protocol.GenerationParams`
  (one-line errors naming the field and what it allows).
* :mod:`.worker`: :class:`~.worker.EngineWorker`, the engine's thread (generation and the
  scoring forwards of ``echo`` / ``logprobs``).
* :mod:`.engine_process`: :class:`~.engine_process.EngineProcess`, that worker in a child
  process, seen from the server's process through two pipes (token ids only).
* :mod:`.jobs`: one request's choices as the tokens come in: text, stop strings, finish reasons.
* :mod:`.responses`: the JSON bodies and stream chunks of the OpenAI API, with the pause fields.
* :mod:`.metrics`: counters and gauges in Prometheus text.
* :mod:`.app`: the HTTP routes (Starlette), authentication, limits, server-sent events.
* :mod:`.server`: loading, the listening socket, uvicorn, SIGTERM with a grace period, and a
  server in a background thread (:func:`~.server.start_background`).
* :mod:`.client`: a small asyncio client of the streaming API (the load benchmark's).

The HTTP parts need the ``serve`` extra (starlette and uvicorn).
"""

from .options import ServeOptions

__all__ = ["ServeOptions"]
