"""The engine in a process of its own (``cyb serve``'s default).

In a thread of the HTTP process the engine shares the interpreter's lock with the event loop:
while the loop parses requests, turns tokens into text and writes server-sent events, the
engine cannot launch its next step, and the GPU waits.  Here the engine's process loads the
model and runs an :class:`~.worker.EngineWorker`; the HTTP processes keep the tokenizer and
everything else.  Only token ids cross, over two pipes per HTTP process (a *link*; link 0 is
the main process's, ``cyb serve --http-processes N`` adds N - 1):

* to the engine: ``("submit", job id, requests)``, ``("abort", job id, choices)``,
  ``("score", score id, sequences, top)``, ``("metrics", counters)`` (forwarded to the other
  links as ``("peer", link, counters)``), and ``("stop",)`` (link 0 only);
* from the engine: ``("ready", served, slots, columns)`` or ``("failed", message, kind)`` once
  on link 0, then ``("steps", [(job id, items)], state)`` to each link with tokens in a step
  (``items``: ``(choice, token, steps, positions, finished)`` tuples or a
  :class:`~.worker.WorkerFailure`), ``("state", state)`` when the gauges changed (checked
  every :data:`STATE_PERIOD_S`), ``("scored", score id, result, error)``, and ``("stopped",)``
  at the end.

Job and score ids are the link's own: the engine keys them by ``(link, id)``.  A link that
closes (its HTTP process exited) has its rows aborted; the end of link 0 stops the engine.

:class:`EngineLink` is an HTTP process's side, with the :class:`~.worker.EngineWorker`'s
interface (``submit``, ``abort``, ``score``, ``slots``, ``columns``, ``snapshot``,
``failures``, ``alive``, ``stop``), so the routes do not know which one they talk to;
:class:`EngineProcess` is link 0, which also starts and stops the engine's process.  When the
engine's process dies (killed, out of memory), its requests are answered 500 and the server
reports the engine stopped (503 on ``/health``).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import multiprocessing
import pickle
import signal
import sys
import threading
import time
from typing import Callable, NamedTuple

from .metrics import SNAPSHOT
from .protocol import first_line
from .worker import SWITCH_INTERVAL_S, EngineWorker, WorkerFailure, default_slots, frozen_start_up, settle

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
    """A request's choices in the engine's process: what the worker runs, which HTTP process
    (link) it came from, and which choices are still open (the job is forgotten when none is)."""

    def __init__(self, link: int, jid: int, requests) -> None:
        self.link, self.jid, self.requests, self.cancelled = link, jid, requests, False
        self.open = set(range(len(requests)))


class _Links:
    """The engine's side of its links to the HTTP processes: one outgoing pipe each, a lock
    each (the worker's thread and the main thread both send), and the jobs of each."""

    def __init__(self, outboxes) -> None:
        self.outboxes = list(outboxes)
        self.locks = [threading.Lock() for _ in self.outboxes]
        self.live = set(range(len(self.outboxes)))
        self.jobs: dict[tuple[int, int], _Job] = {}

    def send(self, link: int, message) -> None:
        """Send to one HTTP process; a process that is gone is skipped (its inbox's end of file
        drops it)."""
        if link not in self.live:
            return
        try:
            with self.locks[link]:
                self.outboxes[link].send(message)
        except OSError:
            pass

    def broadcast(self, message, *, but: int | None = None) -> None:
        for link in sorted(self.live):
            if link != but:
                self.send(link, message)

    def drop(self, link: int, worker) -> None:
        """An HTTP process has gone: its rows are aborted, its pipe no longer written."""
        self.live.discard(link)
        for key in [key for key in self.jobs if key[0] == link]:
            job = self.jobs.pop(key)
            job.cancelled = True
            worker.abort(job, None)


def _engine_main(loader, slots, cache_bytes, engine_options, threads, inboxes, outboxes) -> None:
    """The engine's process: build the model and worker, then answer the HTTP processes (one
    link each: ``inboxes[k]`` from HTTP process ``k``, ``outboxes[k]`` to it; link 0 is the
    main one, which gets ``ready`` and whose end stops the engine)."""
    import torch
    from multiprocessing.connection import wait

    # Ctrl-C reaches the whole group, and a service manager's SIGTERM every process: the HTTP
    # processes drain, and the main one stops the engine after them (or its link's end does)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(threads)  # as the HTTP process was told (cyb.threads): the same CPU numbers
    links = _Links(outboxes)
    jobs = links.jobs

    def deliver(batch) -> None:  # the worker's thread, once per step; items as _pack made them
        out: dict[int, list] = {}
        for job, items in batch:
            if isinstance(items, WorkerFailure):
                job.open.clear()
            else:
                for item in items:
                    if item[4] is not None:
                        job.open.discard(item[0])
            out.setdefault(job.link, []).append((job.jid, items))
            if not job.open:
                jobs.pop((job.link, job.jid), None)
        state = _state(worker)
        for link, items in out.items():
            links.send(link, ("steps", items, state))

    worker = None
    try:
        served = loader()
        worker = EngineWorker(served, slots=slots or default_slots(served.device), cache_bytes=cache_bytes,
                              engine_options=engine_options, deliver=deliver, pack=_pack).start()
    except BaseException as e:  # noqa: BLE001 - said to the HTTP process, which exits with it
        links.send(0, ("failed", first_line(e) or type(e).__name__, "value" if isinstance(e, ValueError) else "other"))
        return
    links.send(0, ("ready", served, worker.slots, worker.columns))
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # this thread takes the lock from the engine's for each message
    reading = {conn: link for link, conn in enumerate(inboxes)}
    last, due = _state(worker), time.monotonic() + STATE_PERIOD_S
    with frozen_start_up():  # (a collection's pause: benchmarks/engine_gaps.py)
        try:
            stop = False
            while not stop:
                for conn in wait(list(reading), STATE_PERIOD_S):
                    link = reading[conn]
                    try:
                        message = conn.recv()
                    except (EOFError, OSError):  # that HTTP process is gone
                        if link == 0:
                            stop = True
                            break
                        del reading[conn]
                        links.drop(link, worker)
                        continue
                    if _handle(message, link, worker, links):
                        stop = True
                        break
                if time.monotonic() >= due:  # the gauges of HTTP processes that got no step lately
                    due = time.monotonic() + STATE_PERIOD_S
                    now = _state(worker)
                    if now != last:
                        links.broadcast(("state", now))
                        last = now
        finally:
            worker.stop()
            links.broadcast(("stopped",))


def _pack(i: int, e) -> tuple:
    """A token as it crosses the pipe: ``(choice, token, steps, positions, finished)``."""
    return i, e.token, e.steps, e.positions, e.finished


def _handle(message, link: int, worker, links: _Links) -> bool:
    """Carry out one message of HTTP process ``link`` in the engine's process; True on ``stop``."""
    kind, jobs = message[0], links.jobs
    if kind == "submit":
        job = jobs[(link, message[1])] = _Job(link, message[1], message[2])
        worker.submit(job)
    elif kind == "abort":
        job = jobs.get((link, message[1]))
        if job is not None:
            choices = message[2]
            worker.abort(job, choices)
            job.open.difference_update(set(job.open) if choices is None else choices)
            if not job.open:
                jobs.pop((link, job.jid), None)
    elif kind == "score":
        sid = message[1]
        worker.score(message[2], top=message[3]).add_done_callback(
            lambda f: links.send(link, ("scored", sid, *_outcome(f))))
    elif kind == "metrics":  # an HTTP process's counters, for the others' /metrics
        links.broadcast(("peer", link, message[1]), but=link)
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


class EngineLink:
    """One HTTP process's link to the engine's process, with the
    :class:`~.worker.EngineWorker`'s interface (see the module docstring).

    Args:
        receive, send: this link's ends of the pipes (from the engine, to it).
        served, slots, columns, state: what the engine said when it was ready (``state``:
            ``(snapshot, failures, alive)``).
        deliver: called from the reader thread with each step's ``[(job, items)]``; may be set
            after :meth:`start_reading`.

    :attr:`peers` holds the last counters (:meth:`cyb.serve.metrics.Metrics.shareable`) of
    each other HTTP process, by its index, for ``/metrics``.
    """

    def __init__(self, receive=None, send=None, *, served=None, slots: int = 0, columns: int = 0,
                 state: tuple = ((0,) * len(SNAPSHOT), 0, False),
                 deliver: Callable[[list], None] | None = None) -> None:
        self._conn, self._out = receive, send
        self.served, self.slots, self.columns = served, slots, columns
        self.snapshot, self.failures, self.alive = state
        self.deliver = deliver
        self.peers: dict[int, dict] = {}
        self.on_end: Callable[[], None] | None = None  # called when the link ends without stop()
        self._ids = itertools.count()
        self._jobs: dict[int, tuple[object, set]] = {}
        self._scores: dict[int, concurrent.futures.Future] = {}
        self._send_lock = threading.Lock()
        self._stopping = False
        self._reader = None

    @property
    def state(self) -> tuple:
        """``(snapshot, failures, alive)``, as another HTTP process's link starts with it."""
        return self.snapshot, self.failures, self.alive

    def start_reading(self) -> "EngineLink":
        self._reader = threading.Thread(target=self._read, name="cyb-engine-reader", daemon=True)
        self._reader.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Close this link (the engine aborts its rows and goes on serving the other HTTP
        processes); running jobs get a failure ("the server stopped")."""
        self._stopping = True
        for conn in (self._out, self._conn):
            if conn is not None:
                conn.close()
        if self._reader is not None:
            self._reader.join(timeout)

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

    def share_metrics(self, counters: dict) -> None:
        """Hand this HTTP process's counters to the others (through the engine's process)."""
        try:
            self._send(("metrics", counters))
        except OSError:
            pass

    # ------------------------------------------------------------------ internals
    def _send(self, message) -> None:
        with self._send_lock:
            self._out.send(message)

    def _deliver(self, batch) -> None:
        if batch and self.deliver is not None:
            self.deliver(batch)

    def _gone(self) -> WorkerFailure:
        return WorkerFailure("the engine's process has stopped; restart cyb serve", 500)

    def _ended(self) -> None:
        """The reader thread has seen the engine's last message (or its end)."""

    def _read(self) -> None:
        """The reader thread: hand each message of the engine to its owner."""
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
                elif kind == "peer":
                    self.peers[message[1]] = message[2]
                elif kind == "scored":
                    future = self._scores.pop(message[1], None)
                    if future is not None:
                        settle(future, result=message[2], exception=message[3])
                elif kind == "stopped":
                    break
        except (EOFError, OSError):
            pass
        self.alive = False
        self._ended()
        failure = WorkerFailure("the server stopped", 503) if self._stopping else self._gone()
        if not self._stopping:
            log.error("cyb serve: %s", failure.message)
        pending = [job for job, _ in jobs.values()]
        jobs.clear()
        self._deliver([(job, failure) for job in pending])
        for future in list(self._scores.values()):
            settle(future, exception=RuntimeError(failure.message))
        self._scores.clear()
        if not self._stopping and self.on_end is not None:
            self.on_end()


class EngineProcess(EngineLink):
    """The engine in a child process, seen from the main HTTP process (see the module docstring).

    Args:
        loader: a picklable callable with no arguments that returns the
            :class:`~.served.ServedModel` (called in the child: the model is loaded there only).
        slots: rows that decode at once (None: 256 on CUDA, 64 elsewhere).
        cache_bytes: the engine's cache memory (None: its default).
        engine_options: other :class:`cyb.engine.EngineOptions` fields (picklable; None: the
            defaults).
        deliver: called from a reader thread with each step's ``[(job, items)]``, as
            :class:`~.worker.EngineWorker` calls it; may be set after :meth:`start`.
        links: HTTP processes the engine answers (this one included); the ends of the others'
            links are :attr:`spare_links` after :meth:`start`, ``(receive, send)`` each.
    """

    def __init__(self, loader: Callable, *, slots: int | None = None, cache_bytes: int | None = None,
                 engine_options: dict | None = None, deliver: Callable[[list], None] | None = None,
                 links: int = 1) -> None:
        super().__init__(deliver=deliver)
        if not isinstance(links, int) or links < 1:
            raise ValueError(f"links must be an integer >= 1, got {links!r}")
        self._loader, self._slots_wanted, self._cache_bytes, self._links = loader, slots, cache_bytes, links
        self._engine_options = dict(engine_options or {})
        self.spare_links: list[tuple] = []
        self._proc = None

    def start(self, timeout: float | None = None) -> "EngineProcess":
        """Start the child and wait until it has loaded the model and built the engine; raises
        ValueError (the model cannot be served: the loader's message) or RuntimeError."""
        import torch

        ctx = multiprocessing.get_context("spawn")  # CUDA cannot live in a forked child
        ours, theirs = [], []  # (receive, send) here; (inbox, outbox) in the child
        for _ in range(self._links):
            from_child, child_out = ctx.Pipe(duplex=False)
            child_in, to_child = ctx.Pipe(duplex=False)
            ours.append((from_child, to_child))
            theirs.append((child_in, child_out))
        self._proc = ctx.Process(target=_engine_main, name="cyb-engine", daemon=True,
                                 args=(self._loader, self._slots_wanted, self._cache_bytes, self._engine_options,
                                       torch.get_num_threads(),
                                       [t[0] for t in theirs], [t[1] for t in theirs]))
        self._proc.start()
        for inbox, outbox in theirs:
            inbox.close()
            outbox.close()
        (self._conn, self._out), self.spare_links = ours[0], ours[1:]
        from_child = self._conn
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
        return self.start_reading()

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

    def _gone(self) -> WorkerFailure:
        code = self._proc.exitcode if self._proc is not None else None
        return WorkerFailure(f"the engine's process exited (code {code}); restart cyb serve", 500)

    def _ended(self) -> None:
        self._proc.join(5)


__all__ = ["Decided", "EngineLink", "EngineProcess", "STATE_PERIOD_S"]
