"""The engine in a process of its own (``cyb serve``'s default).

In a thread of the HTTP process the engine shares the interpreter's lock with the event loop:
while the loop parses requests, turns tokens into text and writes server-sent events, the
engine cannot launch its next step, and the GPU waits.  Here the engine's process loads the
model and runs an :class:`~.worker.EngineWorker`; the HTTP process keeps the tokenizer and
everything else.  Only token ids cross, over two pipes:

* to the engine: ``("submit", job id, requests)``, ``("abort", job id, choices)``,
  ``("score", score id, sequences, top)``, ``("stop",)``;
* from the engine: ``("ready", served, slots, columns)`` or ``("failed", message, kind)`` once,
  then ``("steps", [(job id, items)], state)`` for each step that decided tokens (``items``:
  ``(choice, token, steps, positions, finished)`` tuples or a
  :class:`~.worker.WorkerFailure`), ``("state", state)`` when the gauges changed while idle,
  ``("scored", score id, result, error)``, and ``("stopped",)`` at the end.

:class:`EngineProcess` is the HTTP side, with the :class:`~.worker.EngineWorker`'s interface
(``submit``, ``abort``, ``score``, ``slots``, ``columns``, ``snapshot``, ``failures``,
``alive``, ``stop``), so the routes do not know which one they talk to.  When the engine's
process dies (killed, out of memory), its requests are answered 500 and the server reports the
engine stopped (503 on ``/health``).
"""

from __future__ import annotations

import concurrent.futures
import gc
import itertools
import logging
import multiprocessing
import pickle
import signal
import sys
import threading
from typing import Callable, NamedTuple

from .protocol import first_line
from .worker import SWITCH_INTERVAL_S, EngineWorker, WorkerFailure, default_slots, settle

log = logging.getLogger("cyb.serve")

#: how often (seconds) the idle engine's process looks whether its gauges changed
STATE_PERIOD_S = 0.2


class Decided(NamedTuple):
    """One new token of a choice, as the HTTP process sees it (the fields of
    :class:`cyb.engine.Emitted` that a response needs)."""

    token: int
    steps: int
    positions: int
    finished: str | None


# --------------------------------------------------------------------------- the engine's process


class _Job:
    """A request's choices in the engine's process: what the worker runs, and which choices
    are still open (the job is forgotten when none is)."""

    def __init__(self, jid: int, requests) -> None:
        self.jid, self.requests, self.cancelled = jid, requests, False
        self.open = set(range(len(requests)))


def _engine_main(loader, slots, cache_bytes, threads, inbox, outbox) -> None:
    """The engine's process: build the model and worker, then answer the HTTP process."""
    import torch

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the HTTP side drains
    torch.set_num_threads(threads)  # as the HTTP process was told (cyb.threads): the same CPU numbers
    lock = threading.Lock()

    def send(message) -> None:
        with lock:
            outbox.send(message)

    jobs: dict[int, _Job] = {}

    def deliver(batch) -> None:  # the worker's thread, once per step
        out = []
        for job, items in batch:
            if isinstance(items, WorkerFailure):
                job.open.clear()
                out.append((job.jid, items))
            else:
                compact = []
                for i, e in items:
                    compact.append((i, e.token, e.steps, e.positions, e.finished))
                    if e.finished is not None:
                        job.open.discard(i)
                out.append((job.jid, compact))
            if not job.open:
                jobs.pop(job.jid, None)
        send(("steps", out, _state(worker)))

    worker = None
    try:
        served = loader()
        worker = EngineWorker(served, slots=slots or default_slots(served.device), cache_bytes=cache_bytes,
                              deliver=deliver).start()
    except BaseException as e:  # noqa: BLE001 - said to the HTTP process, which exits with it
        send(("failed", first_line(e) or type(e).__name__, "value" if isinstance(e, ValueError) else "other"))
        return
    send(("ready", served, worker.slots, worker.columns))
    # a full collection walks every object made while loading (the model, the libraries): on an
    # H200 one took 0.2-0.27 s, in which no row decoded (benchmarks/engine_gaps.py); frozen,
    # they are never walked again
    gc.collect()
    gc.freeze()
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # this thread takes the lock from the engine's for each message
    last = _state(worker)
    try:
        while True:
            if not inbox.poll(STATE_PERIOD_S):
                now = _state(worker)
                if now != last:
                    send(("state", now))
                    last = now
                continue
            if _handle(inbox.recv(), worker, jobs, send):
                break
    except (EOFError, OSError):  # the HTTP process is gone
        pass
    finally:
        worker.stop()
        try:
            send(("stopped",))
        except OSError:
            pass


def _handle(message, worker, jobs: dict, send) -> bool:
    """Carry out one message of the HTTP process in the engine's process; True on ``stop``."""
    kind = message[0]
    if kind == "submit":
        job = jobs[message[1]] = _Job(message[1], message[2])
        worker.submit(job)
    elif kind == "abort":
        job = jobs.get(message[1])
        if job is not None:
            choices = message[2]
            worker.abort(job, choices)
            job.open.difference_update(set(job.open) if choices is None else choices)
            if not job.open:
                jobs.pop(job.jid, None)
    elif kind == "score":
        sid = message[1]
        worker.score(message[2], top=message[3]).add_done_callback(
            lambda f: send(("scored", sid, *_outcome(f))))
    return kind == "stop"


def _state(worker) -> tuple:
    return worker.snapshot, worker.failures, worker.alive


def _outcome(future: concurrent.futures.Future) -> tuple:
    """``(result, None)`` or ``(None, error)`` of a settled future, the error as one that pickles."""
    if future.cancelled():
        return None, RuntimeError("the scoring was cancelled")
    error = future.exception()
    if error is None:
        return future.result(), None
    try:
        pickle.dumps(error)
    except Exception:  # noqa: BLE001
        error = RuntimeError(f"{type(error).__name__}: {first_line(error)}")
    return None, error


# --------------------------------------------------------------------------- the HTTP side


class EngineProcess:
    """The engine in a child process, seen from the HTTP process (see the module docstring).

    Args:
        loader: a picklable callable with no arguments that returns the
            :class:`~.served.ServedModel` (called in the child: the model is loaded there only).
        slots: rows that decode at once (None: 256 on CUDA, 64 elsewhere; cut by the engine to
            the cache memory).
        cache_bytes: the engine's cache memory (None: its default).
        deliver: called from a reader thread with each step's ``[(job, items)]``, as
            :class:`~.worker.EngineWorker` calls it; may be set after :meth:`start`.
    """

    def __init__(self, loader: Callable, *, slots: int | None = None, cache_bytes: int | None = None,
                 deliver: Callable[[list], None] | None = None) -> None:
        self._loader, self._slots_wanted, self._cache_bytes = loader, slots, cache_bytes
        self.deliver = deliver
        self.served = None
        self.slots = self.columns = 0
        self.snapshot = (0, 0, 0, 0, 0)
        self.failures = 0
        self.alive = False
        self._ids = itertools.count()
        self._jobs: dict[int, tuple[object, set]] = {}
        self._scores: dict[int, concurrent.futures.Future] = {}
        self._send_lock = threading.Lock()
        self._stopping = False
        self._proc = self._conn = self._reader = None

    def start(self, timeout: float | None = None) -> "EngineProcess":
        """Start the child and wait until it has loaded the model and built the engine; raises
        ValueError (the model cannot be served: the loader's message) or RuntimeError."""
        import torch

        ctx = multiprocessing.get_context("spawn")  # CUDA cannot live in a forked child
        from_child, child_out = ctx.Pipe(duplex=False)
        child_in, to_child = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_engine_main, name="cyb-engine", daemon=True,
                                 args=(self._loader, self._slots_wanted, self._cache_bytes, torch.get_num_threads(),
                                       child_in, child_out))
        self._proc.start()
        child_in.close()
        child_out.close()
        self._conn, self._out = from_child, to_child
        message = None
        waited = 0.0
        while message is None:
            if from_child.poll(0.5):
                try:
                    message = from_child.recv()
                except EOFError:
                    break
            elif not self._proc.is_alive():
                break
            waited += 0.5
            if timeout is not None and waited > timeout:
                self._proc.kill()
                raise RuntimeError(f"the engine's process was not ready within {timeout:g} s")
        if message is None or message[0] != "ready":
            self._proc.join(10)
            if message is not None and message[0] == "failed":
                raise (ValueError if message[2] == "value" else RuntimeError)(message[1])
            raise RuntimeError(f"the engine's process exited (code {self._proc.exitcode}) before it was ready")
        _, self.served, self.slots, self.columns = message
        self.alive = True
        self._reader = threading.Thread(target=self._read, name="cyb-engine-reader", daemon=True)
        self._reader.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """End the child: running jobs get a failure ("the server stopped"), pending scores an error."""
        if self._proc is None:
            return
        self._stopping = True
        try:
            self._send(("stop",))
        except OSError:
            pass
        if self._reader is not None:
            self._reader.join(timeout)
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()

    # ------------------------------------------------------------------ the worker's interface
    def submit(self, job) -> None:
        """Queue ``job``'s requests (its tokens come back through ``deliver``)."""
        jid = job.engine_job = next(self._ids)
        self._jobs[jid] = (job, set(range(len(job.requests))))
        try:
            self._send(("submit", jid, job.requests))
        except OSError:
            self._jobs.pop(jid, None)
            self._deliver([(job, self._gone())])

    def abort(self, job, choices=None) -> None:
        """End ``job``'s requests (only ``choices``, indices, when given)."""
        jid = getattr(job, "engine_job", None)
        entry = self._jobs.get(jid)
        if entry is None:
            return
        entry[1].difference_update(set(entry[1]) if choices is None else choices)
        if not entry[1]:
            self._jobs.pop(jid, None)
        try:
            self._send(("abort", jid, None if choices is None else tuple(choices)))
        except OSError:
            pass

    def score(self, sequences, top: int = 0) -> concurrent.futures.Future:
        """A future of :func:`cyb.integrations.scoring.score_tokens` of ``sequences``."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        sid = next(self._ids)
        self._scores[sid] = future
        try:
            self._send(("score", sid, [list(s) for s in sequences], top))
        except OSError:
            self._scores.pop(sid, None)
            settle(future, exception=RuntimeError(self._gone().message))
        return future

    # ------------------------------------------------------------------ internals
    def _send(self, message) -> None:
        with self._send_lock:
            self._out.send(message)

    def _deliver(self, batch) -> None:
        if batch and self.deliver is not None:
            self.deliver(batch)

    def _gone(self) -> WorkerFailure:
        code = self._proc.exitcode if self._proc is not None else None
        return WorkerFailure(f"the engine's process exited (code {code}); restart cyb serve", 500)

    def _read(self) -> None:
        """The reader thread: hand each message of the child to its owner."""
        jobs = self._jobs
        try:
            while True:
                message = self._conn.recv()
                kind = message[0]
                if kind == "steps":
                    out = []
                    for jid, items in message[1]:
                        entry = jobs.get(jid)
                        if entry is None:
                            continue
                        job, open_choices = entry
                        if isinstance(items, WorkerFailure):
                            open_choices.clear()
                            out.append((job, items))
                        else:
                            decided = []
                            for i, token, steps, positions, finished in items:
                                decided.append((i, Decided(token, steps, positions, finished)))
                                if finished is not None:
                                    open_choices.discard(i)
                            out.append((job, decided))
                        if not open_choices:
                            jobs.pop(jid, None)
                    self.snapshot, self.failures, self.alive = message[2]
                    self._deliver(out)
                elif kind == "state":
                    self.snapshot, self.failures, self.alive = message[1]
                elif kind == "scored":
                    future = self._scores.pop(message[1], None)
                    if future is not None:
                        settle(future, result=message[2], exception=message[3])
                elif kind == "stopped":
                    break
        except (EOFError, OSError):
            pass
        self.alive = False
        self._proc.join(5)
        failure = WorkerFailure("the server stopped", 503) if self._stopping else self._gone()
        if not self._stopping:
            log.error("cyb serve: %s", failure.message)
        pending = [job for job, _ in jobs.values()]
        jobs.clear()
        self._deliver([(job, failure) for job in pending])
        for future in list(self._scores.values()):
            settle(future, exception=RuntimeError(failure.message))
        self._scores.clear()


__all__ = ["Decided", "EngineProcess", "STATE_PERIOD_S"]
