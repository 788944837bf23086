"""The engine's blocks of cache columns, host side: which are free, who holds each, which hold a
cached prompt prefix (pure Python, no tensors).

The KV cache (:class:`cyb.engine.cache.PagedCache`) is a pool of blocks of ``block_size`` columns;
each row holds a list of them (its block table), taken as it grows and given back when it ends.
:class:`BlockPool` keeps:

* a reference count per block (a block of a cached prompt prefix may be held by several rows);
* the free blocks in least-recently-freed order (the front is taken first).  A free block may
  still hold a cached prefix: it stays findable until it is taken for something else (then its
  prefix is *evicted*).  Free blocks that hold no cached prefix go to the front, so that cached
  ones are taken last;
* the cached prefixes: full blocks of prompt columns, each keyed by :func:`block_hashes` (a
  digest of its column ids chained with its parent block's digest, so that a key stands for
  every column before it too; positions follow from the block's index).

Block 0 is the *null block*: never handed out, it is where block-table entries that a row does
not hold point (the writes of rows that are not decoding land there and nothing reads them).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

#: the block every unheld table entry points to
NULL_BLOCK = 0


def block_hashes(ids: list[int], block_size: int, salt: bytes = b"") -> list[bytes]:
    """The keys of the full blocks of ``ids`` (column ids from column 0): block ``i``'s key is a
    16-byte BLAKE2b digest of block ``i - 1``'s key (``salt`` for the first) and its
    ``block_size`` ids.  A trailing partial block has none."""
    data = array("q", ids).tobytes()
    width = block_size * 8
    keys, parent = [], salt
    for i in range(len(ids) // block_size):
        parent = hashlib.blake2b(parent + data[i * width:(i + 1) * width], digest_size=16).digest()
        keys.append(parent)
    return keys


class BlockPool:
    """``num_blocks`` blocks (the null block included; see the module docstring).

    Counters (read by the engine's stats): :attr:`evictions`, cached prefixes dropped to reuse
    their block.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"a block pool needs at least 2 blocks (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.refs = [0] * num_blocks
        self.key_of: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))
        self.evictions = 0

    @property
    def usable(self) -> int:
        """Blocks a row may ever hold (all but the null block)."""
        return self.num_blocks - 1

    @property
    def free(self) -> int:
        """Blocks not held by any row (cached prefixes among them)."""
        return len(self._free)

    def lookup(self, keys: list[bytes]) -> list[int]:
        """The blocks of the longest run of ``keys`` from the first that are cached (nothing
        changes: :meth:`take` them to hold them)."""
        found = []
        for key in keys:
            block = self.cached.get(key)
            if block is None:
                break
            found.append(block)
        return found

    def unheld(self, blocks: list[int]) -> int:
        """How many of ``blocks`` no row holds (taking them makes as many fewer blocks free)."""
        return sum(1 for b in blocks if self.refs[b] == 0)

    def take(self, blocks: list[int]) -> None:
        """Hold ``blocks`` (cached prefixes found by :meth:`lookup`) once more each."""
        for b in blocks:
            if self.refs[b] == 0:
                del self._free[b]
            self.refs[b] += 1

    def allocate(self, count: int) -> list[int]:
        """``count`` free blocks, each now held once, least recently freed first; a cached
        prefix in one of them is evicted.  Raises a RuntimeError when fewer are free."""
        if count > len(self._free):
            raise RuntimeError(f"{count} blocks asked for, {len(self._free)} free")
        out = []
        for _ in range(count):
            b, _ = self._free.popitem(last=False)
            key = self.key_of[b]
            if key is not None:
                del self.cached[key]
                self.key_of[b] = None
                self.evictions += 1
            self.refs[b] = 1
            out.append(b)
        return out

    def release(self, blocks: list[int]) -> None:
        """Give ``blocks`` (a row's table, in order) back once each.  A block no row holds any
        more becomes free: the last blocks of a row are freed first, so that under pressure they
        are evicted before the prefix they extend; one that holds no cached prefix goes to the
        front (it is taken first)."""
        for b in reversed(blocks):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self._free[b] = None
                if self.key_of[b] is None:
                    self._free.move_to_end(b, last=False)
            elif self.refs[b] < 0:
                raise RuntimeError(f"block {b} released more often than held")

    def register(self, block: int, key: bytes) -> bool:
        """Cache ``block`` (held, its columns written) under ``key``; False when another block
        holds that prefix already (this one then stays uncached)."""
        if key in self.cached or self.key_of[block] is not None:
            return False
        self.cached[key] = block
        self.key_of[block] = key
        return True


__all__ = ["BlockPool", "NULL_BLOCK", "block_hashes"]
