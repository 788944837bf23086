"""The engine's KV cache: one row of columns per slot, preallocated, written where each row is.

:class:`SlotCache` owns everything the engine keeps per column of a slot: every layer's keys
and values in ``[slots, kv_heads, capacity + scratch, head_dim]`` buffers, and, where the
model needs them, which columns hold pauses (gated pauses: attention adds the layer's gate to
other tokens' pauses) and each column's rotary position (private pauses under sliding windows:
windows count positions).  :meth:`SlotCache.move` moves all of it at once.  It speaks the
cache protocol of Hugging Face decoders (each attention layer calls :meth:`SlotCache.update`
with its new keys and values and attends to what it returns), and the runner tells it, before
each forward, where the new positions go (:meth:`for_decode`, :meth:`for_prefill`):

* a decoding step covers rows ``0 .. n-1``; row ``b`` writes its ``Q`` new positions at columns
  ``cols[b] .. cols[b] + Q - 1`` and attends over columns ``0 .. limit-1`` of its own row (the
  mask says which of them it may see);
* a prefill forward covers some rows (slots) of any index; each writes a chunk of its prompt
  at its own columns.

Rows that are not decoding write into the *scratch* columns past ``capacity``, which no
attention limit reaches.  Every shape and address is fixed, so a decoding step can be captured
as a CUDA graph.
"""

from __future__ import annotations

import torch

from ..model import hf


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


class SlotCache:
    """Keys and values of ``slots`` rows of ``capacity`` columns (plus ``scratch``) per layer.

    Args:
        model: the :class:`cyb.PauseModel` whose layers it serves (shapes, dtype, device).
        slots: rows.
        capacity: columns a row may fill.
        scratch: extra columns past ``capacity`` where rows that are not decoding write (at
            least the positions a step feeds per row).
    """

    is_compileable = True  # fixed shapes and addresses

    def __init__(self, model, slots: int, capacity: int, scratch: int, *, pause_tags: bool = False,
                 column_positions: bool = False) -> None:
        if slots < 1 or capacity < 1 or scratch < 1:
            raise ValueError(f"slots, capacity and scratch must be >= 1, got {slots}, {capacity}, {scratch}")
        layers, kv_heads, head_dim = kv_shape(model)
        self.slots, self.capacity, self.scratch = slots, capacity, scratch
        width = capacity + scratch
        shape = (slots, kv_heads, width, head_dim)
        device, dtype = model.device, model.dtype
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        #: ``[slots, width]`` bool: which columns hold pauses (``pause_tags``), else None
        self.tags = torch.zeros(slots, width, dtype=torch.bool, device=device) if pause_tags else None
        #: ``[slots, width]`` long: each column's rotary position (``column_positions``), else None
        self.col_pos = torch.zeros(slots, width, dtype=torch.long, device=device) if column_positions else None
        self._rows: torch.Tensor | None = None  # prefill: the slots written; decode: None (rows 0..n-1)
        self._write_rows: torch.Tensor | None = None
        self._write_cols: torch.Tensor | None = None
        self._fresh = False  # prefill: the chunk attends to itself only
        self._n = 0
        self.limit = capacity
        #: ``0 .. slots-1`` on the device (rows of a decoding step)
        self.row_index = torch.arange(slots, device=device)

    @classmethod
    def for_model(cls, model, slots: int, capacity: int, scratch: int) -> "SlotCache":
        """The cache ``model`` (a :class:`cyb.PauseModel`) decodes with: pause tags for gated
        pauses, column positions for private pauses in a model with sliding-window layers."""
        visibility = model.pause_visibility
        return cls(model, slots, capacity, scratch, pause_tags=visibility == "gated",
                   column_positions=visibility == "private" and hf.has_sliding_window(model.config))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def for_decode(self, n: int, cols: torch.Tensor, limit: int) -> None:
        """The next forward is a decoding step of rows ``0 .. n-1`` writing at ``cols [n, Q]``
        and attending over columns ``0 .. limit-1``."""
        self._rows, self._n, self.limit, self._fresh = None, n, limit, False
        self._write_rows = self.row_index[:n].unsqueeze(1).expand_as(cols)
        self._write_cols = cols

    def for_prefill(self, rows: torch.Tensor, cols: torch.Tensor, limit: int, *, fresh: bool = False) -> None:
        """The next forward writes a chunk of rows (slots) ``rows [r]`` at ``cols [r, C]`` and
        attends over columns ``0 .. limit-1`` of those rows; with ``fresh`` (each row's chunk
        is its first, written from column 0) over the chunk's own keys and values only, as the
        layers hand them over (nothing is read back from the cache)."""
        self._rows, self._n, self.limit = rows, int(rows.shape[0]), limit
        self._write_rows = rows.unsqueeze(1).expand_as(cols)
        self._write_cols = cols
        self._fresh = fresh

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[n, kv_heads, Q, dim]`` keys and values where the plan says and return the rows'
        first :attr:`limit` columns, ``[n, kv_heads, limit, dim]``."""
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k[self._write_rows, :, self._write_cols] = key_states.transpose(1, 2).to(k.dtype)
        v[self._write_rows, :, self._write_cols] = value_states.transpose(1, 2).to(v.dtype)
        if self._rows is None:
            return k[:self._n, :, :self.limit], v[:self._n, :, :self.limit]
        if self._fresh:
            return key_states, value_states
        return k[:, :, :self.limit].index_select(0, self._rows), v[:, :, :self.limit].index_select(0, self._rows)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # positions and masks are explicit; nothing reads this

    def per_slot(self) -> list[torch.Tensor]:
        """Every tensor that holds per-column state (first dimension: the slots)."""
        extra = [t for t in (self.tags, self.col_pos) if t is not None]
        return self.keys + self.values + extra

    def move(self, src: list[int], dst: list[int], columns: int) -> None:
        """Rows ``src``'s first ``columns`` columns (keys and values of every layer, tags and
        positions) go to rows ``dst`` (``src[i]`` to ``dst[i]``; no slot in both lists): one
        gather and one scatter per tensor, whatever the number of rows."""
        from .rows import to_device

        src_idx, dst_idx = to_device([src, dst], torch.long, self.keys[0].device)
        for t in self.per_slot():
            part = t[:, :, :columns] if t.dim() == 4 else t[:, :columns]
            part.index_copy_(0, dst_idx, part.index_select(0, src_idx))

__all__ = ["SlotCache", "bytes_per_column", "kv_shape"]
