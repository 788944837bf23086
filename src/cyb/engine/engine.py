"""The engine: rows that advance on their own and come and go.

::

    from cyb.engine import Engine, EngineOptions, Request

    engine = Engine.sized_for(model, requests)          # or Engine(model, capacity=..., slots=...)
    ids = [engine.submit(r) for r in requests]
    while engine.busy:
        for event in engine.step():                     # cyb.engine.Emitted, as tokens are decided
            ...

Each :meth:`Engine.step` gives the decoding rows the cache blocks their next step may write
(preempting the row admitted last while none is free), admits waiting requests into free slots
as their first blocks fit (with prefix caching, a prompt's cached prefix is not written again),
writes a chunk of their prompts (:mod:`cyb.engine.scheduler`), runs one decoding step over the
decoding rows (:mod:`cyb.engine.runner`; with :attr:`EngineOptions.step_budget` the prompt chunks
go into that step's forward instead, a mixed step), and reports what the step before decided: on CUDA the
host reads a step's decisions while the next step already runs, so a row that finishes runs one
step more (its output is dropped) and its slot and blocks are free one step later.  Every row
feeds ``Q`` positions per step: one (adaptive mode's computation: a token that needs no pause
costs one position, each pause one more, and no row waits for another) or a whole block of
``M`` (:func:`choose_positions`).

A preempted row loses its blocks and waits at the head of the queue; admitted again, it is
written from every column it had (its prompt and its decided tokens' blocks as they were fed:
:meth:`cyb.engine.layout.RowLayout.prefill`) and goes on deciding with its random stream at the
same token: what it reports is what it would have reported without the preemption.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from ..model import hf
from .cache import PagedCache
from .layout import RowLayout
from .options import (BLOCK_MAX_ROWS, MIN_MIXED_CHUNK, POSITIONS, EngineOptions, choose_positions,
                      default_cache_bytes, unsupported_reason)
from .paging import Pager, pool_blocks
from .readout import RowReadout, SamplingKind, sampling_kind
from .requests import Emitted, Request
from .rows import OUT_FIXED_COLUMNS, Rows
from .runner import Runner
from .scheduler import Scheduler, Tracked

#: without CUDA graphs attention covers the columns in use rounded up to this
EAGER_BUCKET = 16


class Engine:
    """Continuous batching of a pause model's requests (see the module docstring).

    Args:
        model: a :class:`cyb.PauseModel` in eval mode, on its device.
        capacity: columns per row: the most a request may fill (its prompt's columns and every
            decoded block; :meth:`sized_for` computes it).
        slots: rows that decode at once (at most ``options.max_slots``); a row costs only the
            cache blocks it holds.
        positions: positions per row per step, 1 or ``M`` (None: one, or ``M`` for ``M = 1``).
        options: :class:`EngineOptions`.
    """

    def __init__(self, model, *, capacity: int, slots: int, positions: int | None = None,
                 options: EngineOptions | None = None) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the engine cannot run this model: {reason}")
        self.options = opts = options or EngineOptions()
        self.model = model
        self.layout = RowLayout.of(model.vocab, model.pause_visibility)
        m = self.layout.num_steps
        self.q = positions if positions is not None else (m if m == 1 else 1)
        if self.q not in (1, m):
            raise ValueError(f"positions per step must be 1 or M = {m}, got {self.q}")
        self.slack = 2 * self.q  # a finished row may run a step more before it stops
        self.block_size = bs = opts.block_size
        mult = math.lcm(opts.capacity_multiple, bs)
        self.capacity = -(-(capacity + self.slack) // mult) * mult
        self.slots = max(1, min(slots, opts.max_slots))
        #: blocks of the cache (the null block not counted)
        self.num_blocks = pool_blocks(opts, model, self.capacity, self.slots)
        self.prefix_caching = True if opts.prefix_caching is None else opts.prefix_caching
        self.cache = PagedCache.for_model(model, self.slots, self.capacity, self.q, self.num_blocks + 1, bs)
        limit = getattr(hf.text_config(model.config), "max_position_embeddings", None)
        self._position_limit = limit if isinstance(limit, int) else None
        device = model.device
        self.rows = Rows(self.layout, RowReadout(model.vocab, model.dk_bias, device, opts.read_at), self.slots,
                         self.capacity, self.capacity + self.q - 1,
                         limit - 1 if isinstance(limit, int) else None, device)
        graphs = opts.cuda_graph if opts.cuda_graph is not None else device.type == "cuda"
        self.runner = Runner(model, self.cache, self.rows, cuda_graph=graphs, row_attention=opts.row_attention,
                             prefill_chunk=opts.prefill_chunk, fused=opts.fused)
        #: prompts are written inside the decoding steps (:attr:`EngineOptions.step_budget`)
        self.mixing = opts.step_budget is not None
        if self.mixing and not self.runner.mixes:
            raise ValueError("step_budget needs row attention (CUDA with triton, sdpa attention); leave it unset "
                             "for this model")
        self.scheduler = Scheduler(self.slots, prefill_chunk=opts.prefill_chunk, prefill_rows=opts.prefill_rows,
                                   shape=self.runner.prefill_shape)
        self._tracked: dict[int, Tracked] = {}
        self._next_id = 0
        self._pending = None  # the launched step whose decisions are not read yet
        self._roster: _Roster | None = None
        self._to_stop: list[Tracked] = []
        #: per slot, what bounds the columns of a decoding row (:meth:`_bounds`): its prefill
        #: columns less its first step x Q, its columns as the host knows them, the columns its
        #: blocks hold, the most it may reach
        self._base, self._cols, self._held, self._most = (np.zeros(self.slots, dtype=np.int64) for _ in range(4))
        #: with lookahead, two host buffers (pinned on CUDA) that steps' outputs are copied into in
        #: turn: step N + 1 is launched (with its copy) before step N's output is read, so one
        #: buffer would race
        self._host_out = None
        self.lookahead = False
        self._set_lookahead(device.type == "cuda")
        #: counters: decoding steps, positions fed by them (active rows only), prefill positions
        #: and forwards, rows preempted, and prefix caching's (:class:`cyb.engine.paging.Pager`)
        self.stats = {"steps": 0, "decode_positions": 0, "prefill_positions": 0, "prefill_forwards": 0,
                      "mixed_steps": 0, "preemptions": 0}
        self.pager = Pager(self.cache, prefix_caching=self.prefix_caching, stats=self.stats)

    def _set_lookahead(self, on: bool) -> None:
        """Whether the host reads a step's decisions after launching the next (on CUDA, where
        the host then never waits for the device; elsewhere only the tests' check of it)."""
        self.lookahead = on
        cuda = self.model.device.type == "cuda"
        shape = (self.slots, OUT_FIXED_COLUMNS + self.layout.num_steps)
        self._host_out = [torch.empty(shape, dtype=torch.float32, pin_memory=cuda) for _ in range(2)] if on else None

    @classmethod
    def sized_for(cls, model, requests: list[Request], *, options: EngineOptions | None = None) -> "Engine":
        """An engine whose rows fit the longest of ``requests`` and whose slots are as many as
        the requests (at most ``options.max_slots``)."""
        options = options or EngineOptions()
        layout = RowLayout.of(model.vocab, model.pause_visibility)
        capacity = max(layout.columns_needed(len(r.prompt), r.max_new_tokens) for r in requests)
        q = choose_positions(model, [r.mode for r in requests], min(len(requests), options.max_slots),
                             options.positions)
        return cls(model, capacity=capacity, slots=len(requests), positions=q, options=options)

    def capture_prefill(self) -> int:
        """Capture every CUDA graph a prefill forward of first prompt chunks may need now (a
        server does at start: otherwise each is captured the first time it is needed, while
        every decoding row waits); returns how many were made (0 where prefill is not graphed)."""
        opts = self.options
        with torch.inference_mode():
            return self.runner.capture_prefill(opts.prefill_rows * opts.prefill_chunk, opts.prefill_chunk)

    def warm_up(self) -> None:
        """What a server does before its first request, so that no row waits for it later:
        capture every prefill graph (:meth:`capture_prefill`) and the decoding graphs that
        load will ask for.  Where steps attend per row, one graph serves every length, so each
        row bucket (1, 2, 4, ... up to the slots) is captured now: under load no step then
        waits for a capture.  Otherwise, where steps are fused, the graphs of one row and of
        two (compiling the fused kernels, which then serve every later capture: a few seconds
        once per process).  With a step budget, a mixed step of one row and one of every slot
        (into the scratch columns) compile the kernels that mixed steps run."""
        self.capture_prefill()
        runner = self.runner
        if not runner.use_graph:
            return
        if self.mixing:  # (mixed steps run eagerly: a small one and a full one compile their kernels)
            with torch.inference_mode():
                for n in sorted({1, self.slots}):
                    runner.warm_mixed(n, self.q, self._mixed_prompt_budget(n), SamplingKind())
        if runner.row_attention:
            counts = {self._rows_bucket(n) for n in range(1, self.slots + 1)}
        elif runner.fused:
            counts = {1, min(2, self.slots)}
        else:
            return
        with torch.inference_mode():
            for n in sorted(counts):
                runner.capture_decode(n, self.q, self._limit(self.capacity, n), SamplingKind())

    # ------------------------------------------------------------------ requests
    def submit(self, request: Request) -> int:
        """Queue ``request``; returns its id.  A request that can never fit a row is refused
        with a ValueError."""
        if not isinstance(request, Request):
            raise TypeError(f"submit takes a cyb.engine.Request, got {type(request).__name__}")
        self.layout.check_positions(len(request.prompt), request.max_new_tokens, self._position_limit)
        needed = self.layout.columns_needed(len(request.prompt), request.max_new_tokens)
        if needed + self.slack > self.capacity:
            raise ValueError(f"a prompt of {len(request.prompt)} tokens with max_new_tokens="
                             f"{request.max_new_tokens} needs {needed} cache columns; this engine's rows "
                             f"hold {self.capacity - self.slack}")
        rid = self._next_id
        self._next_id += 1
        t = Tracked(rid, request, self.layout.prefill(list(request.prompt)), most=needed + self.slack)
        t.positions = t.prefill.columns
        self._tracked[rid] = t
        self.scheduler.add(t)
        return rid

    def abort(self, rid: int, reason: str = "abort") -> None:
        """End request ``rid`` now (nothing more is reported for it); its slot is freed at the
        next step.  Unknown or finished ids are ignored."""
        t = self._tracked.get(rid)
        if t is None or t.finished is not None:
            return
        t.finished = reason
        self._finish(t)

    def positions(self, rid: int) -> int:
        """Positions of request ``rid`` that went through the network so far (its prompt's
        prefill counted from submission; columns written again after a preemption are not)."""
        return self._tracked[rid].positions

    @property
    def busy(self) -> bool:
        """Whether any request is waiting, prefilling, decoding, or has decisions not yet reported."""
        return self.scheduler.busy or self._pending is not None

    @property
    def slots_in_use(self) -> int:
        s = self.scheduler
        return len(s.decoding) + len(s.prefilling)

    @property
    def queued(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def free_blocks(self) -> int:
        """Cache blocks no row holds (cached prefixes among them)."""
        return self.pager.free

    @property
    def prefix_hit_rate(self) -> float | None:
        """Prompt blocks found in the prefix cache per block looked up (None: none looked up)."""
        looked = self.stats["prefix_lookup_blocks"]
        return self.stats["prefix_hit_blocks"] / looked if looked else None

    # ------------------------------------------------------------------ the loop
    def step(self) -> list[Emitted]:
        """One iteration (see the module docstring); returns the tokens decided."""
        with torch.inference_mode():
            self._stop_finished()
            preempted = self._grow()
            self._admit_and_prefill(not preempted)  # (no admission in a step that preempted)
            self._compact()
            launched = self._launch()
        events: list[Emitted] = []
        if self._pending is not None:
            events += self._collect(self._pending)
        self._pending = launched if self.lookahead else None
        if launched is not None and not self.lookahead:
            events += self._collect(launched)
        return events

    def run(self):
        """Step until no request is left, yielding every :class:`Emitted` as it comes."""
        while self.busy:
            yield from self.step()

    def _finish(self, t: Tracked) -> None:
        if t.state == "decoding":
            self._to_stop.append(t)  # the row stops before the next step
        else:
            self._release(t)

    def _release(self, t: Tracked) -> None:
        self.pager.release(t)
        self.scheduler.release(t)
        self._tracked.pop(t.id, None)

    def _stop_finished(self) -> None:
        if not self._to_stop:
            return
        self.rows.stop([t.slot for t in self._to_stop])
        for t in self._to_stop:
            self._release(t)
        self._to_stop = []

    def _limit(self, bound: int, rows: int) -> int:
        """Attention limit covering columns ``0 .. bound-1`` (see :class:`EngineOptions`).
        Without graphs nothing is captured per limit: it follows the columns in use closely."""
        opts = self.options
        if self.runner.row_attention:  # each row reads its own columns whatever the limit
            return self.capacity
        if not self.runner.use_graph:
            return min(-(-bound // EAGER_BUCKET) * EAGER_BUCKET, self.capacity)
        if rows < opts.bucket_min_rows:
            return self.capacity
        bucket = opts.attention_bucket
        return min(-(-bound // bucket) * bucket, self.capacity)

    # ------------------------------------------------------------------ blocks
    def _bounds(self, slots: np.ndarray) -> np.ndarray:
        """Per decoding slot, a column no position of its row has reached at the next step
        (:meth:`cyb.engine.layout.RowLayout.column_bound`, for many rows at once)."""
        return np.minimum(self._base[slots] + self.stats["steps"] * self.q,
                          self._cols[slots] + self.layout.bound_margin)

    def _grow(self) -> bool:
        """Give every decoding row the blocks its next step may write, oldest rows first,
        preempting the row admitted last while none is free; returns whether any was."""
        if not self.scheduler.decoding:
            return False
        ros = self._current_roster()
        need = np.minimum(self._bounds(ros.slots) + self.q, self._most[ros.slots])
        short = np.flatnonzero(need > self._held[ros.slots])
        if not short.size:
            return False
        preempted = False
        for k in sorted(short.tolist(), key=lambda k: ros.rows[k].order):
            t = ros.rows[k]
            if t.state != "decoding":  # preempted for an older row meanwhile
                continue
            while not self.pager.grow(t, int(need[k])):
                victim = self.scheduler.youngest()
                self._preempt(victim)
                preempted = True
                if victim is t:
                    break
            else:
                self._held[t.slot] = len(t.blocks) * self.block_size
        return preempted

    def _preempt(self, t: Tracked) -> None:
        """``t`` gives its blocks and slot back and waits at the head of the queue; a decoding
        row is written again from every column it had when it is admitted again."""
        if t.state == "decoding":
            self.rows.stop([t.slot])
            if t.decided:
                t.prefill = self.layout.prefill(list(t.request.prompt), t.decided, t.used)
        self.pager.release(t)
        self.scheduler.preempt(t)
        t.written = t.registered = 0
        t.epoch += 1
        self.stats["preemptions"] += 1

    def _place(self, t: Tracked) -> bool:
        """Admission's test: ``t``'s first blocks (its prefill and first step) fit."""
        return self.pager.place(t, min(t.prefill.columns + self.q, t.most), self.slots_in_use)

    # ------------------------------------------------------------------ prefill
    def _admit_and_prefill(self, admit: bool = True) -> None:
        sched = self.scheduler
        if admit:
            group = self.options.refill or max(1, self.slots_in_use // 8)
            for t in sched.admit(group, self.options.refill_wait, self.stats["steps"], place=self._place):
                self.pager.bind(t)
                self.cache.write_columns(t.slot, t.prefill.is_pause, t.prefill.positions)
        while not (self.mixing and sched.decoding):  # (else the decoding step writes the prompts)
            plan = sched.next_prefill()
            if plan is None:
                break
            self._prefill(*plan)
            if sched.decoding:  # one forward per step while rows decode: they are not stalled
                break
        ready = sched.ready()
        if ready:
            self._start(ready)

    def _prefill(self, batch: list[Tracked], chunk: int) -> None:
        r = len(batch)
        fresh = batch[0].written == 0  # (the scheduler does not mix first chunks with later ones)
        gated = self.layout.gated
        pinned = self.model.device.type == "cuda"  # staged: the host does not wait (rows.to_device)
        # ids, positions, columns (padding: scratch) and, gated, each column's start
        plan = torch.zeros((4 if gated else 3, r, chunk), dtype=torch.long, pin_memory=pinned)
        plan[2].fill_(self.capacity)
        end = 0
        for i, t in enumerate(batch):
            n = min(chunk, t.prefill_left)
            a = t.written
            p = t.prefill
            plan[0, i, :n] = p.ids[a:a + n]
            plan[1, i, :n] = p.positions[a:a + n]
            plan[2, i, :n] = torch.arange(a, a + n)
            if gated:
                plan[3, i, :n] = p.starts[a:a + n]
            t.written += n
            end = max(end, a + n)
            self.stats["prefill_positions"] += n
        self.cache.flush()
        # (prefill runs eagerly: nothing is captured per limit, so it covers the columns in use)
        self.runner.prefill([t.slot for t in batch], plan[0], plan[1], plan[2],
                            min(-(-end // EAGER_BUCKET) * EAGER_BUCKET, self.capacity), fresh=fresh,
                            starts=plan[3] if gated else None)
        self.stats["prefill_forwards"] += 1
        for t in batch:
            self.pager.written(t)

    def _start(self, ready: list[Tracked]) -> None:
        steps, q = self.stats["steps"], self.q
        for t in ready:
            t.first_step = steps
            c, s = t.prefill.columns, t.slot
            self._base[s], self._cols[s] = c - steps * q, c
            self._held[s], self._most[s] = len(t.blocks) * self.block_size, t.most
        reqs = [t.request for t in ready]
        self.rows.start(
            [t.slot for t in ready], [t.prefill.first_token for t in ready],
            [t.prefill.first_position for t in ready], [t.prefill.columns for t in ready],
            [r.key for r in reqs], [r.mode == "fixed" for r in reqs], [r.greedy for r in reqs],
            [float(r.temperature) if r.temperature > 0 else 1.0 for r in reqs], [r.top_k for r in reqs],
            [float(r.top_p) for r in reqs], [t.prefill.counter for t in ready])

    # ------------------------------------------------------------------ decoding
    def _rows_bucket(self, rows: int) -> int:
        """Rows a step covers for ``rows`` (graphs: the next power of two, at most the slots)."""
        if not self.runner.use_graph or rows == 0:
            return rows
        b = 1
        while b < rows:
            b *= 2
        return min(b, self.slots)

    def _compact(self) -> None:
        moves = self.scheduler.compaction(self._rows_bucket)
        if not moves:
            return
        src, dst = [t.slot for t, _ in moves], [d for _, d in moves]
        self.cache.move(src, dst, int(self._bounds(np.array(src)).max()) + self.q)
        self.rows.move(src, dst)
        for arr in (self._base, self._cols, self._held, self._most):
            arr[dst] = arr[src]
        for t, d in moves:
            old = t.slot
            self.scheduler.moved(t, d)
            self.pager.moved(t, old)

    def _current_roster(self) -> "_Roster":
        """The decoding rows as they stand (made again when rows came, went or moved)."""
        sched = self.scheduler
        ros = self._roster
        if ros is None or ros.version != sched.version:
            rows = list(sched.decoding.values())
            ros = self._roster = _Roster(sched.version, rows, np.array([t.slot for t in rows], dtype=np.int64),
                                         self._rows_bucket(sched.rows()), sampling_kind([t.request for t in rows]),
                                         [t.epoch for t in rows])
        return ros

    def _launch(self):
        if not self.scheduler.decoding:
            return None
        ros = self._current_roster()
        bound = int(self._bounds(ros.slots).max())  # covers every row
        chunks = self._mixed_chunks(len(ros.rows)) if self.mixing else []
        self.cache.flush()
        if chunks:
            self.runner.mixed(ros.n, self.q, ros.kind, *self._chunk_plan(chunks))
            self.stats["mixed_steps"] += 1
            for t, _ in chunks:
                self.pager.written(t)
        else:
            self.runner.decode(ros.n, self.q, self._limit(bound + self.q, ros.n), ros.kind)
        self.stats["steps"] += 1
        self.stats["decode_positions"] += len(ros.rows) * self.q
        if self._host_out is None:
            return self.rows.out[:ros.n], ros, None
        host = self._host_out[self.stats["steps"] % 2][:ros.n]
        host.copy_(self.rows.out[:ros.n], non_blocking=True)
        done = None
        if self.model.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        return host, ros, done

    def _mixed_prompt_budget(self, decoding: int) -> int:
        """Prompt positions a mixed step with ``decoding`` rows carries: what those rows leave
        of the step budget, at least :data:`MIN_MIXED_CHUNK`."""
        return max(self.options.step_budget - decoding * self.q, MIN_MIXED_CHUNK)

    def _mixed_chunks(self, decoding: int) -> list[tuple[Tracked, int]]:
        """The prompt chunks the next decoding step carries (:meth:`_mixed_prompt_budget`)."""
        return self.scheduler.mixed_chunks(self._mixed_prompt_budget(decoding))

    def _chunk_plan(self, chunks: list[tuple[Tracked, int]]):
        """``(slots, counts, ids, positions, columns, owners)`` of ``chunks`` (host tensors
        ``[P]``, the chunks in turn; ``owners``: each position's slot), each row's next columns,
        and under gated pauses ``starts`` (each position's token's first column); their rows
        count them as written."""
        pinned = self.model.device.type == "cuda"
        total = sum(c for _, c in chunks)
        gated = self.layout.gated
        plan = torch.empty((5 if gated else 4, total), dtype=torch.long, pin_memory=pinned)
        at = 0
        for t, c in chunks:
            a, p = t.written, t.prefill
            plan[0, at:at + c] = p.ids[a:a + c]
            plan[1, at:at + c] = p.positions[a:a + c]
            plan[2, at:at + c] = torch.arange(a, a + c)
            plan[3, at:at + c] = t.slot
            if gated:
                plan[4, at:at + c] = p.starts[a:a + c]
            t.written += c
            at += c
        self.stats["prefill_positions"] += total
        return [t.slot for t, _ in chunks], [c for _, c in chunks], *plan

    def _collect(self, launched) -> list[Emitted]:
        """The tokens of a launched step: only the rows that emitted cost Python work (rows
        preempted since it was launched report nothing: they decide those tokens again)."""
        out, ros, done = launched
        if done is not None:
            done.synchronize()
        values = out.numpy()
        hits = np.flatnonzero(values[ros.slots, 0])
        events: list[Emitted] = []
        m, real_only = self.layout.num_steps, self.layout.real_only
        per_step = self.q == 1
        rows, epochs, emitted = ros.rows, ros.epochs, events.append
        moved_slots, moved_cols = [], []  # the columns each row's token kept (RowLayout.used_columns)
        for k, row in zip(hits.tolist(), values[ros.slots[hits]].tolist()):
            t = rows[k]
            if t.finished is not None or t.epoch != epochs[k]:
                continue
            steps = int(row[2])
            r = t.request
            fixed = r.mode == "fixed"
            t.positions += m if (fixed or not per_step) else steps
            tokens = t.tokens = t.tokens + 1
            token = int(row[1])
            used = 1 if real_only else (m if fixed else steps)
            t.decided.append(token)
            t.used.append(used)
            moved_slots.append(t.slot)
            moved_cols.append(used)
            reason = "eos" if token in r.eos else ("length" if tokens >= r.max_new_tokens else None)
            emitted(Emitted(t.id, tokens - 1, token, steps, tuple(row[OUT_FIXED_COLUMNS:]),
                            row[3] if fixed else None, t.positions, reason))
            if reason is not None:
                t.finished = reason
                self._finish(t)
        if moved_slots:
            self._cols[moved_slots] += moved_cols  # (each slot once: a row decides one token a step)
        return events


class _Roster(NamedTuple):
    """The decoding rows as they stand since the scheduler's ``version``: the rows, their slots,
    the rows a step covers, what their readout needs, and each row's epoch (a row preempted
    since reports nothing of a step launched before)."""

    version: int
    rows: list
    slots: np.ndarray
    n: int
    kind: SamplingKind
    epochs: list


__all__ = ["BLOCK_MAX_ROWS", "Engine", "EngineOptions", "POSITIONS", "choose_positions", "default_cache_bytes",
           "unsupported_reason"]
