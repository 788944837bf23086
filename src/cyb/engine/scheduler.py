"""Which request runs where: the queue, the slots, admission, prefill chunks, preemption and
compaction.

Host-side bookkeeping only (no tensors): a request waits in a queue until a slot is free and its
first blocks of cache fit (the engine's ``place``, :meth:`Scheduler.admit`); it then holds that
slot while its prompt is written in chunks (:meth:`Scheduler.next_prefill`: several prompts per
forward, a bounded number of positions each, so that a long prompt does not stall the rows
already decoding; or :meth:`Scheduler.mixed_chunks`: inside the decoding steps, under a budget
of positions per step) and while it decodes; when it finishes its slot is free again.  When the cache
runs out of blocks, the row admitted last is preempted (:meth:`Scheduler.preempt`): it goes back
to the head of the queue, to be written again from its columns when it is admitted again.  New
requests take the lowest free slot, and when nothing waits the decoding rows are packed into the
lowest slots (:meth:`Scheduler.compaction`), so that a decoding step covers as few rows as
possible.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from .layout import Prefill
from .requests import Request


@dataclass(eq=False)
class Tracked:
    """What the host knows of one request.

    Attributes:
        id: the request's id.
        request: the :class:`~cyb.engine.requests.Request`.
        prefill: its prompt columns (:class:`~cyb.engine.layout.Prefill`).
        slot: the slot it holds (None while waiting).
        written: prompt columns written so far.
        tokens: new tokens reported so far.
        positions: positions that went through the network so far (prompt included).
        first_step: the engine's step count when it started decoding.
        finished: why it ended (``"eos"``, ``"length"``, ``"stop"``, ...), None while running.
        most: the most columns its row may reach (its longest answer, a step's slack included).
        blocks: the cache blocks its row holds, in column order (:mod:`cyb.engine.paging`).
        keys: the prefix keys of its prompt's full blocks (:func:`cyb.engine.blocks.block_hashes`;
            None until looked up).
        registered: how many of its first blocks it has offered to the prefix cache.
        decided, used: the tokens it decided and the columns each one's block kept (what a
            preempted row is written again from: :meth:`cyb.engine.layout.RowLayout.prefill`).
        epoch: how many times it was preempted (a step launched before that reports nothing).
        order: when it was admitted (the row admitted last is preempted first).
    """

    id: int
    request: Request
    prefill: Prefill
    slot: int | None = None
    written: int = 0
    tokens: int = 0
    positions: int = 0
    first_step: int = 0
    finished: str | None = None
    state: str = field(default="waiting")  # waiting, prefilling, decoding, done
    most: int = 0
    blocks: list = field(default_factory=list)
    keys: list | None = None
    registered: int = 0
    decided: list = field(default_factory=list)
    used: list = field(default_factory=list)
    epoch: int = 0
    order: int = 0

    @property
    def prefill_left(self) -> int:
        return self.prefill.columns - self.written


class Scheduler:
    """Slots and queues of an engine with ``slots`` rows of ``capacity`` columns.

    Args:
        prefill_chunk: prompt columns one row writes per prefill forward at most.
        prefill_rows: a prefill forward computes at most ``prefill_rows x prefill_chunk``
            positions, padding included.
        shape: ``(rows, chunk, first chunks) -> (rows, chunk)`` that a prefill forward of
            ``rows`` rows of at most ``chunk`` columns computes, padding included (the runner's
            :meth:`~cyb.engine.runner.Runner.prefill_shape`); None: as given.
    """

    def __init__(self, slots: int, *, prefill_chunk: int, prefill_rows: int, shape=None) -> None:
        self.slots = slots
        self.prefill_chunk, self.prefill_rows = prefill_chunk, prefill_rows
        self._shape = shape or (lambda rows, chunk, fresh: (rows, chunk))
        self.waiting: deque[Tracked] = deque()
        self.prefilling: list[Tracked] = []
        self.decoding: dict[int, Tracked] = {}  # slot -> request
        self._free = list(range(slots))
        #: changes whenever a row starts or stops decoding or moves
        self.version = 0
        self._held_since: int | None = None  # when admission began to hold a startable request
        self._admitted = 0  # admissions so far (each row's order)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding)

    def add(self, t: Tracked) -> None:
        self.waiting.append(t)

    def admit(self, group: int = 1, wait: int = 0, now: int = 0, place=None) -> list[Tracked]:
        """Give free slots to waiting requests, first come first served; they start prefill.

        While rows decode, requests start in groups of at least ``group`` (as many as are free
        slots and waiting requests together), written by a few large prefill forwards rather
        than one small forward after nearly every step; a smaller group starts once a request
        could have started (a free slot, a waiting request) for ``wait`` calls, ``now`` counting
        them (the engine's step).  With no row decoding every waiting request that fits starts.
        ``place(request) -> bool`` gives the request at the head of the queue its first blocks
        of cache, or says they do not fit: admission then stops (None: everything fits)."""
        startable = min(len(self._free), len(self.waiting))
        if not startable:
            self._held_since = None
            return []
        if self.decoding and startable < group:
            if self._held_since is None:
                self._held_since = now
            if now - self._held_since < wait:
                return []
        self._held_since = None
        admitted = []
        while self.waiting and self._free:
            t = self.waiting[0]
            if place is not None and not place(t):
                break
            self.waiting.popleft()
            t.slot, t.state = heapq.heappop(self._free), "prefilling"
            self._admitted += 1
            t.order = self._admitted
            self.prefilling.append(t)
            admitted.append(t)
        return admitted

    def next_prefill(self) -> tuple[list[Tracked], int] | None:
        """The rows of the next prefill forward and its chunk length ``C`` (each row writes
        ``min(C, what it has left)`` columns), or None when no prompt is left to write.  Rows
        are taken longest remainder first while the forward, padded as it runs (``shape``),
        stays within ``prefill_rows x prefill_chunk`` positions (``C``: the longest remainder
        among them, at most ``prefill_chunk``; a single row always fits): rows of similar length
        share a forward, so little of it is padding, and many short prompts fit in one.  A
        forward holds either first chunks only (every row from column 0: their attention reads
        nothing of the cache) or later chunks only, as its first row does."""
        budget = self.prefill_rows * self.prefill_chunk
        batch, chunk = [], 0
        for t in sorted(self.prefilling, key=lambda t: -t.prefill_left):
            if t.prefill_left <= 0:
                break
            fresh = t.written == 0
            if batch and fresh != (batch[0].written == 0):
                continue
            c = max(chunk, min(self.prefill_chunk, t.prefill_left))
            if batch:
                rows, width = self._shape(len(batch) + 1, c, fresh)
                if rows * width > budget:
                    break
            batch.append(t)
            chunk = c
        return (batch, chunk) if batch else None

    def mixed_chunks(self, budget: int) -> list[tuple[Tracked, int]]:
        """The prompt chunks a mixed step carries (a decoding step that writes prompts in the
        same forward): ``(row, columns)`` pairs, rows admitted first going first, together at
        most ``budget`` columns (each row writes ``min(what is left of it, what is left of
        the budget)``; none when ``budget < 1``)."""
        chunks = []
        for t in sorted(self.prefilling, key=lambda t: t.order):
            if budget < 1:
                break
            take = min(t.prefill_left, budget)
            if take > 0:
                chunks.append((t, take))
                budget -= take
        return chunks

    def ready(self) -> list[Tracked]:
        """Requests whose prompt is written: they move to decoding."""
        done = [t for t in self.prefilling if t.prefill_left == 0]
        if done:
            self.prefilling = [t for t in self.prefilling if t.prefill_left > 0]
            for t in done:
                t.state = "decoding"
                self.decoding[t.slot] = t
            self.version += 1
        return done

    def release(self, t: Tracked) -> None:
        """``t`` leaves (finished or aborted): its slot is free."""
        self._leave(t)
        t.state = "done"

    def preempt(self, t: Tracked) -> None:
        """``t`` (prefilling or decoding) gives its slot back and waits again, at the head of the
        queue (so that rows preempted one after another are admitted again oldest first)."""
        if t.state not in ("prefilling", "decoding"):
            raise ValueError(f"only a running request can be preempted, not a {t.state} one")
        self._leave(t)
        t.slot, t.state = None, "waiting"
        self.waiting.appendleft(t)

    def _leave(self, t: Tracked) -> None:
        if t.state == "waiting":
            self.waiting.remove(t)
        elif t.state == "prefilling":
            self.prefilling.remove(t)
        elif t.state == "decoding":
            del self.decoding[t.slot]
            self.version += 1
        if t.slot is not None and t.state != "done":
            heapq.heappush(self._free, t.slot)

    def youngest(self) -> Tracked | None:
        """The running request (prefilling or decoding, not finished) admitted last, or None."""
        running = [t for t in (*self.decoding.values(), *self.prefilling) if t.finished is None]
        return max(running, key=lambda t: t.order, default=None)

    def rows(self) -> int:
        """Rows a decoding step must cover: the highest decoding slot + 1 (0 when none)."""
        return max(self.decoding) + 1 if self.decoding else 0

    def compaction(self, bucket) -> list[tuple[Tracked, int]]:
        """Moves ``(request, new slot)`` that pack the decoding rows lower, when nothing waits
        or prefills and ``bucket`` (rows -> rows a step covers) would cover fewer rows after
        them.  The caller moves the rows' cache and state, then calls :meth:`moved`."""
        if self.waiting or self.prefilling or not self.decoding:
            return []
        count = len(self.decoding)
        if bucket(self.rows()) <= bucket(count):
            return []
        moves = []
        free = sorted(s for s in self._free if s < count)
        for src in sorted(self.decoding, reverse=True):
            if src < count or not free:
                break
            moves.append((self.decoding[src], free.pop(0)))
        return moves

    def moved(self, t: Tracked, dst: int) -> None:
        del self.decoding[t.slot]
        self._free.remove(dst)
        heapq.heapify(self._free)
        heapq.heappush(self._free, t.slot)
        t.slot = dst
        self.decoding[dst] = t
        self.version += 1


__all__ = ["Scheduler", "Tracked"]
