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
    """One choice: its ids, steps, positions, released text and finish reason."""

    def __init__(self, index: int, decode, stop) -> None:
        self.index = index
        self.token_ids: list[int] = []
        self.steps: list[int] = []
        self.positions = 0
        self.finish_reason: str | None = None
        self._text = TextStream(decode, stop) if decode is not None else None

    @property
    def text(self) -> str:
        """The text so far (cut before a stop string)."""
        return self._text.text if self._text is not None else ""

    def add(self, event) -> tuple[str, bool]:
        """Take an :class:`cyb.engine.Emitted`; returns ``(released text, stop string hit)``
        and sets :attr:`finish_reason` when the choice ends."""
        self.token_ids.append(event.token)
        self.steps.append(event.steps)
        self.positions = event.positions
        piece, hit = self._text.push(event.token) if self._text is not None else ("", False)
        if hit or event.finished == "eos":
            self.finish_reason = "stop"
        elif event.finished is not None:
            self.finish_reason = "length"
        if self.finish_reason is not None and self._text is not None:
            piece += self._text.flush()
        return piece, hit


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
        self._open = len(self.requests)
        self._queue: asyncio.Queue = asyncio.Queue()
        self._done = asyncio.Event()
        self.started = time.monotonic()
        self.first_token_s: float | None = None
        if not self.requests:
            self._finish()

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def start(self) -> "Generation":
        if self.requests:
            self._worker.submit(self)
        return self

    # ------------------------------------------------------------------ on the loop's thread
    def feed(self, items) -> None:
        """A step's ``(choice, Emitted)`` items, or a :class:`WorkerFailure`."""
        if self._done.is_set():
            return
        if isinstance(items, WorkerFailure):
            self.failure = items
            self._finish()
            return
        deltas, aborts, steps = [], [], 0
        for i, event in items:
            c = self.choices[i]
            if c.finish_reason is not None:
                continue  # tokens decided after a stop string, before the abort took effect
            piece, hit = c.add(event)
            steps += event.steps
            deltas.append(Delta(i, piece, [event.token], [event.steps], c.finish_reason))
            if hit and event.finished is None:
                aborts.append(i)
            if c.finish_reason is not None:
                self._open -= 1
                if self._metrics is not None:
                    self._metrics.choice_finished(c.finish_reason)
        if not deltas:
            return
        if self.first_token_s is None:
            self.first_token_s = time.monotonic() - self.started
            if self._metrics is not None:
                self._metrics.first_token(self.first_token_s)
        if self._metrics is not None:
            self._metrics.tokens(len(deltas), steps)
        if aborts:
            self._worker.abort(self, aborts)
        self._queue.put_nowait(deltas)
        if self._open <= 0:
            self._finish()

    def cancel(self, message: str, status: int = 503) -> bool:
        """End the request now (the server shuts down, the client left): its rows are aborted
        and its handler sees :attr:`failure`.  False when it had already finished."""
        if self._done.is_set():
            return False
        self.cancelled = True
        self._worker.abort(self)
        self.failure = WorkerFailure(message, status)
        self._finish()
        return True

    def _finish(self) -> None:
        self._done.set()
        self._queue.put_nowait(None)

    async def wait(self) -> None:
        """Until every choice has finished (or the request failed / was cancelled)."""
        await self._done.wait()

    async def deltas(self):
        """Yield lists of :class:`Delta`: everything that arrived since the last list, merged
        per choice, in choice order of arrival; ends when the request does."""
        while True:
            first = await self._queue.get()
            batch = [first]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            end = batch[-1] is None
            merged: dict[int, Delta] = {}
            for deltas in batch:
                if deltas is None:
                    continue
                for d in deltas:
                    m = merged.get(d.choice)
                    merged[d.choice] = d if m is None else Delta(
                        d.choice, m.text + d.text, m.tokens + d.tokens, m.steps + d.steps, d.finish_reason)
            if merged:
                yield list(merged.values())
            if end:
                return

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
