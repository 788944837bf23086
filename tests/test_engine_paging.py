"""The engine's paged cache: rows in blocks taken as they grow, preemption when none is free,
prefix caching.  Every request must decide the no-cache reference's tokens, steps and ``d``
whatever happens to its row: preempted (and written again from its columns, its random stream
resumed at the same token), its prompt found in the cache in part or whole, cached blocks
evicted; on the CPU, and with the host reading one step behind as on CUDA (``lookahead``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cyb.decision import row_keys
from cyb.engine import Engine, EngineOptions, Request
from engine_helpers import M, SAMPLED, Sampling, assert_same, layout_model, reference, sliding_model
from generation_helpers import PROMPTS, encode

pytestmark = pytest.mark.usefixtures("one_thread")

_REFS: dict = {}


def ref(pm, name, prompt, n, mode, s, key):
    k = (name, str(pm.device), tuple(prompt), n, mode, dataclasses.astuple(s), key)
    if k not in _REFS:
        _REFS[k] = reference(pm, list(prompt), n, mode, s, key)
    return _REFS[k]


def requests(prompts, budgets, mode, s, keys):
    return [Request(tuple(p), n, mode=mode, sample=s.sample, temperature=s.temperature, top_k=s.top_k,
                    top_p=s.top_p, key=k) for p, n, k in zip(prompts, budgets, keys)]


def one_row_of_blocks(pm, reqs, options: EngineOptions) -> EngineOptions:
    """``options`` with a cache of exactly one row of the engine's capacity."""
    probe = Engine.sized_for(pm, reqs, options=dataclasses.replace(options, cache_blocks=None, cache_bytes=1 << 24))
    return dataclasses.replace(options, cache_blocks=probe.capacity // options.block_size)


def run(pm, reqs, options, *, lookahead=False, arrive=None):
    """``reqs`` through one engine (request ``i`` submitted at step ``arrive[i]``, default 0):
    per request ``(tokens, steps, d)``, and the engine."""
    engine = Engine.sized_for(pm, reqs, options=options)
    if pm.device.type == "cpu":  # (on CUDA the host always reads one step behind)
        engine._set_lookahead(lookahead)
    arrive = arrive or [0] * len(reqs)
    order = sorted(range(len(reqs)), key=lambda i: arrive[i])
    got = {i: ([], [], []) for i in range(len(reqs))}
    index, step = {}, 0
    while order or engine.busy:
        while order and arrive[order[0]] <= step:
            i = order.pop(0)
            index[engine.submit(reqs[i])] = i
        for e in engine.step():
            tokens, steps, d = got[index[e.request]]
            assert e.index == len(tokens)
            tokens.append(e.token), steps.append(e.steps), d.append(list(e.d))
        step += 1
        assert step < 3000
    assert engine.slots_in_use == 0 and engine.free_blocks == engine.num_blocks  # every block back
    assert not engine.pager.writing  # no prompt block left marked as being written
    return got, engine


@pytest.mark.parametrize("lookahead", [False, True], ids=["sync", "lookahead"])
@pytest.mark.parametrize("visibility", ["shared", "private", "gated"])
def test_preempted_rows_decide_what_they_would_have(visibility, lookahead):
    """Four slots, a cache of one row: rows are preempted as they grow and written again from
    their columns (pauses as fed, adaptive rows only those they took); every request decides
    the reference's tokens, steps and d."""
    pm = layout_model(visibility)
    prompts = [encode(p) for p in PROMPTS + ["0123456789", "the quick brown"]]
    budgets = [12, 10, 14, 9, 11, 13]
    keys = row_keys(len(prompts), seed=3)
    cases = [("adaptive", SAMPLED, "one", 2), ("fixed", Sampling(), "one", 4), ("adaptive", Sampling(), "block", 1)]
    for mode, s, positions, block in cases:
        reqs = requests(prompts, budgets, mode, s, keys)
        base = EngineOptions(max_slots=4, block_size=block, capacity_multiple=1, prefill_chunk=4, positions=positions)
        got, engine = run(pm, reqs, one_row_of_blocks(pm, reqs, base), lookahead=lookahead)
        assert engine.stats["preemptions"] > 0, (mode, positions)
        for i, p in enumerate(prompts):
            assert_same(got[i], ref(pm, visibility, p, budgets[i], mode, s, keys[i]))


@pytest.mark.parametrize("visibility", ["shared", "private", "gated"])
def test_prefix_hits_skip_the_cached_columns(visibility):
    """Prompts that share a prefix, arriving after the first was written: the later ones find
    its full blocks cached and write only the rest (a repeated prompt of whole blocks writes
    nothing); every request decides the reference's tokens.  With prefix caching off nothing is
    looked up."""
    pm = layout_model(visibility)
    stem = "the quick brown fox 12+34="
    texts = [stem + "5", stem + "67", stem, stem + "5", "a" + stem]
    prompts = [encode(t) for t in texts]
    keys = row_keys(len(prompts), seed=8)
    reqs = requests(prompts, [6] * len(prompts), "adaptive", SAMPLED, keys)
    arrive = [0, 6, 9, 12, 12]
    written = {}
    for caching in (True, False):
        options = EngineOptions(max_slots=2, block_size=1, prefill_chunk=8, prefix_caching=caching)
        got, engine = run(pm, reqs, options, arrive=arrive)
        for i, p in enumerate(prompts):
            assert_same(got[i], ref(pm, visibility, p, 6, "adaptive", SAMPLED, keys[i]))
        written[caching] = engine.stats["prefill_positions"]
        if caching:
            columns = [engine.layout.prefill(list(p)).columns for p in prompts]
            assert engine.stats["prefix_lookup_blocks"] == sum(columns)
            hits = engine.stats["prefix_hit_columns"]
            # the second and the third share the first's stem; the fourth is the first again; the last shares nothing
            assert hits >= columns[2] + columns[3] and engine.stats["prefix_hit_blocks"] == hits
            assert written[True] == sum(columns) - hits
        else:
            assert engine.stats["prefix_lookup_blocks"] == engine.stats["prefix_hit_blocks"] == 0
    assert written[True] < written[False]


@pytest.mark.parametrize("visibility", ["shared", "private", "gated"])
def test_requests_arriving_together_write_a_shared_prefix_once(visibility):
    """A few-shot job in small: prompts that share a prefix of several blocks, all submitted at
    once to an empty engine.  The first writes the prefix (in several prefill forwards); the
    others wait for it instead of writing it again each, then find it cached: every full block
    of the shared prefix is written once, and every request decides the reference's tokens."""
    pm = layout_model(visibility)
    stem = "the quick brown fox jumps over 12+34="
    prompts = [encode(stem + t) for t in ["5", "67", "8", "9x", "ab"]]
    keys = row_keys(len(prompts), seed=5)
    reqs = requests(prompts, [5] * len(prompts), "adaptive", SAMPLED, keys)
    block = 4
    options = EngineOptions(max_slots=4, block_size=block, prefill_chunk=8)
    got, engine = run(pm, reqs, options)
    for i, p in enumerate(prompts):
        assert_same(got[i], ref(pm, visibility, p, 5, "adaptive", SAMPLED, keys[i]))
    ids = [engine.layout.prefill(list(p)).ids.tolist() for p in prompts]
    common = 0  # columns every prefill starts with
    while all(len(r) > common and r[common] == ids[0][common] for r in ids):
        common += 1
    stats = engine.stats
    assert common // block >= 4 and stats["prefix_hit_blocks"] >= (len(prompts) - 1) * (common // block), stats
    assert stats["prefix_waits"] > 0


@pytest.mark.parametrize("lookahead", [False, True], ids=["sync", "lookahead"])
def test_evictions_and_preemption_with_shared_prefixes(lookahead):
    """A small cache, prompts with and without a shared prefix coming and going: cached blocks
    are evicted to make room, rows are preempted and take cached prefixes on their way back;
    nothing changes what any request decides (gated pauses: the tags of cached columns)."""
    pm = layout_model("gated")
    stems = ["hello world ", "0123456789 "]
    texts = [stems[i % 2] + t for i, t in enumerate(["a", "bc", "def", "g", "hi", "jk", "l", "mno"])]
    prompts = [encode(t) for t in texts]
    budgets = [9, 7, 11, 6, 10, 8, 12, 5]
    keys = row_keys(len(prompts), seed=11)
    reqs = requests(prompts, budgets, "adaptive", SAMPLED, keys)
    base = EngineOptions(max_slots=3, block_size=4, capacity_multiple=1, prefill_chunk=6)
    options = one_row_of_blocks(pm, reqs, base)
    options = dataclasses.replace(options, cache_blocks=options.cache_blocks + 4)
    got, engine = run(pm, reqs, options, lookahead=lookahead, arrive=[0, 0, 2, 4, 8, 12, 16, 20])
    stats = engine.stats
    assert stats["preemptions"] > 0 and stats["prefix_hit_blocks"] > 0 and stats["prefix_evictions"] > 0, stats
    for i, p in enumerate(prompts):
        assert_same(got[i], ref(pm, "gated", p, budgets[i], "adaptive", SAMPLED, keys[i]))


@pytest.mark.parametrize("visibility", ["shared", "private"])
def test_sliding_windows_with_prefix_hits_and_preemption(visibility):
    """Gemma 3's windows (in columns under shared pauses, in positions under private ones, each
    cached column's position written for the row that finds it) through prefix hits and
    preemption."""
    pm = sliding_model("gemma3", visibility)
    texts = ["hello world 1", "hello world 22", "hello world 1", "xyz 7"]
    prompts = [encode(t) for t in texts]
    budgets = [10, 8, 9, 11]
    keys = row_keys(len(prompts), seed=12)
    reqs = requests(prompts, budgets, "fixed", SAMPLED, keys)
    base = EngineOptions(max_slots=3, block_size=2, capacity_multiple=1, prefill_chunk=5)
    options = one_row_of_blocks(pm, reqs, base)
    got, engine = run(pm, reqs, options, arrive=[0, 3, 6, 6], lookahead=True)
    assert engine.stats["preemptions"] > 0 and engine.stats["prefix_hit_blocks"] > 0, engine.stats
    for i, p in enumerate(prompts):
        assert_same(got[i], ref(pm, "gemma3-" + visibility, p, budgets[i], "fixed", SAMPLED, keys[i]))


def test_slots_cost_only_the_blocks_their_rows_hold():
    """A cache of one long row still runs many short requests at once: slots are not cut to
    what the cache holds in rows of the engine's capacity."""
    pm = layout_model("shared")
    engine = Engine(pm, capacity=600, slots=16, options=EngineOptions(block_size=8, cache_blocks=80))
    assert engine.slots == 16 and engine.num_blocks == 80
    ids = [engine.submit(Request(tuple(encode(p)), 3)) for p in PROMPTS * 4]
    seen = 0
    while engine.busy:
        engine.step()
        seen = max(seen, len(engine.scheduler.decoding))
    assert seen == 16 and engine.stats["preemptions"] == 0 and len(ids) == 16
    with pytest.raises(ValueError, match=r"cache_blocks=79 holds no row of 640 columns \(80 blocks of 8"):
        Engine(pm, capacity=600, slots=16, options=EngineOptions(block_size=8, cache_blocks=79))


def test_aborts_give_blocks_back_in_every_state():
    """Requests aborted while waiting (after a preemption too), prefilling or decoding give
    their blocks and slots back."""
    pm = layout_model("private")
    prompts = [encode(p) for p in ["0123456789abcdef", "hello world", "12+34=", "xyz"]]
    reqs = requests(prompts, [20, 20, 20, 20], "adaptive", Sampling(), [0, 1, 2, 3])
    options = one_row_of_blocks(pm, reqs, EngineOptions(max_slots=4, block_size=1, capacity_multiple=1,
                                                        prefill_chunk=2))
    engine = Engine.sized_for(pm, reqs, options=options)
    ids = [engine.submit(r) for r in reqs]
    engine.step()
    engine.abort(ids[0])  # prefilling
    states = set()
    for _ in range(200):
        if not engine.busy:
            break
        for e in engine.step():
            if e.index == 15 and e.request == ids[1]:
                engine.abort(e.request)  # decoding
        for t in list(engine.scheduler.waiting):
            if t.tokens:  # preempted after deciding tokens, waiting again
                states.add("waiting")
                engine.abort(t.id)
    assert engine.stats["preemptions"] > 0 and "waiting" in states
    assert not engine.busy and engine.free_blocks == engine.num_blocks and engine.slots_in_use == 0


def test_row_attention_reads_the_block_tables(triton_interpreted):
    """Row attention through the kernel that reads block tables (interpreted on the CPU), gated
    pauses: rows preempted and a prompt's cached blocks found decide the reference's tokens."""
    pm = layout_model("gated")
    stem = "the quick brown fox "
    prompts = [encode(stem + t) for t in ("12", "hello", "12")] + [encode("xyz 7")]
    budgets = [8, 6, 7, 9]
    keys = row_keys(len(prompts), seed=14)
    reqs = requests(prompts, budgets, "adaptive", SAMPLED, keys)
    base = EngineOptions(max_slots=3, block_size=16, capacity_multiple=16, prefill_chunk=32, row_attention=True)
    got, engine = run(pm, reqs, one_row_of_blocks(pm, reqs, base), arrive=[0, 0, 4, 4], lookahead=True)
    assert engine.runner.row_attention
    assert engine.stats["preemptions"] > 0 and engine.stats["prefix_hit_blocks"] > 0, engine.stats
    for i, p in enumerate(prompts):
        assert_same(got[i], ref(pm, "gated", p, budgets[i], "adaptive", SAMPLED, keys[i]))


@pytest.mark.parametrize("bad,match", [(dict(block_size=3), "power of two"), (dict(block_size=512), "power of two"),
                                       (dict(block_size=0), "power of two"), (dict(cache_blocks=0), "cache_blocks"),
                                       (dict(prefix_caching="yes"), "prefix_caching")])
def test_paging_options_are_checked(bad, match):
    with pytest.raises(ValueError, match=match):
        EngineOptions(**bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("row_attention", [None, False], ids=["row-attention", "masked"])
@pytest.mark.parametrize("visibility", ["shared", "private", "gated"])
def test_cuda_preemption_and_prefix_hits(visibility, row_attention):
    """On CUDA (steps as graphs, the host one step behind, blocks of 16 read through the tables
    by the row attention kernel, or gathered for the mask): rows preempted and prompts found in
    the cache decide the reference's tokens.

    The second prompt finds the first one's full block; then four short prompts with long answers
    share a cache of one row.  An adaptive row's capacity counts every pause it may take, so its
    prompt must be short beside its answer for the rows it actually grows to outrun the cache
    whatever the model decides."""
    pm = layout_model(visibility).to("cuda")
    stem = "the quick brown fox jumps "
    prompts = [encode(stem + "12"), encode(stem + "hello")] + [encode(p) for p in ("12+34=", "xyz 7", "a", "0123")]
    budgets = [6, 5, 40, 36, 38, 40]
    keys = row_keys(len(prompts), seed=13)
    for mode, s, positions in (("adaptive", SAMPLED, "one"), ("fixed", Sampling(), "block")):
        reqs = requests(prompts, budgets, mode, s, keys)
        base = EngineOptions(max_slots=4, block_size=16, capacity_multiple=16, prefill_chunk=24,
                             positions=positions, row_attention=row_attention)
        options = one_row_of_blocks(pm, reqs, base)
        got, engine = run(pm, reqs, options, arrive=[0, 1, 2, 2, 3, 3], lookahead=True)
        assert engine.runner.use_graph, mode
        assert engine.stats["prefix_hit_blocks"] > 0 and engine.stats["preemptions"] > 0, (mode, engine.stats)
        for i, p in enumerate(prompts):
            assert_same(got[i], ref(pm, visibility, p, budgets[i], mode, s, keys[i]))


def test_paged_rows_and_the_row_attention_glue(monkeypatch):
    """:func:`cyb.model.attention.paged_rows` lays a row's blocks out as its columns; the row
    attention glue hands the kernel the pools and the block tables where it reads them (blocks
    of 16 or more, a kernel that takes ``block_table``), else the rows gathered."""
    import cyb.kernels.row_attention as ra
    from cyb.model import attention

    g = torch.Generator().manual_seed(0)
    for size in (4, 16):
        pool = torch.randn(9, 2, size, 8, generator=g)
        table = torch.tensor([[3, 1, 7], [0, 8, 2]])
        rows = attention.paged_rows(pool, table)
        assert rows.shape == (2, 2, 3 * size, 8)
        for i in range(2):
            for c in range(3 * size):
                assert torch.equal(rows[i, :, c], pool[table[i, c // size], :, c % size])
    calls = []

    def kernel(query, key, value, last, *, block_table=None, **kw):
        calls.append((tuple(key.shape), block_table))
        return torch.zeros(query.shape[0], query.shape[2], query.shape[1], query.shape[3])

    monkeypatch.setattr(ra, "row_attention", kernel)
    attention._kernel_takes_tables.cache_clear()
    try:
        query, last = torch.randn(2, 4, 1, 8), torch.tensor([[5], [7]])
        for size, paged in ((16, True), (4, False)):
            pool = torch.randn(9, 2, size, 8)
            table = torch.tensor([[3, 1], [0, 8]])
            attention._row_attention(None, query, pool, pool, (last, None, None, None, table), None, {})
            shape, given = calls[-1]
            assert (given is table) == paged and shape == ((9, 2, size, 8) if paged else (2, 2, 2 * size, 8))
    finally:
        attention._kernel_takes_tables.cache_clear()


def test_prefix_hit_rate():
    pm = layout_model("shared")
    prompt = tuple(encode("hello world, hello"))
    engine = Engine(pm, capacity=120, slots=1, options=EngineOptions(block_size=4))
    assert engine.prefix_hit_rate is None
    for _ in range(2):
        engine.submit(Request(prompt, 2))
        while engine.busy:
            engine.step()
    looked = engine.stats["prefix_lookup_blocks"]
    assert looked == 2 * ((len(prompt) - 1) * M // 4) and engine.prefix_hit_rate == 0.5
