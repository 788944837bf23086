"""cyb.engine.blocks: the host's pool of cache blocks (reference counts, the free list in
least-recently-freed order, cached prompt prefixes keyed by chained hashes, eviction)."""

from __future__ import annotations

import random

import pytest

from cyb.engine.blocks import NULL_BLOCK, BlockPool, block_hashes


def test_block_keys_chain_every_column_before_them():
    a = block_hashes(list(range(10)), 4)
    assert len(a) == 2 and all(len(k) == 16 for k in a)  # two full blocks; the partial one has none
    assert block_hashes(list(range(8)) + [99, 99], 4) == a  # what follows does not matter
    b = block_hashes([7] + list(range(1, 10)), 4)
    assert b[0] != a[0] and b[1] != a[1]  # a change in block 0 changes every later key
    c = block_hashes(list(range(4)) + [9, 5, 6, 7], 4)
    assert c[0] == a[0] and c[1] != a[1]
    assert block_hashes(list(range(8)), 4, salt=b"x") != a
    assert block_hashes([1, 2, 3], 4) == []
    # the same ids in another block size are other keys
    assert block_hashes(list(range(8)), 8)[0] not in a


def test_allocate_release_and_the_null_block():
    pool = BlockPool(5)
    assert pool.usable == 4 and pool.free == 4
    got = pool.allocate(3)
    assert NULL_BLOCK not in got and len(set(got)) == 3 and pool.free == 1
    with pytest.raises(RuntimeError, match="2 blocks asked for, 1 free"):
        pool.allocate(2)
    pool.release(got)
    assert pool.free == 4
    with pytest.raises(RuntimeError, match="released more often"):
        pool.release(got[:1])
    with pytest.raises(ValueError, match="at least 2 blocks"):
        BlockPool(1)


def test_prefix_hits_share_blocks_and_count_references():
    pool = BlockPool(8)
    keys = block_hashes(list(range(12)), 4)
    first = pool.allocate(3)
    for b, k in zip(first, keys):
        assert pool.register(b, k)
    assert pool.lookup(keys) == first
    assert pool.unheld(first) == 0
    pool.take(first[:2])  # a second row shares the first two
    pool.release(first)  # the first row ends
    assert pool.free == 4 + 1  # the third block is free (still cached), the shared two held
    assert pool.lookup(keys) == first
    assert pool.unheld(first) == 1
    other = pool.allocate(1)[0]
    assert not pool.register(other, keys[0])  # another block holds that prefix already
    assert pool.lookup(keys[:1]) == first[:1]


def test_cached_blocks_are_evicted_last_and_least_recently_freed_first():
    pool = BlockPool(7)  # six usable blocks
    a_keys = block_hashes(list(range(8)), 4)
    b_keys = block_hashes(list(range(100, 108)), 4)
    a, b = pool.allocate(2), pool.allocate(2)
    for blocks, keys in ((a, a_keys), (b, b_keys)):
        for blk, k in zip(blocks, keys):
            pool.register(blk, k)
    plain = pool.allocate(2)  # never cached
    pool.release(a)
    pool.release(plain)
    pool.release(b)  # b freed after a: a is older
    # taken first: the uncached blocks, then a's (its last block first), then b's
    got = pool.allocate(3)
    assert set(got[:2]) == set(plain) and got[2] == a[1]
    assert pool.evictions == 1
    assert pool.lookup(a_keys) == a[:1] and pool.lookup(b_keys) == b
    pool.take(a[:1])  # a hit moves a's first block out of the free list...
    pool.release(a[:1])  # ...and back as the most recently freed
    assert pool.allocate(3) == [b[1], b[0], a[0]]
    assert pool.evictions == 4 and pool.cached == {}


def test_random_use_keeps_the_counts_consistent():
    """Rows that come and go, sharing prefixes at random: every block is free or held, never
    both; a held block is never handed out; the cache finds only blocks whose key they hold."""
    rng = random.Random(0)
    pool = BlockPool(20)
    prefixes = [block_hashes([p] * 12, 4) for p in range(4)]
    rows: list[list[int]] = []
    for _ in range(500):
        if rows and (rng.random() < 0.4 or pool.free < 4):
            pool.release(rows.pop(rng.randrange(len(rows))))
        else:
            keys = prefixes[rng.randrange(4)][: rng.randint(0, 3)]
            hits = pool.lookup(keys)
            new = rng.randint(0, 3) + len(keys) - len(hits)
            if pool.free - pool.unheld(hits) < new:
                continue
            pool.take(hits)
            blocks = hits + pool.allocate(new)
            for blk, k in zip(blocks[len(hits):len(keys)], keys[len(hits):]):
                pool.register(blk, k)
            rows.append(blocks)
        held = [b for r in rows for b in r]
        for b in range(1, pool.num_blocks):
            assert pool.refs[b] == held.count(b)
            assert (pool.refs[b] == 0) == (b in pool._free)
        for key, b in pool.cached.items():
            assert pool.key_of[b] == key
