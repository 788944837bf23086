"""The engine's thread: it owns the model and one :class:`cyb.engine.Engine`.

The engine is not thread-safe, so everything that touches the model happens here: handlers on
the event loop send commands through a queue (:meth:`EngineWorker.submit`,
:meth:`~EngineWorker.abort`, :meth:`~EngineWorker.score`), and the worker sends each step's
tokens back in one call of ``deliver`` (the server makes that a ``call_soon_threadsafe`` onto
its loop).  Between engine steps it runs the scoring forwards of ``echo`` / ``logprobs``
requests, a bounded batch at a time, so that decoding rows are never stalled for long.
``cyb serve`` runs this thread inside the engine's own process (:mod:`.engine_process`);
``--engine thread`` runs it in the server's process.

A job (what :meth:`~EngineWorker.submit` takes) has ``requests`` (one
:class:`cyb.engine.Request` per choice) and a ``cancelled`` flag; the worker gives it ``rids``.
``deliver`` receives ``[(job, items), ...]`` where ``items`` is a list of ``(choice index,
Emitted)`` (or what ``pack`` makes of them) or a :class:`WorkerFailure`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import logging
import queue
import threading
import traceback
from collections import deque
from typing import Callable

from ..engine import Emitted, Engine, EngineOptions, choose_positions
from .metrics import SNAPSHOT, engine_snapshot
from .protocol import first_line

log = logging.getLogger("cyb.serve")

#: expanded positions (rows x longest x M) of one scoring forward at most
SCORE_POSITIONS = 16384

#: the interpreter's thread switch interval where the engine's thread shares a process: another
#: thread that needs the interpreter's lock (the event loop, the reader of the server's
#: messages) waits at most this long.  Python's default, 5 ms, stalled a decoding step behind the
#: HTTP work (a tiny model on a 2-core CPU served 1.6x the tokens per second with it), and in
#: the engine's own process made each request wait 5 ms to be read: at 256 closed-loop clients
#: on an H200 the server delivered 0.64x its engine offline, and 0.90x with it
SWITCH_INTERVAL_S = 0.0005


@contextlib.contextmanager
def frozen_start_up():
    """What start-up built (torch, transformers, the model: hundreds of thousands of objects) frozen
    out of the collector while the body serves (``gc.freeze``: its full passes walked them all, 0.1
    s each on a CPU and 0.2-0.27 s on an H200, while no row decoded and no stream was answered),
    and given back to it at the end (``gc.unfreeze``), so that the interpreter's exit frees them: a
    frozen object is never collected, and triton's nanobind bindings (imported with torch) then
    report each of theirs still alive at exit as leaked, about 30 lines on standard error."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class WorkerFailure:
    """A job that cannot go on: its ``message`` (one line) and HTTP ``status``."""

    def __init__(self, message: str, status: int = 500) -> None:
        self.message, self.status = message, status


def settle(future: concurrent.futures.Future, *, result=None, exception=None) -> None:
    """Set a future's outcome unless its caller has cancelled it meanwhile."""
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


def _pair(i: int, e: Emitted) -> tuple[int, Emitted]:
    return i, e


def default_slots(device) -> int:
    """Slots when ``--slots`` is not given, by the model's device (a torch device or its name)."""
    return 256 if str(getattr(device, "type", device)).startswith("cuda") else 64


class _Scoring:
    def __init__(self, future, sequences, top) -> None:
        self.future, self.sequences, self.top = future, list(sequences), top
        self.results: list = []


class EngineWorker:
    """One engine in a thread of its own (see the module docstring).

    Args:
        served: the :class:`~cyb.serve.served.ServedModel`.
        slots: rows that decode at once (cut by the engine to the cache memory).
        cache_bytes: the engine's cache memory (None: its default).
        engine_options: other :class:`cyb.engine.EngineOptions` fields (``block_size``,
            ``prefix_caching``; None: the defaults).
        deliver: called from the worker thread with each step's ``[(job, items)]``.
        pack: what each of a job's new tokens is in ``items``, from the choice's index and the
            :class:`~cyb.engine.Emitted` (None: the pair ``(index, emitted)``); the engine's
            process packs them as the tuples it sends, in the same pass.
    """

    def __init__(self, served, *, slots: int, cache_bytes: int | None = None, engine_options: dict | None = None,
                 deliver: Callable[[list], None], pack: Callable[[int, Emitted], object] | None = None) -> None:
        self.served = served
        self._slots_wanted = slots
        self._cache_bytes = cache_bytes
        self._engine_options = dict(engine_options or {})
        self._deliver = deliver
        self._pack = pack or _pair
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._owners: dict[int, tuple[object, int]] = {}
        self._scores: deque[_Scoring] = deque()
        self._thread = threading.Thread(target=self._run, name="cyb-engine", daemon=True)
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self.engine: Engine | None = None
        self.failures = 0
        #: the engine's gauges and counters after its last step (:data:`~.metrics.SNAPSHOT`)
        self.snapshot = (0,) * len(SNAPSHOT)
        self.alive = False

    # ------------------------------------------------------------------ from other threads
    def start(self) -> "EngineWorker":
        """Start the thread and build the engine there; raises what building it raised."""
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            raise self._start_error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """End the thread: running jobs get a failure, pending scores are cancelled."""
        if self._thread.is_alive():
            self._inbox.put(("stop",))
            self._thread.join(timeout)

    @property
    def slots(self) -> int:
        return self.engine.slots if self.engine is not None else 0

    @property
    def columns(self) -> int:
        """Cache columns of a row (what a request may fill, the engine's slack included)."""
        return self.engine.capacity if self.engine is not None else 0

    def submit(self, job) -> None:
        """Queue ``job``'s requests (its tokens come back through ``deliver``)."""
        self._inbox.put(("submit", job))

    def abort(self, job, choices=None) -> None:
        """End ``job``'s requests (only ``choices``, indices, when given); their slots are freed
        at the next step."""
        self._inbox.put(("abort", job, None if choices is None else tuple(choices)))

    def score(self, sequences, top: int = 0) -> concurrent.futures.Future:
        """A future of :func:`cyb.integrations.scoring.score_tokens` of ``sequences``."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(("score", _Scoring(future, sequences, top)))
        return future

    # ------------------------------------------------------------------ the thread
    def _build(self) -> Engine:
        served = self.served
        # the engine's own admission: under a queue longer than the free slots, prompts start in
        # groups (a few large prefill forwards); starting each as soon as a slot is free halved the
        # throughput of a mixed load (benchmarks/engine_traffic.py, docs/record/benchmarks/serving.md)
        options = EngineOptions(max_slots=self._slots_wanted, cache_bytes=self._cache_bytes, **self._engine_options)
        # the default mode decides the positions a step feeds: a fixed-mode model feeds whole
        # blocks (one step per token, not M); requests of the other mode decide the same tokens
        positions = choose_positions(served.model, [served.default_mode], self._slots_wanted)
        engine = Engine(served.model, capacity=served.columns, slots=self._slots_wanted, positions=positions,
                        options=options)
        engine.warm_up()  # before the first request: no graph is captured or compiled while rows decode
        return engine

    def _run(self) -> None:
        try:
            self.engine = self._build()
        except BaseException as e:  # noqa: BLE001 - handed to start()
            self._start_error = e
            self._ready.set()
            return
        self.alive = True
        self._ready.set()
        try:
            while True:
                busy = self.engine.busy or bool(self._scores)
                for cmd in self._commands(block=not busy):
                    if cmd[0] == "stop":
                        self._shutdown()
                        return
                    self._handle(cmd)
                if self._scores:
                    self._score_some()
                if self.engine.busy:
                    self._step()
                self.snapshot = engine_snapshot(self.engine)
        finally:
            self.alive = False

    def _commands(self, block: bool) -> list:
        cmds = [self._inbox.get()] if block else []
        while True:
            try:
                cmds.append(self._inbox.get_nowait())
            except queue.Empty:
                return cmds

    def _handle(self, cmd) -> None:
        kind = cmd[0]
        if kind == "submit":
            self._submit(cmd[1])
        elif kind == "abort":
            job, choices = cmd[1], cmd[2]
            rids = getattr(job, "rids", None) or []
            for i, rid in enumerate(rids):
                if (choices is None or i in choices) and rid in self._owners:
                    del self._owners[rid]
                    self.engine.abort(rid, "abort")
        elif kind == "score":
            self._scores.append(cmd[1])

    def _submit(self, job) -> None:
        job.rids = []
        if getattr(job, "cancelled", False):
            return
        for i, request in enumerate(job.requests):
            try:
                rid = self.engine.submit(request)
            except ValueError as e:
                for done in job.rids:
                    self._owners.pop(done, None)
                    self.engine.abort(done, "abort")
                self._deliver([(job, WorkerFailure(str(e), 400))])
                return
            job.rids.append(rid)
            self._owners[rid] = (job, i)

    def _step(self) -> None:
        try:
            events = self.engine.step()
        except Exception as e:  # noqa: BLE001 - the server keeps serving with a fresh engine
            self._engine_failed(e)
            return
        if not events:
            return
        owners, pack = self._owners, self._pack
        out: dict = {}
        for e in events:
            owner = owners.get(e.request)
            if owner is None:
                continue
            job, i = owner
            items = out.get(job)
            if items is None:
                items = out[job] = []
            items.append(pack(i, e))
            if e.finished is not None:
                del owners[e.request]
        if out:
            self._deliver(list(out.items()))

    def _engine_failed(self, error: BaseException) -> None:
        self.failures += 1
        log.error("cyb serve: the engine failed; its requests are answered with an error and a new engine "
                  "takes over:\n%s", "".join(traceback.format_exception(error)))
        message = f"internal error in the engine: {type(error).__name__}: {first_line(error)}"
        jobs = {job for job, _ in self._owners.values()}
        self._owners.clear()
        if jobs:
            self._deliver([(job, WorkerFailure(message, 500)) for job in jobs])
        try:
            self.engine = self._build()
        except BaseException as e:  # noqa: BLE001
            log.error("cyb serve: no new engine could be built: %s", e)
            raise

    def _score_some(self) -> None:
        """One scoring forward: the next sequences of the first pending job, within
        :data:`SCORE_POSITIONS` expanded positions (at least one sequence)."""
        from ..integrations.scoring import score_tokens

        item = self._scores[0]
        if item.future.cancelled():
            self._scores.popleft()
            return
        start = len(item.results)
        m = self.served.num_steps
        end, longest = start, 0
        while end < len(item.sequences):
            longest = max(longest, len(item.sequences[end]))
            if end > start and (end - start + 1) * longest * m > SCORE_POSITIONS:
                break
            end += 1
        try:
            item.results += score_tokens(self.served.model, item.sequences[start:end], top=item.top)
        except Exception as e:  # noqa: BLE001 - this job fails, the others go on
            log.error("cyb serve: a scoring forward failed:\n%s", "".join(traceback.format_exception(e)))
            self._scores.popleft()
            settle(item.future, exception=e)
            return
        if len(item.results) == len(item.sequences):
            self._scores.popleft()
            settle(item.future, result=item.results)

    def _shutdown(self) -> None:
        jobs = {job for job, _ in self._owners.values()}
        self._owners.clear()
        if jobs:
            self._deliver([(job, WorkerFailure("the server stopped", 503)) for job in jobs])
        while self._scores:
            item = self._scores.popleft()
            item.future.cancel()


__all__ = ["EngineWorker", "SCORE_POSITIONS", "SWITCH_INTERVAL_S", "WorkerFailure", "default_slots", "settle"]
