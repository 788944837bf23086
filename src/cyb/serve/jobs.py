"""One request's choices as their tokens come in (on the event loop's thread).

:class:`Generation` is what the worker runs (one :class:`cyb.engine.Request` per choice) and
what a handler waits on: :meth:`Generation.feed` takes a step's tokens, turns them into text
with :class:`cyb.generation.text.TextStream` (stop strings included: a choice whose text hits
one is aborted in the engine), and queues :class:`Delta` records that :meth:`Generation.deltas`
hands out, every delta that arrived since the last one at once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import NamedTuple

from ..generation.text import TextStream
from .worker import WorkerFailure


class Delta(NamedTuple):
    """New tokens of one choice: their text, ids and steps, and the finish reason when the
    choice ended with them (``"stop"``: EOS or a stop string; ``"length"``: max_tokens)."""

    choice: int
    text: str
    tokens: list
    steps: list
    finish_reason: str | None


class ChoiceState:
    """One choice: its ids, steps, positions, released text and finish reason.  Tokens wait in
    :attr:`pending` (``(token, steps, positions, engine finish)``) until :meth:`take` turns
    them into text."""

    def __init__(self, index: int, decode, stop) -> None:
        self.index = index
        self.token_ids: list[int] = []
        self.steps: list[int] = []
        self.positions = 0
        self.finish_reason: str | None = None
        self.pending: list[tuple] = []
        self.ended = False  # the engine reported its last token
        self._text = TextStream(decode, stop) if decode is not None else None

    @property
    def text(self) -> str:
        """The text so far (cut before a stop string)."""
        return self._text.text if self._text is not None else ""

    def take(self) -> tuple[Delta | None, bool]:
        """The pending tokens as a :class:`Delta` (None when none count), and whether a stop
        string ended the choice (the engine must abort it).  Tokens after the end are dropped."""
        if not self.pending or self.finish_reason is not None:
            self.pending = []
            return None, False
        pieces, tokens, steps, hit = [], [], [], False
        stream = self._text
        for token, n, positions, finished in self.pending:
            self.token_ids.append(token)
            self.steps.append(n)
            tokens.append(token)
            steps.append(n)
            self.positions = positions
            if stream is not None:
                piece, hit = stream.push(token)
                pieces.append(piece)
            if hit or finished == "eos":
                self.finish_reason = "stop"
            elif finished is not None:
                self.finish_reason = "length"
            if self.finish_reason is not None:
                if stream is not None:
                    pieces.append(stream.flush())
                break
        self.pending = []
        return Delta(self.index, "".join(pieces), tokens, steps, self.finish_reason), hit


class Generation:
    """The choices of one request (see the module docstring).

    Args:
        params: the :class:`~cyb.serve.protocol.GenerationParams`.
        served: the :class:`~cyb.serve.served.ServedModel`.
        worker: the :class:`~cyb.serve.worker.EngineWorker` (aborts go to it).
        metrics: the server's :class:`~cyb.serve.metrics.Metrics` (or None).
    """

    def __init__(self, params, served, worker, metrics=None) -> None:
        prefix = "chatcmpl" if params.chat else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.params = params
        self.requests = params.requests(served.eos) if params.max_tokens > 0 else []
        self.choices = [ChoiceState(i, served.decode, params.stop) for i in range(params.choices)]
        self.rids: list[int] = []
        self.cancelled = False
        self.failure: WorkerFailure | None = None
        self._worker, self._metrics = worker, metrics
        self._open = len(self.requests)  # choices not finished
        self._dirty: list[ChoiceState] = []
        self._ready = asyncio.Event()
        self._ended = not self.requests  # no more tokens will come
        self.started = time.monotonic()
        self.first_token_s: float | None = None
        if self._ended:
            self._ready.set()

    @property
    def finished(self) -> bool:
        """Every choice finished, or the request failed or was cancelled."""
        return self._ended and (self.failure is not None or not self._dirty)

    def start(self) -> "Generation":
        if self.requests:
            self._worker.submit(self)
        return self

    # ------------------------------------------------------------------ on the loop's thread
    def feed(self, items) -> tuple[int, int]:
        """A step's ``(choice, Emitted)`` items, or a :class:`WorkerFailure`; returns the
        tokens and their steps (for the metrics).  Cheap: the tokens wait in their choices
        until the handler takes them (:meth:`deltas`)."""
        if self._ended:
            return 0, 0
        if isinstance(items, WorkerFailure):
            self.failure = items
            self._end()
            return 0, 0
        choices, dirty, steps = self.choices, self._dirty, 0
        for i, event in items:
            c = choices[i]
            if c.ended:
                continue
            if not c.pending:
                dirty.append(c)
            c.pending.append((event.token, event.steps, event.positions, event.finished))
            steps += event.steps
            if event.finished is not None:
                c.ended = True
        if self.first_token_s is None:
            self.first_token_s = time.monotonic() - self.started
            if self._metrics is not None:
                self._metrics.first_token(self.first_token_s)
        self._ready.set()
        return len(items), steps

    def cancel(self, message: str, status: int = 503) -> bool:
        """End the request now (the server shuts down, the client left): its rows are aborted
        and its handler sees :attr:`failure`.  False when it had already finished."""
        if self._ended:
            return False
        self.cancelled = True
        self._worker.abort(self)
        self.failure = WorkerFailure(message, status)
        self._end()
        return True

    def _end(self) -> None:
        self._ended = True
        self._ready.set()

    def _take(self) -> list[Delta]:
        """Everything that arrived since the last call, one :class:`Delta` per choice."""
        deltas, aborts = [], []
        dirty, self._dirty = self._dirty, []
        for c in dirty:
            delta, hit = c.take()
            if delta is None:
                continue
            deltas.append(delta)
            if delta.finish_reason is not None:
                self._open -= 1
                if hit and not c.ended:
                    aborts.append(c.index)
                    c.ended = True
                if self._metrics is not None:
                    self._metrics.choice_finished(delta.finish_reason)
        if aborts:
            self._worker.abort(self, aborts)
        if self._open <= 0 and not self._ended:
            self._end()
        return deltas

    async def deltas(self):
        """Yield lists of :class:`Delta` (everything since the last list, one per choice) as
        tokens come; ends when the request does."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            if self.failure is None:
                deltas = self._take()
                if deltas:
                    yield deltas
            if self.finished:
                return

    async def wait(self) -> None:
        """Until every choice has finished (or the request failed / was cancelled)."""
        async for _ in self.deltas():
            pass

    # ------------------------------------------------------------------ results
    def usage(self) -> dict:
        """``usage`` with the pause fields: positions run for this request (every choice's prompt
        and steps), real tokens (each choice's prompt and its new tokens) and mean steps per
        new token."""
        p = self.params
        completion = sum(len(c.token_ids) for c in self.choices)
        steps = sum(sum(c.steps) for c in self.choices)
        prompts = sum(len(p.prompt_of(i)) for i in range(p.choices)) if self.requests else 0
        return {"prompt_tokens": p.prompt_tokens, "completion_tokens": completion,
                "total_tokens": p.prompt_tokens + completion,
                "positions": sum(c.positions for c in self.choices), "real_tokens": prompts + completion,
                "mean_steps": round(steps / completion, 4) if completion else None}


__all__ = ["ChoiceState", "Delta", "Generation"]
