"""Which cache blocks each row holds: admission, growth, release and prefix caching.

:class:`Pager` ties the host's :class:`~cyb.engine.blocks.BlockPool` to the rows
(:class:`~cyb.engine.scheduler.Tracked`, each with its list of blocks) and to the device's block
tables (:class:`~cyb.engine.cache.PagedCache`):

* :meth:`Pager.place`: a request about to be admitted takes the blocks of its prefill and of its
  first decoding step.  With prefix caching, the full blocks of its prompt columns that are
  cached already are taken as they are (their columns are not written again: the row's prefill
  starts after them); new blocks for the rest.  A request is admitted only if that leaves a
  reserve free (the engine's: a block for each running row, at least :data:`RESERVE` of the
  pool), so that the rows running can grow a while before one is preempted.  A request whose
  next uncached prompt block is being written by a row admitted earlier waits instead (admission
  stops there until that row's prefill has written it): requests that share a prefix and arrive
  together then write it once, not once each;
* :meth:`Pager.grow`: a decoding row takes more blocks before a step may write past the ones it
  holds (the engine preempts rows when none is free);
* :meth:`Pager.written`: after a prefill forward, the full blocks of prompt columns a row has
  written are offered to the prefix cache (the first block to hold a prefix keeps it);
* :meth:`Pager.release`: a row that ends or is preempted gives its blocks back (cached prefixes
  among them stay findable until their blocks are taken for something else).

Only prompt columns are shared, and only whole blocks of them: a row writes nothing before the
end of its prefill, so no row writes into a block another row reads.  Under private pauses a
row's pause columns sit after its real tokens, past its prompt, in blocks of its own.
"""

from __future__ import annotations

from .blocks import BlockPool, block_hashes
from .cache import PagedCache, bytes_per_column
from .options import EngineOptions, default_cache_bytes

#: blocks kept free when a request is admitted while others run: at least this share of the pool
#: (and one block)
RESERVE = 0.01


def pool_blocks(options: EngineOptions, model, capacity: int, slots: int) -> int:
    """Blocks of an engine's cache (the null block not counted): ``options.cache_blocks``, or what
    ``options.cache_bytes`` holds (the null block beside them), at most what ``slots`` rows of
    ``capacity`` columns hold.  A ValueError when one such row does not fit."""
    bs = options.block_size
    row = capacity // bs
    per_block = bs * bytes_per_column(model)
    if options.cache_blocks is not None:
        blocks, what = options.cache_blocks, f"cache_blocks={options.cache_blocks}"
    else:
        budget = options.cache_bytes or default_cache_bytes(model.device)
        blocks = min(budget // per_block, slots * row)
        what = f"the KV cache budget of {budget / 2**20:.0f} MiB"
    if blocks < row:
        raise ValueError(f"{what} holds no row of {capacity} columns ({row} blocks of {bs}, "
                         f"{row * per_block / 2**20:.1f} MiB): raise cache_bytes or lower max_new_tokens / "
                         "the prompt length")
    return blocks


class Pager:
    """Blocks of the rows of one engine (see the module docstring).

    Args:
        cache: the engine's :class:`~cyb.engine.cache.PagedCache` (its tables).
        prefix_caching: share full blocks of prompt columns between rows.
        stats: the engine's counters, where ``prefix_lookup_blocks`` (full prompt blocks looked
            up), ``prefix_hit_blocks`` (found cached), ``prefix_hit_columns`` (prompt columns not
            written again), ``prefix_evictions`` and ``prefix_waits`` (times admission waited
            for a prompt block another row was writing) are counted.
    """

    def __init__(self, cache: PagedCache, *, prefix_caching: bool, stats: dict) -> None:
        self.cache = cache
        self.pool = BlockPool(cache.num_blocks)
        self.block_size = cache.block_size
        self.prefix_caching = prefix_caching
        self.reserve = max(1, int(self.pool.usable * RESERVE))
        self.stats = stats
        #: keys of prompt blocks that rows hold but have not written yet -> how many such rows
        self.writing: dict[bytes, int] = {}
        for name in ("prefix_lookup_blocks", "prefix_hit_blocks", "prefix_hit_columns", "prefix_evictions",
                     "prefix_waits"):
            stats.setdefault(name, 0)

    def blocks_for(self, columns: int) -> int:
        """Blocks that hold ``columns`` columns."""
        return -(-columns // self.block_size)

    def _keys(self, t) -> list[bytes]:
        if t.keys is None:
            p = t.prefill
            t.keys = block_hashes(p.ids[:p.prompt_columns].tolist(), self.block_size) if self.prefix_caching else []
        return t.keys

    def place(self, t, columns: int, running: int) -> bool:
        """Give ``t`` (about to be admitted) blocks for its first ``columns`` columns (its
        prefill and first step), cached prefix blocks first; False when they do not fit with a
        reserve left free for the ``running`` rows (one block each, at least :attr:`reserve`;
        none when nothing runs), or when the first prompt block not cached is one that a running
        row is writing (``t`` finds it cached once that row's prefill has written it).  The
        prefix found counts as written (``t.written``)."""
        pool = self.pool
        keys = self._keys(t)
        hits = pool.lookup(keys)
        if len(hits) < len(keys) and keys[len(hits)] in self.writing:
            self.stats["prefix_waits"] += 1
            return False
        new = self.blocks_for(columns) - len(hits)
        if pool.free - pool.unheld(hits) - new < (max(self.reserve, running) if running else 0):
            return False
        pool.take(hits)
        t.blocks = hits + pool.allocate(new)
        t.written, t.registered = len(hits) * self.block_size, len(hits)
        for key in keys[len(hits):]:
            self.writing[key] = self.writing.get(key, 0) + 1
        stats = self.stats
        stats["prefix_lookup_blocks"] += len(keys)
        stats["prefix_hit_blocks"] += len(hits)
        stats["prefix_hit_columns"] += t.written
        stats["prefix_evictions"] = pool.evictions
        return True

    def bind(self, t) -> None:
        """``t``'s slot's table holds its blocks (after admission or a move)."""
        self.cache.set_blocks(t.slot, 0, t.blocks)

    def grow(self, t, columns: int) -> bool:
        """Give decoding row ``t`` blocks up to its first ``columns`` columns; False (nothing
        taken) when not enough are free."""
        new = self.blocks_for(columns) - len(t.blocks)
        if new <= 0:
            return True
        if new > self.pool.free:
            return False
        blocks = self.pool.allocate(new)
        self.cache.set_blocks(t.slot, len(t.blocks), blocks)
        t.blocks += blocks
        self.stats["prefix_evictions"] = self.pool.evictions
        return True

    def written(self, t) -> None:
        """Offer the full blocks of prompt columns ``t`` has written (``t.written``) to the
        prefix cache."""
        if not self.prefix_caching:
            return
        full = min(t.written, t.prefill.prompt_columns) // self.block_size
        for i in range(t.registered, full):
            self.pool.register(t.blocks[i], t.keys[i])
        self._written(t.keys[t.registered:full])
        t.registered = max(t.registered, full)

    def _written(self, keys: list[bytes]) -> None:
        """A row no longer has ``keys`` to write (written, or the row let go)."""
        for key in keys:
            left = self.writing[key] - 1
            if left:
                self.writing[key] = left
            else:
                del self.writing[key]

    def release(self, t, slot: int | None = None) -> None:
        """``t`` gives its blocks back; its slot's table (``slot``: another one it held) points
        to the null block again."""
        slot = t.slot if slot is None else slot
        if slot is not None:
            self.cache.clear(slot, len(t.blocks))
        if t.blocks and t.keys:
            self._written(t.keys[t.registered:])
            t.registered = len(t.keys)
        self.pool.release(t.blocks)
        t.blocks = []

    def moved(self, t, old_slot: int) -> None:
        """``t`` moved from ``old_slot`` to ``t.slot``: the tables follow (the blocks stay)."""
        self.cache.clear(old_slot, len(t.blocks))
        self.bind(t)

    @property
    def free(self) -> int:
        return self.pool.free


__all__ = ["Pager", "RESERVE", "pool_blocks"]
