"""Running the model: one decoding step over the slots, and prefill forwards.

A decoding step feeds ``Q`` positions for each of rows ``0 .. n-1`` (:mod:`cyb.engine.rows`
says which), writes their keys and values into the :class:`~cyb.engine.cache.PagedCache`'s
blocks, attends over the first ``limit`` columns of each row (gathered from the blocks) with an
explicit 4-D mask (a position sees its row's columns up to its own), reads out and moves the
rows on.  Gated models also tag each
written column as a pause or not, and hand attention the other tokens' pauses of each row, where
the layer's gate is added (:mod:`cyb.model.attention`).

On CUDA, where the model allows it (:func:`row_attention_reason`), attention reads each row only
up to its own last column, through its block table (:func:`cyb.kernels.row_attention.row_attention`;
sliding windows cut in columns or positions as below) rather than every row up to ``limit``: a
step then costs the columns its rows hold.

On CUDA each ``(n, Q, limit, sampling kind)`` is captured once as a CUDA graph (after a warm-up
with every row pointed at the scratch columns) and replayed; the graphs share one memory pool.
Elsewhere the same step runs eagerly.  Nothing in a step is read back to the host.

A prefill forward writes a chunk of prompt columns for some rows (any slots): ``[r, C]`` ids
and positions, each row at its own columns, attending to what its row holds so far and to the
chunk causally, and reads nothing out.  A forward of first chunks (every row from column 0)
needs nothing from the cache: where no column is tagged or windowed it runs causal
self-attention over the chunk, on CUDA from a graph per bucket of rows and chunk length
(:func:`prefill_bucket`); other prefill forwards run eagerly with a mask.

A mixed step (:meth:`Runner.mixed`) is a decoding step and prompt chunks in one forward: every
position is a token of one ``[1, T]`` sequence, and attention reads each token's own row through
the block tables (:func:`cyb.kernels.row_attention.row_attention_varlen`).  It runs eagerly.
"""

from __future__ import annotations

import time
import warnings
from itertools import accumulate

import torch

from ..model import attention, hf
from ..runtime import growing_attention
from .cache import PagedCache
from .fused import fused_small_ops
from .readout import SamplingKind
from .rows import Rows, to_device

#: graphed prefill: a forward's rows are padded to a power of two up to PREFILL_ROWS_STEP, to a
#: multiple of it up to PREFILL_ROWS_LINEAR, then to a power of two; its chunk length to a multiple
#: of PREFILL_MIN_CHUNK, or of an eighth of the next power of two above it where that is more (at
#: most about a fifth of a chunk is padding).  A graph per pair: a few dozen for a server, captured
#: at start by :meth:`Runner.capture_prefill`.  Padding is computed for nothing: chunks in powers
#: of two made a prompt of 260 tokens cost one of 512, and rows in multiples of 8 made a lone
#: prompt cost eight.
PREFILL_ROWS_STEP = 8
PREFILL_ROWS_LINEAR = 32
PREFILL_MIN_CHUNK = 64


def _prefill_rows_bucket(rows: int) -> int:
    if rows <= PREFILL_ROWS_STEP:
        return 1 << (rows - 1).bit_length()
    if rows <= PREFILL_ROWS_LINEAR:
        return -(-rows // PREFILL_ROWS_STEP) * PREFILL_ROWS_STEP
    return 1 << (rows - 1).bit_length()


def _prefill_chunk_bucket(chunk: int) -> int:
    step = max(PREFILL_MIN_CHUNK, (1 << (chunk - 1).bit_length()) // 8)
    return -(-chunk // step) * step


def prefill_bucket(rows: int, chunk: int) -> tuple[int, int]:
    """The ``(rows, chunk)`` graph bucket a prefill forward of ``rows x chunk`` positions runs in
    (before the cap at the slots)."""
    return _prefill_rows_bucket(rows), _prefill_chunk_bucket(chunk)


def row_attention_reason(model, *, requested: bool = False) -> str | None:
    """Why decoding steps of ``model`` (a :class:`cyb.PauseModel`) cannot run the row attention
    kernel (:mod:`cyb.kernels.row_attention`), or None.  Off CUDA it runs only when
    ``requested`` and under ``TRITON_INTERPRET=1`` (the tests' CPU check of the kernel's path)."""
    from ..kernels import triton_available
    from ..kernels.chunk_ops import interpreting

    cfg = hf.text_config(model.config)
    if model.device.type != "cuda" and not (requested and interpreting()):
        return "it runs on CUDA only"
    if not triton_available():
        return "it needs triton"
    if hf.attention_of(model.hf_model) not in (None, "sdpa", hf.PAUSE_ATTENTION):
        return f"the model's attention is {hf.attention_of(model.hf_model)!r}, not sdpa"
    if getattr(cfg, "attn_logit_softcapping", None) is not None:
        return "the model softcaps its attention logits"
    from .cache import kv_shape

    if kv_shape(model)[2] > 256:
        return "its head dimension is above 256"
    return None


class Runner:
    """Steps and prefill of one model on one cache (see the module docstring).

    Args:
        model: a :class:`cyb.PauseModel` in eval mode.
        cache: its :class:`PagedCache`.
        rows: the slots' :class:`Rows`.
        cuda_graph: capture decoding steps as CUDA graphs (CUDA only).
        row_attention: decoding steps attend over each row's own columns (None: wherever
            :func:`row_attention_reason` allows; True where it does not raises a ValueError).
        prefill_chunk: the most columns a row writes per prefill forward.
        fused: capture decoding steps and graphed prefill forwards with the model's small operations
            compiled (:mod:`cyb.engine.fused`; None: where steps are graphed; True without graphs
            raises a ValueError).
    """

    def __init__(self, model, cache: PagedCache, rows: Rows, *, cuda_graph: bool,
                 row_attention: bool | None = None, prefill_chunk: int = 512, fused: bool | None = None) -> None:
        self.model, self.cache, self.rows = model, cache, rows
        self.decoder = model.decoder
        self.cache_arg = hf.cache_arg_name(self.decoder)
        self.additive = model.dtype if hf.is_eager(model.hf_model) else None
        self.layout = rows.layout
        self.m = self.layout.num_steps
        device = model.device
        self.device = device
        self.columns = torch.arange(cache.capacity + cache.scratch, device=device)
        #: gated models: which columns of each row hold pauses (the cache's tags)
        self.tags = cache.tags
        #: models with sliding-window layers: windows count columns (shared and gated pauses: the
        #: sequence as fed) or positions (private pauses: the real tokens, as in training), so a
        #: private row keeps each column's position (the cache's column positions)
        self.sliding = hf.has_sliding_window(model.config)
        self.col_pos = cache.col_pos
        if self.layout.gated != (self.tags is not None) or (
                self.sliding and self.layout.real_only) != (self.col_pos is not None):
            raise ValueError("the cache's per-column tags and positions do not match the model "
                             "(PagedCache.for_model builds the cache a model needs)")
        reason = row_attention_reason(model, requested=bool(row_attention))
        if row_attention and reason is not None:
            raise ValueError(f"row attention cannot run this model: {reason}")
        #: decoding steps attend over each row's own columns (the model's attention function
        #: then becomes :data:`cyb.model.attention.PAUSE_ATTENTION`, which reads ``pause_rows``)
        self.row_attention = reason is None and row_attention is not False and attention.use_pause_attention(
            model.hf_model)
        #: a prefill forward of fresh rows runs causal self-attention over its chunk: the model's
        #: attention function reads ``pause_causal``, and no column is tagged or windowed
        self.causal_prefill = (hf.attention_of(model.hf_model) == hf.PAUSE_ATTENTION and self.tags is None
                               and not self.sliding)
        #: decoding steps may carry prompt chunks in the same forward (:meth:`mixed`)
        self.mixes = self.row_attention
        self.use_graph = bool(cuda_graph)
        if self.use_graph and device.type != "cuda":
            raise ValueError("cuda_graph needs the model on a CUDA device")
        if fused and not self.use_graph:
            raise ValueError("fused kernels apply to decoding steps captured as CUDA graphs: set cuda_graph")
        #: decoding steps and graphed prefill forwards are captured with the model's small
        #: operations compiled
        self.fused = self.use_graph if fused is None else fused
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.capture_ms = 0.0
        #: graphed prefill of first chunks: static inputs that each replay is copied into (ids,
        #: positions, columns ``[slots, C]``, C the longest chunk in whole buckets; slots ``[slots]``)
        self._prefill_in = None
        if self.use_graph and self.causal_prefill:
            width = prefill_bucket(1, prefill_chunk)[1]
            self._prefill_in = tuple(torch.zeros(shape, dtype=torch.long, device=device)
                                     for shape in ((cache.slots, width),) * 3 + ((cache.slots,),))

    # ------------------------------------------------------------------ masks
    def _mask(self, cols: torch.Tensor, limit: int, pos: torch.Tensor, rows: torch.Tensor | None = None):
        """``[n, 1, Q, limit]``: a position at column ``c`` sees columns ``0 .. c`` of its row (bool,
        or additive for eager attention); for a model with sliding-window layers a dict of such
        masks per layer type, the windows cut in columns or positions (see ``__init__``).
        ``pos [n, Q]``: the positions fed; ``rows``: the slots (None: rows ``0 .. n-1``)."""
        keys = self.columns[:limit]
        allowed = keys.view(1, 1, limit) <= cols.unsqueeze(2)
        if not self.sliding:
            allowed = allowed.unsqueeze(1)
            if self.additive is None:
                return allowed
            zero = torch.zeros((), dtype=self.additive, device=cols.device)
            return torch.where(allowed, zero, torch.finfo(self.additive).min)
        if self.col_pos is None:  # windows in columns
            query, key = cols, keys.expand(cols.shape[0], limit)
        else:  # windows in positions
            key = (self.col_pos[:cols.shape[0]] if rows is None else self.col_pos.index_select(0, rows))[:, :limit]
            query = pos
        return attention.per_layer_masks(allowed, query, key, self.model.config, additive_dtype=self.additive)

    def _forward(self, ids, pos, mask, **extra) -> torch.Tensor:
        out = self.decoder(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                           **{self.cache_arg: self.cache}, **extra)
        return out.last_hidden_state

    # ------------------------------------------------------------------ decoding
    def _body(self, n: int, q: int, limit: int, kind: SamplingKind) -> None:
        rows = self.rows
        ids, pos, cols = rows.inputs(n, q)
        self.cache.for_decode(n, cols, limit, pools=self.row_attention)
        if self.col_pos is not None:
            self.col_pos[self.cache.row_index[:n].unsqueeze(1), cols] = pos
        extra = {}
        foreign = None
        if self.tags is not None:
            self.tags[self.cache.row_index[:n].unsqueeze(1), cols] = rows.is_pause_fed(n, q)
            earlier = self.columns[:limit].unsqueeze(0) < rows.real_col[:n].unsqueeze(1)
            foreign = self.tags[:n, :limit] & earlier
            if not self.row_attention:
                extra["pause_foreign"] = foreign.view(n, 1, 1, limit).expand(n, 1, q, limit)
        if self.row_attention:  # (rows that are not decoding see nothing: they read no column)
            last = torch.where(rows.active[:n].unsqueeze(1), cols, -1)
            # sliding windows in positions (private pauses): the queries' and the columns' own
            windows = (pos, self.col_pos) if self.col_pos is not None else (None, None)
            table = self.cache.table[:n, :limit // self.cache.block_size]  # (limit: the capacity)
            extra["pause_rows"] = (last, foreign, *windows, table)
        hidden = self._forward(ids, pos, self._mask(cols, limit, pos), **extra)
        rows.advance(n, self.model.logits(hidden), kind)

    def mixed(self, n: int, q: int, kind: SamplingKind, slots: list[int], counts: list[int], ids: torch.Tensor,
              pos: torch.Tensor, cols: torch.Tensor, owners: torch.Tensor, starts: torch.Tensor | None = None) -> None:
        """One decoding step of rows ``0 .. n-1`` (as :meth:`decode`) and prompt chunks of rows
        (slots) ``slots`` in one forward: the chunks' ``ids``/``pos``/``cols`` ``[P]`` (host
        tensors, pinned on CUDA, or device tensors) hold ``counts[i]`` columns of ``slots[i]`` in
        turn, ``owners [P]`` the slot of each and, under gated pauses, ``starts [P]`` the first
        column of each one's token (its own pauses get no gate).  Every position is one token of
        a ``[1, n x Q + P]`` sequence, attending over its own row through the block tables
        (:func:`cyb.kernels.row_attention.row_attention_varlen`); only the decoding rows are read
        out.  Runs eagerly (a step's shape follows its chunks) and needs :attr:`mixes`."""
        if not self.mixes:
            raise ValueError("mixed steps need row attention")
        if (self.tags is not None) != (starts is not None):
            raise ValueError("a gated model's mixed step needs each prompt position's start column (starts), "
                             "and only a gated model's")
        rows, dev = self.rows, self.device
        d_ids, d_pos, d_cols = rows.inputs(n, q)
        if self.col_pos is not None:  # (the chunks' column positions are in the cache already)
            self.col_pos[self.cache.row_index[:n].unsqueeze(1), d_cols] = d_pos
        c_ids, c_pos, c_cols, c_slots = (t.to(dev, non_blocking=True) for t in (ids, pos, cols, owners))
        slot_t = to_device(slots, torch.long, dev)
        table = self.cache.for_mixed(n, d_cols, slot_t, c_slots, c_cols)
        query_start = to_device([i * q for i in range(n + 1)] + [n * q + c for c in accumulate(counts)],
                                torch.int32, dev)
        last = torch.cat([torch.where(rows.active[:n].unsqueeze(1), d_cols, -1).reshape(-1), c_cols])
        flat_ids = torch.cat([d_ids.reshape(-1), c_ids]).unsqueeze(0)
        flat_pos = torch.cat([d_pos.reshape(-1), c_pos]).unsqueeze(0)
        key_pos = None
        if self.col_pos is not None:  # windows in positions: the queries' and the columns' own
            key_pos = torch.cat([self.col_pos[:n], self.col_pos.index_select(0, slot_t)])
        foreign = below = None
        if self.tags is not None:  # (the chunks' tags are in the cache already)
            self.tags[self.cache.row_index[:n].unsqueeze(1), d_cols] = rows.is_pause_fed(n, q)
            foreign = torch.cat([self.tags[:n], self.tags.index_select(0, slot_t)])
            # a decoding row's queries are all of its current token; a chunk's, each of its own
            below = torch.cat([rows.real_col[:n].unsqueeze(1).expand(n, q).reshape(-1),
                               starts.to(dev, non_blocking=True)])
        # (no bound on a row's queries: every step then shares one tile size and one compiled kernel)
        varlen = (last, query_start, foreign, below, flat_pos[0], key_pos, table, None)
        # (the mask is not read: attention goes through pause_varlen; a small one keeps the
        # decoder's mask handling as it is)
        mask = self._mask(last.clamp(min=0).unsqueeze(0), 1, flat_pos)
        with growing_attention(dev):
            hidden = self._forward(flat_ids, flat_pos, mask, pause_varlen=varlen)
        rows.advance(n, self.model.logits(hidden[0, :n * q].view(n, q, -1)), kind)

    def warm_mixed(self, n: int, q: int, chunk: int, kind: SamplingKind) -> None:
        """One mixed step of rows ``0 .. n-1`` and a chunk of ``chunk`` positions of slot 0, every
        position writing into the scratch columns (the null block) and the rows left as they were:
        run before the first request, it compiles the kernels the load's mixed steps will use
        (only a few variants serve every shape; see :mod:`cyb.kernels.triton_row_attention`)."""
        rows = self.rows
        saved = rows.snapshot()
        rows.active.zero_()
        span = max(1, rows.last_col + 1 - rows.scratch_col)
        cols = rows.scratch_col + torch.arange(chunk) % span
        zeros = torch.zeros(chunk, dtype=torch.long)
        self.mixed(n, q, kind, [0], [chunk], zeros, zeros, cols, zeros,
                   starts=cols if self.tags is not None else None)
        rows.restore(saved)

    def decode(self, n: int, q: int, limit: int, kind: SamplingKind) -> None:
        """One decoding step of rows ``0 .. n-1`` (:attr:`Rows.out` holds what it decided)."""
        if not self.use_graph:
            self._body(n, q, limit, kind)
            return
        key = (n, q, limit, kind)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self._capture(key)
        graph.replay()

    def capture_decode(self, n: int, q: int, limit: int, kind: SamplingKind) -> None:
        """Capture the graph of a decoding step of ``n`` rows (as :meth:`decode` would, without
        running it), unless it is captured already."""
        if (n, q, limit, kind) not in self.graphs:
            self._capture((n, q, limit, kind))

    def _capture(self, key: tuple) -> torch.cuda.CUDAGraph:
        rows = self.rows
        saved = rows.snapshot()
        rows.active.zero_()  # the warm-up writes into the scratch columns only
        graph = self._captured_fused(key, lambda: self._body(*key))
        rows.restore(saved)
        return graph

    def _captured_fused(self, key: tuple, body) -> torch.cuda.CUDAGraph:
        """:meth:`_captured`, with the model's small operations compiled where :attr:`fused` holds
        (a model whose code does not compile is captured as it is, with one warning, and
        :attr:`fused` turns off)."""
        if self.fused:
            try:
                with fused_small_ops(self.model):
                    return self._captured(key, body)
            except Exception as e:  # noqa: BLE001  (a model whose code does not compile: run it as it is)
                warnings.warn(f"the engine runs this model without fused kernels: compiling its norms, MLPs "
                              f"or rotary embedding failed ({type(e).__name__}: {e})", stacklevel=3)
                self.fused = False
                torch.cuda.synchronize(self.device)
        return self._captured(key, body)

    def _captured(self, key: tuple, body) -> torch.cuda.CUDAGraph:
        """``body`` run twice on a side stream (a warm-up: it must write only where nothing is
        read), then captured into a graph kept under ``key`` (every graph in one memory pool).
        :attr:`capture_ms` counts the capture alone: the work queued before it is waited for
        first."""
        torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        main = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            for _ in range(2):
                body()
        main.wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            body()
        self.graphs[key] = graph
        torch.cuda.synchronize(self.device)
        self.capture_ms += (time.perf_counter() - t0) * 1e3
        return graph

    # ------------------------------------------------------------------ prefill
    def prefill(self, slots: list[int], ids: torch.Tensor, pos: torch.Tensor, cols: torch.Tensor,
                limit: int, *, fresh: bool = False, starts: torch.Tensor | None = None) -> None:
        """Write prompt chunks: rows ``slots``, ``ids``/``pos``/``cols`` ``[r, C]`` (host tensors,
        pinned on CUDA, or device tensors; padding positions at a scratch column).  The rows'
        per-column tags and positions are in the cache already
        (:meth:`~cyb.engine.cache.PagedCache.write_columns`); under gated pauses ``starts
        [r, C]`` gives the column of each position's real token (it attends with the gate to the
        pauses before it).  ``fresh``: every row writes its first chunk from column 0 (padding
        only after its prompt); where :attr:`causal_prefill` holds, attention is then the
        chunk's causal self-attention (sdpa's causal kernels, no mask, no read of the cache),
        replayed from a CUDA graph per shape bucket where steps are graphed."""
        dev = self.device
        rows = to_device(slots, torch.long, dev)
        if fresh and self.causal_prefill:
            if self._prefill_in is not None:
                self._prefill_graphed(rows, ids, pos, cols)
            else:
                self._causal_prefill(rows, *(t.to(dev, non_blocking=True) for t in (ids, pos, cols)))
            return
        ids, pos, cols = (t.to(dev, non_blocking=True) for t in (ids, pos, cols))
        self.cache.for_prefill(rows, cols, limit)
        extra = {}
        if self.tags is not None:
            if starts is None:
                raise ValueError("a gated model's prefill needs each position's start column (starts)")
            starts = starts.to(dev, non_blocking=True)
            before = self.columns[:limit].view(1, 1, limit) < starts.unsqueeze(2)
            extra["pause_foreign"] = (self.tags.index_select(0, rows)[:, None, :limit] & before).unsqueeze(1)
        with growing_attention(self.device):  # (chunk shapes vary: no kernel that plans per shape)
            self._forward(ids, pos, self._mask(cols, limit, pos, rows), **extra)

    def _causal_prefill(self, rows: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor, cols: torch.Tensor) -> None:
        """A forward of first chunks: rows (slots) ``rows [r]`` write ``[r, C]`` positions (device
        tensors) and attend causally over them (see :meth:`prefill`)."""
        self.cache.for_prefill(rows, cols, self.cache.capacity, fresh=True)
        c = ids.shape[1]
        # (the layers take a 4-D mask as given; the attention function reads pause_causal instead)
        mask = torch.ones((c, c), dtype=torch.bool, device=self.device).tril_().expand(rows.shape[0], 1, c, c)
        with growing_attention(self.device):
            self._forward(ids, pos, mask, pause_causal=True)

    def _prefill_graphed(self, rows: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor, cols: torch.Tensor) -> None:
        """:meth:`_causal_prefill` replayed from a CUDA graph per bucket (:func:`prefill_bucket`,
        rows at most the slots): the inputs are copied into static buffers, whose other positions
        write to a scratch column."""
        r, c = ids.shape
        graph, (b_ids, b_pos, b_cols, b_rows) = self._prefill_graph(r, c)
        b_rows[:r].copy_(rows)
        for buf, given in ((b_ids, ids), (b_pos, pos), (b_cols, cols)):
            buf[:r, :c].copy_(given, non_blocking=True)
        graph.replay()

    def _prefill_graph(self, r: int, c: int):
        """The graph of the bucket of an ``r x c`` prefill forward (captured if new) and its static
        inputs, every position of them at a scratch column."""
        rb, cb = prefill_bucket(r, c)
        rb = min(rb, self.cache.slots)
        b_ids, b_pos, b_cols = (t[:rb, :cb] for t in self._prefill_in[:3])
        b_rows = self._prefill_in[3][:rb]

        def pad() -> None:  # every position of the bucket: row b's scratch column
            b_ids.zero_()
            b_pos.zero_()
            b_cols.fill_(self.cache.capacity)
            b_rows.copy_(self.cache.row_index[:rb])

        key = ("prefill", rb, cb)
        graph = self.graphs.get(key)
        if graph is None:
            pad()  # (the capture's warm-up runs on these inputs)
            graph = self._captured_fused(key, lambda: self._causal_prefill(b_rows, b_ids, b_pos, b_cols))
        pad()
        return graph, (b_ids, b_pos, b_cols, b_rows)

    def prefill_shape(self, rows: int, chunk: int, fresh: bool) -> tuple[int, int]:
        """The ``(rows, chunk)`` a prefill forward of ``rows`` rows of at most ``chunk`` columns
        computes, padding included: its graph's bucket where it is replayed from one (first
        chunks, see :meth:`prefill`), else as given."""
        if not (fresh and self._prefill_in is not None):
            return rows, chunk
        rb, cb = prefill_bucket(rows, chunk)
        return min(rb, self.cache.slots), cb

    def capture_prefill(self, budget: int, chunk: int) -> int:
        """Capture the graph of every bucket a prefill forward of first chunks can take when it
        computes at most ``budget`` positions (:meth:`prefill_shape`, padding included; a single
        row whatever its bucket) in chunks of at most ``chunk`` columns, so that none is
        captured while rows decode; returns the graphs made.  Does nothing where prefill is not
        graphed."""
        if self._prefill_in is None:
            return 0
        before = len(self.graphs)
        shapes = set()
        for c in range(1, chunk + 1):
            r = 1
            while r <= self.cache.slots:
                rb, cb = self.prefill_shape(r, c, True)
                if r > 1 and rb * cb > budget:
                    break
                shapes.add((rb, cb, r, c))
                r = prefill_bucket(r, c)[0] + 1
        for _, _, r, c in sorted(shapes):
            if ("prefill", *self.prefill_shape(r, c, True)) not in self.graphs:
                self._prefill_graph(r, c)
        return len(self.graphs) - before


__all__ = ["PREFILL_MIN_CHUNK", "PREFILL_ROWS_LINEAR", "PREFILL_ROWS_STEP", "Runner", "prefill_bucket"]

