"""The engine: rows that advance on their own and come and go.

::

    from cyb.engine import Engine, EngineOptions, Request

    engine = Engine.sized_for(model, requests)          # or Engine(model, capacity=..., slots=...)
    ids = [engine.submit(r) for r in requests]
    while engine.busy:
        for event in engine.step():                     # cyb.engine.Emitted, as tokens are decided
            ...

Each :meth:`Engine.step` admits waiting requests into free slots, writes a chunk of their
prompts (:mod:`cyb.engine.scheduler`), runs one decoding step over the decoding rows
(:mod:`cyb.engine.runner`), and reports what the step before decided: on CUDA the host reads a
step's decisions while the next step already runs, so a row that finishes runs one step more
(its output is dropped) and its slot is free one step later.  Every row feeds ``Q`` positions
per step: one (adaptive mode's computation: a token that needs no pause costs one position,
each pause one more, and no row waits for another) or a whole block of ``M``
(:func:`choose_positions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from ..model import hf
from .cache import SlotCache, bytes_per_column
from .layout import RowLayout
from .readout import RowReadout, SamplingKind
from .requests import Emitted, Request
from .rows import OUT_FIXED_COLUMNS, Rows
from .runner import Runner
from .scheduler import Scheduler, Tracked

POSITIONS = ("auto", "one", "block")
#: without CUDA graphs attention covers the columns in use rounded up to this
EAGER_BUCKET = 16
#: on CUDA, adaptive decoding of at most this many rows feeds whole blocks: a forward of M
#: positions costs about what one of a single position costs there (on an H100, 134 M model:
#: blocks as fast or faster up to 32 rows at E[S] 1.1 and 1.9; from 256 rows one position per
#: step was 1.4x faster at E[S] 1.1, blocks 1.2x faster at E[S] 1.9; docs/benchmarks.md)
BLOCK_MAX_ROWS = 32


@dataclass(frozen=True)
class EngineOptions:
    """How an engine runs (defaults are the library's).

    Attributes:
        max_slots: rows that decode at once at most.
        cache_bytes: memory for the KV cache; None: 60% of the free memory on CUDA, 2 GiB
            elsewhere.  Slots are cut to what fits.
        positions: positions each row feeds per step: ``"one"``, ``"block"`` (``M``: the token
            and all its pauses; adaptive rows keep the steps up to their stop) or ``"auto"``
            (:func:`choose_positions`).
        prefill_chunk: prompt columns one row writes per prefill forward at most.  On an H200
            (134 M model, a mixed load) chunks of 2048 made continuous batching with shared
            pauses 1.29x faster than chunks of 512: a shared prompt of up to 512 tokens then
            prefills in one graphed forward (``benchmarks/engine_traffic.py``).
        prefill_rows: a prefill forward computes at most ``prefill_rows x prefill_chunk``
            positions, padding included (rows are padded to the longest chunk among them, and
            where prefill runs from CUDA graphs, to its graph's shape).  While rows decode, every
            one of them waits for that forward: on an H200 (134 M model, 256 rows of a mixed
            load) 4,096 positions per forward held the p99 gap between tokens at 2.9x its median
            where 8,192 gave 4.3x, at the same throughput (``benchmarks/engine_gaps.py``).
        refill: while rows decode, waiting prompts start in groups of this many (as many as
            free slots and waiting prompts allow; 0: an eighth of the slots in use), written by
            a few large prefill forwards; 1 starts each prompt as soon as a slot is free (more
            and smaller prefill forwards: a mixed load decodes at about half the rate).
        refill_wait: a smaller group starts once a prompt could have started for this many
            steps (the time to first token a group may add, in decoding steps).
        cuda_graph: capture decoding steps as CUDA graphs (None: on CUDA).
        attention_bucket: with CUDA graphs, attention covers the columns in use rounded up to a
            multiple of this (one graph each), for batches of ``bucket_min_rows`` rows or more;
            smaller ones cover the whole capacity.  Without graphs it covers the columns in
            use rounded up to 16.
        capacity_multiple: columns per row are rounded up to a multiple of this.
        row_attention: decoding steps attend over each row's own columns through a Triton kernel
            (a step costs the columns its rows hold, and one CUDA graph serves every length);
            None: on CUDA where the model allows it (:func:`cyb.engine.runner.row_attention_reason`),
            False: through the mask, up to the attention limit above.
        fused: decoding steps and graphed prefill forwards run the model's norms, gated MLPs and
            rotary embedding compiled into fused kernels (:mod:`cyb.engine.fused`; on an H200 a
            token of a 134 M model at batch 1 took 0.85 ms where it took 1.41); None: where steps
            are CUDA graphs.
        read_at: an ablation: every token is read out at this step, whatever the model's dk
            says (1: no pause taken, the pauses removed at inference; ``M``: every pause taken;
            the reported ``d`` stays the model's own, fixed-mode rows still feed all pauses);
            None: the model's own decisions.
    """

    max_slots: int = 256
    cache_bytes: int | None = None
    positions: str = "auto"
    prefill_chunk: int = 2048
    prefill_rows: int = 2
    refill: int = 0
    refill_wait: int = 16
    cuda_graph: bool | None = None
    attention_bucket: int = 256
    bucket_min_rows: int = 8
    capacity_multiple: int = 128
    row_attention: bool | None = None
    fused: bool | None = None
    read_at: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_slots", "prefill_chunk", "prefill_rows", "attention_bucket", "bucket_min_rows",
                     "capacity_multiple"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        if not isinstance(self.refill, int) or isinstance(self.refill, bool) or self.refill < 0:
            raise ValueError(f"refill must be an integer >= 0 (0: an eighth of the slots in use), got {self.refill!r}")
        if not isinstance(self.refill_wait, int) or isinstance(self.refill_wait, bool) or self.refill_wait < 0:
            raise ValueError(f"refill_wait must be an integer >= 0 (steps), got {self.refill_wait!r}")
        if self.read_at is not None and (not isinstance(self.read_at, int) or isinstance(self.read_at, bool)
                                         or self.read_at < 1):
            raise ValueError(f"read_at must be a step >= 1 or None, got {self.read_at!r}")
        for name in ("row_attention", "fused"):
            if not isinstance(getattr(self, name), (bool, type(None))):
                raise ValueError(f"{name} must be True, False or None, got {getattr(self, name)!r}")
        if self.cache_bytes is not None and (not isinstance(self.cache_bytes, int) or self.cache_bytes < 1):
            raise ValueError(f"cache_bytes must be a positive integer or None, got {self.cache_bytes!r}")


def unsupported_reason(model) -> str | None:
    """Why the engine cannot run ``model`` (a :class:`cyb.PauseModel`), or None."""
    impl = hf.attention_of(model.hf_model)
    if impl not in (None, "sdpa", "eager", hf.PAUSE_ATTENTION):
        return f"the engine needs sdpa or eager attention, the model uses {impl!r}"
    return None


def choose_positions(model, modes, rows: int, choice: str = "auto") -> int:
    """Positions per row per step: ``M`` when every request is fixed mode (it feeds every
    pause anyway) or, on CUDA, for at most :data:`BLOCK_MAX_ROWS` rows; else 1."""
    m = model.vocab.num_steps
    if choice == "one":
        return 1
    if choice == "block" or m == 1:
        return m
    if all(mode == "fixed" for mode in modes):
        return m
    return m if model.device.type == "cuda" and rows <= BLOCK_MAX_ROWS else 1


def default_cache_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.6)
    return 2 << 30


class Engine:
    """Continuous batching of a pause model's requests (see the module docstring).

    Args:
        model: a :class:`cyb.PauseModel` in eval mode, on its device.
        capacity: columns per row: the most a request may fill (its prompt's columns and every
            decoded block; :meth:`sized_for` computes it).
        slots: rows that decode at once (cut to the memory budget).
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
        mult = opts.capacity_multiple
        self.capacity = -(-(capacity + self.slack) // mult) * mult
        budget = opts.cache_bytes or default_cache_bytes(model.device)
        per_row = (self.capacity + self.q) * bytes_per_column(model)
        fit = budget // per_row
        if fit < 1:
            raise ValueError(f"the KV cache budget of {budget / 2**20:.0f} MiB holds no row of "
                             f"{self.capacity} columns ({per_row / 2**20:.1f} MiB): raise cache_bytes "
                             "or lower max_new_tokens / the prompt length")
        self.slots = max(1, min(slots, opts.max_slots, fit))
        self.cache = SlotCache.for_model(model, self.slots, self.capacity, scratch=self.q)
        limit = getattr(hf.text_config(model.config), "max_position_embeddings", None)
        self._position_limit = limit if isinstance(limit, int) else None
        device = model.device
        self.rows = Rows(self.layout, RowReadout(model.vocab, model.dk_bias, device, opts.read_at), self.slots,
                         self.capacity, self.capacity + self.q - 1,
                         limit - 1 if isinstance(limit, int) else None, device)
        graphs = opts.cuda_graph if opts.cuda_graph is not None else device.type == "cuda"
        self.runner = Runner(model, self.cache, self.rows, cuda_graph=graphs, row_attention=opts.row_attention,
                             prefill_chunk=opts.prefill_chunk, fused=opts.fused)
        self.scheduler = Scheduler(self.slots, prefill_chunk=opts.prefill_chunk, prefill_rows=opts.prefill_rows,
                                   shape=self.runner.prefill_shape)
        self.lookahead = device.type == "cuda"
        self._tracked: dict[int, Tracked] = {}
        self._next_id = 0
        self._pending = None  # the launched step whose decisions are not read yet
        self._roster: _Roster | None = None
        self._max_real = 0  # private pauses: the most real columns a decoding row has
        self._to_stop: list[Tracked] = []
        #: on CUDA, two pinned buffers that steps' outputs are copied into in turn: step N + 1 is
        #: launched (with its copy) before step N's output is read, so one buffer would race
        self._host_out = ([torch.empty((self.slots, OUT_FIXED_COLUMNS + m), dtype=torch.float32, pin_memory=True)
                           for _ in range(2)] if device.type == "cuda" else None)
        #: counters: decoding steps, positions fed by them (active rows only), prefill positions
        self.stats = {"steps": 0, "decode_positions": 0, "prefill_positions": 0, "prefill_forwards": 0}

    @classmethod
    def sized_for(cls, model, requests: list[Request], *, options: EngineOptions | None = None) -> "Engine":
        """An engine whose rows fit the longest of ``requests`` and whose slots are as many as
        the requests (at most ``options.max_slots``, and what the memory budget holds)."""
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
        once per process)."""
        self.capture_prefill()
        runner = self.runner
        if not runner.use_graph:
            return
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
        t = Tracked(rid, request, self.layout.prefill(list(request.prompt)))
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
        prefill counted from submission)."""
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

    # ------------------------------------------------------------------ the loop
    def step(self) -> list[Emitted]:
        """One iteration (see the module docstring); returns the tokens decided."""
        with torch.inference_mode():
            self._stop_finished()
            self._admit_and_prefill()
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
            self.scheduler.release(t)
            self._tracked.pop(t.id, None)

    def _stop_finished(self) -> None:
        if not self._to_stop:
            return
        self.rows.stop([t.slot for t in self._to_stop])
        for t in self._to_stop:
            self.scheduler.release(t)
            self._tracked.pop(t.id, None)
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

    def _admit_and_prefill(self) -> None:
        sched = self.scheduler
        group = self.options.refill or max(1, self.slots_in_use // 8)
        sched.admit(group, self.options.refill_wait, self.stats["steps"])
        while True:
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
        pinned = self.model.device.type == "cuda"  # staged: the host does not wait (rows.to_device)
        ids = torch.zeros((r, chunk), dtype=torch.long, pin_memory=pinned)
        pos = torch.zeros((r, chunk), dtype=torch.long, pin_memory=pinned)
        cols = torch.full((r, chunk), self.capacity, dtype=torch.long, pin_memory=pinned)  # padding: scratch
        end = 0
        for i, t in enumerate(batch):
            n = min(chunk, t.prefill_left)
            a = t.written
            ids[i, :n] = t.prefill.ids[a:a + n]
            pos[i, :n] = t.prefill.positions[a:a + n]
            cols[i, :n] = torch.arange(a, a + n)
            t.written += n
            end = max(end, a + n)
            self.stats["prefill_positions"] += n
        # (prefill runs eagerly: nothing is captured per limit, so it covers the columns in use)
        self.runner.prefill([t.slot for t in batch], ids, pos, cols,
                            min(-(-end // EAGER_BUCKET) * EAGER_BUCKET, self.capacity), fresh=fresh)
        self.stats["prefill_forwards"] += 1

    def _start(self, ready: list[Tracked]) -> None:
        for t in ready:
            t.first_step = self.stats["steps"]
        reqs = [t.request for t in ready]
        self.rows.start(
            [t.slot for t in ready], [t.prefill.first_token for t in ready],
            [t.prefill.first_position for t in ready], [t.prefill.columns for t in ready],
            [r.key for r in reqs], [r.mode == "fixed" for r in reqs], [r.greedy for r in reqs],
            [float(r.temperature) if r.temperature > 0 else 1.0 for r in reqs], [r.top_k for r in reqs],
            [float(r.top_p) for r in reqs])

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
        self.cache.move(src, dst, min(max(self._bound(t) for t, _ in moves) + self.q, self.capacity))
        self.rows.move(src, dst)
        for t, d in moves:
            self.scheduler.moved(t, d)

    def _bound(self, t: Tracked) -> int:
        """A column no position of ``t``'s row has reached yet at its next step."""
        return self.layout.column_bound(t.prefill.columns, self.stats["steps"] - t.first_step, self.q,
                                        t.prefill.columns + t.tokens)

    def _sampling_kind(self, roster: list[Tracked]) -> SamplingKind:
        sampled = [t.request for t in roster if not t.request.greedy]
        if not sampled:
            return SamplingKind()
        top_k = max(r.top_k for r in sampled)
        if top_k:
            k = 1
            while k < top_k:
                k *= 2
            top_k = k
        return SamplingKind(True, top_k, any(r.top_p < 1 for r in sampled))

    def _make_roster(self) -> "_Roster":
        sched = self.scheduler
        rows = list(sched.decoding.values())
        self._max_real = max(t.prefill.columns + t.tokens for t in rows)
        return _Roster(sched.version, rows, np.array([t.slot for t in rows], dtype=np.int64),
                       self._rows_bucket(sched.rows()), self._sampling_kind(rows),
                       max(t.prefill.columns - t.first_step * self.q for t in rows))

    def _launch(self):
        sched = self.scheduler
        if not sched.decoding:
            return None
        if self._roster is None or self._roster.version != sched.version:  # rows came or went
            self._roster = self._make_roster()
        ros = self._roster
        bound = self.layout.column_bound(ros.base, self.stats["steps"], self.q, self._max_real)  # covers every row
        self.runner.decode(ros.n, self.q, self._limit(bound + self.q, ros.n), ros.kind)
        self.stats["steps"] += 1
        self.stats["decode_positions"] += len(ros.rows) * self.q
        if self._host_out is None:
            return self.rows.out[:ros.n], ros, None
        host = self._host_out[self.stats["steps"] % 2][:ros.n]
        host.copy_(self.rows.out[:ros.n], non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return host, ros, done

    def _collect(self, launched) -> list[Emitted]:
        """The tokens of a launched step: only the rows that emitted cost Python work."""
        out, ros, done = launched
        if done is not None:
            done.synchronize()
        values = out.numpy()
        hits = np.flatnonzero(values[ros.slots, 0])
        m, events = self.layout.num_steps, []
        per_step = self.q == 1
        rows, most, emitted = ros.rows, self._max_real, events.append
        for k, row in zip(hits.tolist(), values[ros.slots[hits]].tolist()):
            t = rows[k]
            if t.finished is not None:
                continue
            steps = int(row[2])
            r = t.request
            fixed = r.mode == "fixed"
            t.positions += m if (fixed or not per_step) else steps
            tokens = t.tokens = t.tokens + 1
            if t.prefill.columns + tokens > most:
                most = t.prefill.columns + tokens
            token = int(row[1])
            reason = "eos" if token in r.eos else ("length" if tokens >= r.max_new_tokens else None)
            emitted(Emitted(t.id, tokens - 1, token, steps, tuple(row[OUT_FIXED_COLUMNS:]),
                            row[3] if fixed else None, t.positions, reason))
            if reason is not None:
                t.finished = reason
                self._finish(t)
        self._max_real = most
        return events


class _Roster(NamedTuple):
    """The decoding rows as they stand since the scheduler's ``version``: the rows, their slots,
    the rows a step covers, what their readout needs, and ``max(prefill columns - first step x
    Q)`` (with the step count, the bound of every row's columns)."""

    version: int
    rows: list
    slots: np.ndarray
    n: int
    kind: SamplingKind
    base: int


__all__ = ["BLOCK_MAX_ROWS", "Engine", "EngineOptions", "POSITIONS", "choose_positions", "unsupported_reason"]
