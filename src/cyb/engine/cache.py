"""The engine's KV cache: a pool of blocks of columns, and a block table per slot.

:class:`PagedCache` owns everything the engine keeps per column:

* every layer's keys and values in pools of ``[num_blocks, kv_heads, block_size, head_dim]``;
  logical column ``c`` of slot ``s`` lives at block ``table[s, c // block_size]``, offset
  ``c % block_size``.  Which blocks a slot holds is decided on the host
  (:class:`cyb.engine.blocks.BlockPool`, :mod:`cyb.engine.paging`); the table lives on the device
  at a fixed address, and the host's changes reach it in one copy before each forward
  (:meth:`set_blocks`, :meth:`flush`).  Entries a slot does not hold point to the null block
  (:data:`cyb.engine.blocks.NULL_BLOCK`), where the writes of rows that are not decoding land;
* per slot and logical column, where the model needs them: which columns hold pauses (gated
  pauses: attention adds the layer's gate to other tokens' pauses) and each column's rotary
  position (private pauses under sliding windows: windows count positions).  These are a few
  bytes a column, kept per slot as they are read (:meth:`move` moves them with a slot's table).

It speaks the cache protocol of Hugging Face decoders (each attention layer calls
:meth:`PagedCache.update` with its new keys and values and attends to what it returns), and the
runner tells it, before each forward, where the new positions go (:meth:`for_decode`,
:meth:`for_prefill`, :meth:`for_mixed`):

* a decoding step covers rows (slots) ``0 .. n-1``; row ``b`` writes its ``Q`` new positions at
  logical columns ``cols[b] .. cols[b] + Q - 1``, and attends either over columns
  ``0 .. limit-1`` of its own row gathered from the pool (the mask says which of them it may
  see), or, with ``pools``, through the block table (:mod:`cyb.kernels.row_attention`);
* a prefill forward covers some rows (slots) of any index; each writes a chunk of its row at its
  own columns;
* a mixed step is both in one sequence: the decoding step's positions, then the prompt chunks',
  attending through the block tables.

Rows that are not decoding write into the *scratch* columns past ``capacity``, whose table
entries always point to the null block.  Every shape and address is fixed, so a decoding step
can be captured as a CUDA graph.
"""

from __future__ import annotations

import torch

from ..model import hf
from ..model.attention import paged_rows
from .blocks import NULL_BLOCK


def kv_shape(model) -> tuple[int, int, int]:
    """``(layers, kv_heads, head_dim)`` of a pause model's attention, from its config."""
    cfg = hf.text_config(model.config)
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = getattr(cfg, "head_dim", None) or int(cfg.hidden_size) // heads
    return int(cfg.num_hidden_layers), kv_heads, int(head_dim)


def bytes_per_column(model, dtype: torch.dtype | None = None) -> int:
    """Bytes one column of one row costs in every layer (keys and values)."""
    layers, kv_heads, head_dim = kv_shape(model)
    size = torch.empty((), dtype=dtype or model.dtype).element_size()
    return 2 * layers * kv_heads * head_dim * size


def _staged(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host tensor ``t`` on ``device`` without the host waiting (pinned first on CUDA)."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


class PagedCache:
    """Keys and values of ``num_blocks`` blocks of ``block_size`` columns per layer, and the
    block tables of ``slots`` rows of ``capacity`` columns (plus ``scratch``).

    Args:
        model: the :class:`cyb.PauseModel` whose layers it serves (shapes, dtype, device).
        slots: rows.
        capacity: columns a row may fill (a multiple of ``block_size``).
        scratch: extra columns past ``capacity`` where rows that are not decoding write (at
            least the positions a step feeds per row).
        num_blocks: blocks of the pool, the null block included.
        block_size: columns per block.
        pause_tags, column_positions: keep per-column pause tags, positions.
    """

    is_compileable = True  # fixed shapes and addresses

    def __init__(self, model, slots: int, capacity: int, scratch: int, num_blocks: int, block_size: int, *,
                 pause_tags: bool = False, column_positions: bool = False) -> None:
        if slots < 1 or capacity < 1 or scratch < 1 or num_blocks < 2 or block_size < 1:
            raise ValueError(f"slots, capacity, scratch and block_size must be >= 1 and num_blocks >= 2, got "
                             f"{slots}, {capacity}, {scratch}, {block_size}, {num_blocks}")
        if capacity % block_size:
            raise ValueError(f"capacity ({capacity}) must be a multiple of block_size ({block_size})")
        layers, kv_heads, head_dim = kv_shape(model)
        self.slots, self.capacity, self.scratch = slots, capacity, scratch
        self.num_blocks, self.block_size = num_blocks, block_size
        device, dtype = model.device, model.dtype
        self.device = device
        shape = (num_blocks, kv_heads, block_size, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        #: table entries per row: the capacity and the scratch columns (which stay null)
        self.table_width = -(-(capacity + scratch) // block_size)
        #: ``[slots, table_width]`` long: each row's blocks (:data:`NULL_BLOCK` where it holds none)
        self.table = torch.full((slots, self.table_width), NULL_BLOCK, dtype=torch.long, device=device)
        width = self.table_width * block_size
        #: ``[slots, width]`` bool: which columns hold pauses (``pause_tags``), else None
        self.tags = torch.zeros(slots, width, dtype=torch.bool, device=device) if pause_tags else None
        #: ``[slots, width]`` long: each column's rotary position (``column_positions``), else None
        self.col_pos = torch.zeros(slots, width, dtype=torch.long, device=device) if column_positions else None
        self._pending: dict[tuple[int, int], int] = {}  # (slot, entry) -> block, not on the device yet
        self._write: tuple[torch.Tensor, torch.Tensor] | None = None  # (blocks, offsets) of the next writes
        self._read: torch.Tensor | None = None  # the block table rows the forward reads
        self._pools = False  # attention reads the pools through the table
        self._fresh = False  # prefill: the chunk attends to itself only
        self.limit = capacity
        #: ``0 .. slots-1`` on the device (rows of a decoding step)
        self.row_index = torch.arange(slots, device=device)

    @classmethod
    def for_model(cls, model, slots: int, capacity: int, scratch: int, num_blocks: int,
                  block_size: int) -> "PagedCache":
        """The cache ``model`` (a :class:`cyb.PauseModel`) decodes with: pause tags for gated
        pauses, column positions for private pauses in a model with sliding-window layers."""
        visibility = model.pause_visibility
        return cls(model, slots, capacity, scratch, num_blocks, block_size, pause_tags=visibility == "gated",
                   column_positions=visibility == "private" and hf.has_sliding_window(model.config))

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values (every layer's pools)."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    # ------------------------------------------------------------------ block tables
    def set_blocks(self, slot: int, first: int, blocks: list[int]) -> None:
        """Entries ``first, first + 1, ...`` of ``slot``'s table become ``blocks`` (on the device
        at the next :meth:`flush`)."""
        for i, b in enumerate(blocks, first):
            self._pending[(slot, i)] = b

    def clear(self, slot: int, count: int) -> None:
        """``slot``'s first ``count`` entries point to the null block again."""
        self.set_blocks(slot, 0, [NULL_BLOCK] * count)

    def flush(self) -> None:
        """Copy the table entries changed since the last flush to the device (one copy; the host
        does not wait)."""
        if not self._pending:
            return
        from .rows import to_device

        keys = list(self._pending)
        values = to_device([[s for s, _ in keys], [i for _, i in keys], list(self._pending.values())],
                           torch.long, self.device)
        self._pending = {}
        self.table[values[0], values[1]] = values[2]

    def write_columns(self, slot: int, is_pause: torch.Tensor | None, positions: torch.Tensor) -> None:
        """Per-column tags and positions of ``slot``'s first columns (a row's prefill, before any
        forward writes them; ``is_pause``: None under pauses that are not gated)."""
        c = positions.shape[0]
        if c == 0:
            return
        if self.tags is not None:
            self.tags[slot, :c] = _staged(is_pause, self.device)
        if self.col_pos is not None:
            self.col_pos[slot, :c] = _staged(positions, self.device)

    # ------------------------------------------------------------------ a forward's plan
    def for_decode(self, n: int, cols: torch.Tensor, limit: int, *, pools: bool = False) -> None:
        """The next forward is a decoding step of rows ``0 .. n-1`` writing at ``cols [n, Q]``
        and attending over columns ``0 .. limit-1`` (gathered; ``pools``: the pools are handed to
        attention as they are, which reads them through the table)."""
        table = self.table[:n]
        self._write = (table.gather(1, cols // self.block_size), cols % self.block_size)
        self._read = table[:, :-(-limit // self.block_size)]
        self.limit, self._pools, self._fresh = limit, pools, False

    def for_prefill(self, rows: torch.Tensor, cols: torch.Tensor, limit: int, *, fresh: bool = False) -> None:
        """The next forward writes a chunk of rows (slots) ``rows [r]`` at ``cols [r, C]`` and
        attends over columns ``0 .. limit-1`` of those rows; with ``fresh`` (each row's chunk
        is its first, written from column 0) over the chunk's own keys and values only, as the
        layers hand them over (nothing is read back from the cache)."""
        table = self.table.index_select(0, rows)
        self._write = (table.gather(1, cols // self.block_size), cols % self.block_size)
        self._read = table[:, :-(-limit // self.block_size)]
        self.limit, self._pools, self._fresh = limit, False, fresh

    def for_mixed(self, n: int, cols: torch.Tensor, slots: torch.Tensor, chunk_slots: torch.Tensor,
                  chunk_cols: torch.Tensor) -> torch.Tensor:
        """The next forward is a mixed step of one sequence ``[1, T]``: a decoding step of rows
        ``0 .. n-1`` writing at ``cols [n, Q]`` (its first ``n x Q`` positions), then prompt
        chunks, position ``n x Q + j`` of which writes at column ``chunk_cols[j]`` of slot
        ``chunk_slots[j]``; attention reads the pools through the table rows this returns:
        ``[n + r, B]``, rows ``0 .. n-1``'s and then those of ``slots [r]`` (the chunks' rows in
        turn)."""
        bs = self.block_size
        table = self.table
        decode = table[:n].gather(1, cols // bs).reshape(-1)
        chunks = table[chunk_slots, chunk_cols // bs]
        self._write = (torch.cat([decode, chunks]).unsqueeze(0),
                       torch.cat([(cols % bs).reshape(-1), chunk_cols % bs]).unsqueeze(0))
        self._read = None
        self.limit, self._pools, self._fresh = self.capacity, True, False
        return torch.cat([table[:n], table.index_select(0, slots)])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[n, kv_heads, Q, dim]`` keys and values where the plan says and return what
        attention reads: the rows' first :attr:`limit` columns ``[n, kv_heads, limit, dim]``, the
        chunk itself (a fresh prefill) or the pools (the plan's ``pools``)."""
        k, v = self.keys[layer_idx], self.values[layer_idx]
        blocks, offsets = self._write
        k[blocks, :, offsets] = key_states.transpose(1, 2).to(k.dtype)
        v[blocks, :, offsets] = value_states.transpose(1, 2).to(v.dtype)
        if self._pools:
            return k, v
        if self._fresh:
            return key_states, value_states
        limit = self.limit
        return paged_rows(k, self._read)[:, :, :limit], paged_rows(v, self._read)[:, :, :limit]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # positions and masks are explicit; nothing reads this

    def move(self, src: list[int], dst: list[int], columns: int) -> None:
        """Rows ``src``'s per-column tags and positions (their first ``columns`` columns) go to
        rows ``dst`` (``src[i]`` to ``dst[i]``; no slot in both lists): one gather and one
        scatter per tensor, whatever the number of rows.  Their tables move on the host
        (:meth:`set_blocks`): blocks stay where they are."""
        from .rows import to_device

        extra = [t for t in (self.tags, self.col_pos) if t is not None]
        if not extra:
            return
        src_idx, dst_idx = to_device([src, dst], torch.long, self.device)
        for t in extra:
            part = t[:, :columns]
            part.index_copy_(0, dst_idx, part.index_select(0, src_idx))


__all__ = ["PagedCache", "bytes_per_column", "kv_shape"]
