"""cyb.engine: rows that advance on their own and come and go.

Against a no-cache reference (every step recomputed from scratch over the whole row, with the
layout's own mask, and the sequential decision written out here, not taken from the library):
tokens, steps and ``d`` equal for shared, private and gated pauses, fixed and adaptive mode,
one position or whole blocks per step, greedy and sampled, whatever the slot, the neighbours or
the join time; prompts longer than a prefill chunk; early ends.  Then the engine's bookkeeping:
slots come back, compaction, errors, the host reads of a step, the per-row readout.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch

from cyb.decision import row_keys, stream_uniforms
from cyb.engine import Engine, EngineOptions, Request
from engine_helpers import LAYOUTS, M, SAMPLED, Sampling, assert_same, engine_run, layout_model, reference
from engine_helpers import sliding_model
from generation_helpers import PROMPTS, encode

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("positions", ["one", "block"])
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
@pytest.mark.parametrize("visibility,scheme", LAYOUTS)
def test_engine_equals_the_no_cache_reference(visibility, scheme, mode, sample, positions):
    pm = layout_model(visibility, scheme=scheme)
    s = SAMPLED if sample else Sampling()
    prompts = [encode(p) for p in PROMPTS]
    keys = row_keys(len(prompts), seed=4)
    got, engine = engine_run(pm, prompts, mode, s, keys=keys, options=EngineOptions(positions=positions))
    assert engine.q == (1 if positions == "one" else M)
    seen = set()
    for i, p in enumerate(prompts):
        want = reference(pm, p, 8, mode, s, keys[i])
        assert_same(got[i], want)
        seen.update(want[1])
    assert len(seen) > 1  # the model both pauses and answers


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
@pytest.mark.parametrize("visibility", ["shared", "private"])
def test_sliding_window_models(visibility, mode):
    """Gemma 2 (softcapped, every other layer sliding, eager attention) and Gemma 3 (windows of
    4): the windows cut columns under shared pauses (the sequence as fed) and positions under
    private ones (the real tokens, as in training); prompts longer than a window."""
    pm = sliding_model("gemma2" if visibility == "shared" else "gemma3", visibility)
    prompts = [encode(p) for p in PROMPTS]
    keys = row_keys(len(prompts), seed=6)
    for s in (Sampling(), SAMPLED):
        got, _ = engine_run(pm, prompts, mode, s, keys=keys, options=EngineOptions(max_slots=3, prefill_chunk=5))
        for i, p in enumerate(prompts):
            assert_same(got[i], reference(pm, p, 8, mode, s, keys[i]))


#: the suite's cases of the row attention engine test (one each: every layout, both position
#: schemes, both ways of feeding, both windows); ``-m slow`` runs every combination
ROW_CASES = [("shared", "advance", "one"), ("private", "shared", "block"), ("gated", "advance", "one"),
             ("gemma3-shared", "", "block"), ("gemma3-private", "", "one")]
ROW_ALL = [(v, sch, q) for v, sch in LAYOUTS + [("gemma3-shared", ""), ("gemma3-private", "")]
           for q in ("one", "block")]


@pytest.mark.parametrize("visibility,scheme,positions",
                         ROW_CASES + [pytest.param(*c, marks=pytest.mark.slow) for c in ROW_ALL if c not in ROW_CASES])
def test_row_attention_equals_the_no_cache_reference(triton_interpreted, visibility, scheme, positions):
    """The engine with attention over each row's own columns (the kernel interpreted on the
    CPU): every layout, and Gemma 3's sliding windows in columns (shared) and in positions
    (private); rows that join mid-decode and prompts in several prefill chunks (first chunks
    through causal self-attention); greedy and sampled, fixed and adaptive."""
    if visibility.startswith("gemma3"):
        pm = sliding_model("gemma3", visibility.split("-")[1], attn="sdpa")
    else:
        pm = layout_model(visibility, scheme=scheme)
    prompts = [encode(p) for p in PROMPTS]
    keys = row_keys(len(prompts), seed=5)
    options = EngineOptions(positions=positions, row_attention=True, max_slots=3, prefill_chunk=5)
    for mode, s in (("fixed", Sampling()), ("adaptive", SAMPLED)):
        got, engine = engine_run(pm, prompts, mode, s, keys=keys, options=options)
        assert engine.runner.row_attention
        # first prompt chunks run causal self-attention, without the mask, where nothing is tagged or windowed
        assert engine.runner.causal_prefill == (visibility in ("shared", "private"))
        for i, p in enumerate(prompts):
            assert_same(got[i], reference(pm, p, 8, mode, s, keys[i]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("visibility", ["shared", "private"])
def test_cuda_row_attention_sliding_windows(visibility):
    """Gemma 3's windows (in columns under shared pauses, in positions under private ones)
    through the compiled kernel in CUDA graphs, against the reference."""
    pm = sliding_model("gemma3", visibility, attn="sdpa").to("cuda")
    prompts = [encode(p) for p in PROMPTS]
    keys = row_keys(len(prompts), seed=6)
    for mode, s in (("fixed", Sampling()), ("adaptive", SAMPLED)):
        for positions in ("one", "block"):
            options = EngineOptions(max_slots=3, prefill_chunk=5, positions=positions)
            got, engine = engine_run(pm, prompts, mode, s, keys=keys, options=options)
            assert engine.runner.row_attention and engine.runner.use_graph
            for i, p in enumerate(prompts):
                assert_same(got[i], reference(pm, p, 8, mode, s, keys[i]))


@pytest.mark.parametrize("kind", ["tbys", "baseline"])
@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_models_without_dk(kind, mode):
    pm = layout_model("shared", kind)
    prompts = [encode(p) for p in PROMPTS]
    got, _ = engine_run(pm, prompts, mode, Sampling())
    m = pm.num_steps
    for i, p in enumerate(prompts):
        assert_same(got[i], reference(pm, p, 8, mode, Sampling(), 0))
        assert got[i][1] == [m] * 8


@pytest.mark.parametrize("visibility", ["shared", "private", "gated"])
def test_rows_come_and_go_without_changing_anything(visibility):
    """Two slots for six prompts of several lengths and budgets, prompts written two columns at
    a time, rows ending early at an EOS: every row's tokens, steps and ``d`` are those it gets
    alone in a one-slot engine, and the reference's."""
    pm = layout_model(visibility)
    prompts = [encode(p) for p in PROMPTS + ["0123456789", "b"]]
    budgets = [3, 9, 5, 7, 4, 8]
    keys = row_keys(len(prompts), seed=9)
    for mode, s in (("adaptive", SAMPLED), ("fixed", Sampling())):
        alone = [engine_run(pm, [p], mode, s, max_new=[n], keys=[k])[0][0]
                 for p, n, k in zip(prompts, budgets, keys)]
        eos = alone[1][0][2]  # a token that ends some rows early
        small = EngineOptions(max_slots=2, prefill_chunk=2, prefill_rows=2)
        got, engine = engine_run(pm, prompts, mode, s, max_new=budgets, keys=keys, options=small, eos=[eos])
        assert engine.slots == 2 and engine.stats["prefill_forwards"] > len(prompts)
        for i in range(len(prompts)):
            tokens = alone[i][0]
            cut = tokens.index(eos) + 1 if eos in tokens else len(tokens)
            assert got[i][:2] == (tokens[:cut], alone[i][1][:cut])
            assert got[i][4] == ("eos" if cut < len(tokens) or tokens[-1] == eos else "length")
        for i in (0, 4):
            want = reference(pm, prompts[i], budgets[i], mode, s, keys[i])
            assert_same(alone[i][:3], want)


def test_finished_rows_free_their_slots_and_the_rest_move_down(monkeypatch):
    """A row that finishes frees its slot; when nothing waits, the rows still decoding move to
    the lowest slots (cache and state), which changes nothing they decide."""
    from cyb.engine.scheduler import Scheduler

    pm = layout_model("gated")
    prompts = [encode(p) for p in PROMPTS]
    budgets = [2, 3, 12, 12]
    for mode in ("adaptive", "fixed"):
        with monkeypatch.context() as mp:
            mp.setattr(Scheduler, "compaction", lambda self, bucket: [])
            still, _ = engine_run(pm, prompts, mode, SAMPLED, max_new=budgets, keys=[1, 2, 3, 4])
        moves = []
        original = Engine._compact

        def spy(self):
            before = {t.id: t.slot for t in self.scheduler.decoding.values()}
            original(self)
            moves.extend((before[t.id], t.slot) for t in self.scheduler.decoding.values()
                         if before[t.id] != t.slot)
        with monkeypatch.context() as mp:
            mp.setattr(Engine, "_compact", spy)
            moved, _ = engine_run(pm, prompts, mode, SAMPLED, max_new=budgets, keys=[1, 2, 3, 4])
        assert moves and all(dst < src for src, dst in moves)
        for i in range(len(prompts)):
            assert_same(moved[i], still[i][:3])


def test_positions_count_what_went_through_the_network():
    pm = layout_model("shared")
    prompt = encode("12+34=")
    out, _ = engine_run(pm, [prompt], "adaptive", Sampling(), max_new=[6])
    tokens, steps, _, positions, reason = out[0]
    assert positions == (len(prompt) - 1) * M + sum(steps) and reason == "length"
    fixed, _ = engine_run(pm, [prompt], "fixed", Sampling(), max_new=[6])
    assert fixed[0][3] == (len(prompt) - 1 + 6) * M
    private = layout_model("private")
    out, _ = engine_run(private, [prompt], "adaptive", Sampling(), max_new=[6])
    assert out[0][3] == len(prompt) - 1 + sum(out[0][1])


def test_private_rows_keep_real_tokens_only():
    """A private row's pauses sit after its real tokens and the next real token overwrites
    them: its next column is the prompt's length plus the tokens decided, whatever the pauses."""
    pm = layout_model("private")
    prompt = encode("hello world")
    req = Request(tuple(prompt), 10, mode="adaptive")
    engine = Engine.sized_for(pm, [req])
    rid = engine.submit(req)
    decided = 0
    while decided < 6:
        decided += len(engine.step())
    slot = engine._tracked[rid].slot
    assert int(engine.rows.real_col[slot]) == len(prompt) - 1 + decided


def test_submit_abort_and_errors():
    pm = layout_model("shared")
    engine = Engine(pm, capacity=40, slots=2)
    with pytest.raises(ValueError, match="needs .* cache columns"):
        engine.submit(Request((5,) * 60, 10))
    with pytest.raises(ValueError, match="max_position_embeddings = 256"):
        Engine(pm, capacity=2000, slots=1).submit(Request((5,) * 200, 100))
    with pytest.raises(TypeError, match="Request"):
        engine.submit([5, 6])
    for bad, match in ((dict(prompt=()), "prompt is empty"), (dict(max_new_tokens=0), "max_new_tokens"),
                       (dict(mode="fast"), "mode"), (dict(temperature=-1.0), "temperature"),
                       (dict(top_p=0.0), "top_p"), (dict(top_k=-2), "top_k"), (dict(key=-1), "key")):
        with pytest.raises(ValueError, match=match):
            Request(**{"prompt": (5, 6), "max_new_tokens": 3, **bad})
    a = engine.submit(Request((5, 6, 7), 8))
    b = engine.submit(Request((5, 6), 8))
    c = engine.submit(Request((7,), 8))  # waits: two slots
    seen = {a: 0, b: 0, c: 0}
    engine.abort(c)  # aborted while waiting
    while engine.busy:
        for e in engine.step():
            seen[e.request] += 1
            if e.request == a and seen[a] == 2:
                engine.abort(a)
    assert seen == {a: 2, b: 8, c: 0} and engine.slots_in_use == 0
    with pytest.raises(ValueError, match="positions must be one of"):
        EngineOptions(positions="two")
    with pytest.raises(ValueError, match="max_slots"):
        EngineOptions(max_slots=0)
    with pytest.raises(ValueError, match="holds no row"):
        Engine(pm, capacity=40, slots=2, options=EngineOptions(cache_bytes=16))


def test_a_decoding_step_reads_nothing_back_to_the_host():
    from torch.profiler import ProfilerActivity, profile

    from cyb.engine.readout import SamplingKind

    for visibility in ("shared", "private", "gated"):
        pm = layout_model(visibility)
        reqs = [Request(tuple(encode(p)), 8, sample=True, temperature=0.9, top_k=5, top_p=0.9, key=k)
                for k, p in enumerate(PROMPTS)]
        engine = Engine.sized_for(pm, reqs)
        for r in reqs:
            engine.submit(r)
        engine.step()
        with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                engine.runner.decode(len(reqs), engine.q, engine.capacity, SamplingKind(True, 8, True))
        reads = {e.key: e.count for e in prof.key_averages()
                 if e.key in ("aten::_local_scalar_dense", "aten::item", "aten::is_nonzero")}
        assert reads == {}, visibility


def test_per_row_filters_equal_the_batch_filter():
    from cyb.decision import filter_logits
    from cyb.engine.readout import filter_rows

    z = torch.randn(6, 50)
    k = torch.tensor([0, 1, 5, 50, 7, 3])
    p = torch.tensor([1.0, 0.5, 0.9, 0.3, 1.0, 0.99])
    got = filter_rows(z, k, p, max_k=8)
    for i in range(6):
        want = filter_logits(z[i:i + 1], top_k=int(k[i]) or None, top_p=float(p[i]))
        assert torch.equal(got[i:i + 1], want)


def test_row_streams():
    """A row's uniforms depend on its key, the token index and the lane only; they are uniform."""
    keys = torch.tensor(row_keys(4, seed=7))
    u = stream_uniforms(keys, torch.tensor(3), 5)
    assert u.shape == (4, 5) and torch.equal(u[2], stream_uniforms(keys[2], torch.tensor(3), 5))
    assert row_keys(2, seed=7) == row_keys(4, seed=7)[:2] and row_keys(2, seed=8) != row_keys(2, seed=7)
    big = stream_uniforms(torch.tensor(row_keys(1000, seed=1)), torch.arange(1000), 4)
    assert 0.0 <= float(big.min()) and float(big.max()) < 1.0
    assert abs(float(big.mean()) - 0.5) < 0.01 and abs(float(big.var()) - 1 / 12) < 0.003
    assert len(set(big.flatten().tolist())) > 3990


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("row_attention", [None, False], ids=["row-attention", "masked"])
@pytest.mark.parametrize("visibility,scheme", LAYOUTS)
def test_cuda_graph_engine_equals_the_reference(visibility, scheme, row_attention):
    """On CUDA the engine's steps are graphs (captured per batch size, and per attention limit
    when attention runs through the mask) with fused small operations: float32, every mode,
    greedy and sampled, rows coming and going, the eager decoder's and the reference's
    decisions; attention over each row's own columns (the default where triton is installed)
    and through the mask."""
    from cyb.generation import generate

    pm = layout_model(visibility, scheme=scheme).to("cuda")
    prompts = [encode(p) for p in PROMPTS + ["0123456789", "b"]]
    keys = row_keys(len(prompts), seed=2)
    small = EngineOptions(max_slots=3, prefill_chunk=4, attention_bucket=4, bucket_min_rows=1,
                          row_attention=row_attention)
    for mode in ("fixed", "adaptive"):
        for s in (Sampling(), SAMPLED):
            for positions in ("one", "block"):
                got, engine = engine_run(pm, prompts, mode, s, max_new=[12] * len(prompts), keys=keys,
                                         options=dataclasses.replace(small, positions=positions))
                assert engine.runner.use_graph and engine.runner.row_attention == (row_attention is None)
                assert engine.runner.fused  # the steps' norms, MLPs and rotary embedding compiled
                assert engine.runner.row_attention or len(engine.runner.graphs) > 1
                # first chunks from graphs wherever the model allows causal prefill (not gated
                # pauses; with the pause attention function, which row attention switches on)
                graphed = any(k[0] == "prefill" for k in engine.runner.graphs)
                assert graphed == engine.runner.causal_prefill
                assert graphed or visibility == "gated" or not engine.runner.row_attention
                for i, p in enumerate(prompts):
                    assert_same(got[i], reference(pm, p, 12, mode, s, keys[i]))
            opts = dict(mode=mode, max_new_tokens=12, eos_token_ids=(), sample=s.sample,
                        temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=2)
            want = generate(pm, prompts, decoder="eager", **opts)
            have = generate(pm, prompts, **opts)
            assert [(r.token_ids, r.steps) for r in have] == [(r.token_ids, r.steps) for r in want]


@pytest.mark.parametrize("slots,rows,chunk", [(3, 32, 4), (256, 16, 512), (256, 8, 512), (200, 64, 2048),
                                             (40, 4, 300), (5, 1, 100)])
def test_capture_prefill_covers_every_forward_the_scheduler_can_make(slots, rows, chunk):
    """The prefill graphs a server captures at start cover every bucket of every forward of
    first chunks the scheduler may ask for, and the scheduler asks for no other: ``r`` rows of
    chunk ``c <= prefill_chunk``, ``r`` within the slots, one row or a padded shape within
    ``prefill_rows x prefill_chunk`` positions."""
    from cyb.engine.runner import Runner, prefill_bucket
    from cyb.engine.scheduler import Scheduler, Tracked
    from cyb.engine.layout import Prefill

    runner = Runner.__new__(Runner)
    runner.cache = type("Cache", (), {"slots": slots})()
    runner._prefill_in = object()
    runner.graphs = {}

    def graph(r, c):
        rb, cb = prefill_bucket(r, c)
        runner.graphs[("prefill", min(rb, slots), cb)] = None
        return None, None

    runner._prefill_graph = graph
    made = runner.capture_prefill(rows * chunk, chunk)
    assert made == len(runner.graphs)
    budget = rows * chunk
    for c in range(1, chunk + 1):
        for r in range(1, slots + 1):
            shape = runner.prefill_shape(r, c, True)
            if r > 1 and shape[0] * shape[1] > budget:
                break
            assert ("prefill", *shape) in runner.graphs, (r, c)
    # what the scheduler asks for, on prompts of random lengths
    rng = random.Random(slots * 7 + rows)
    for _ in range(20):
        sched = Scheduler(slots, prefill_chunk=chunk, prefill_rows=rows, shape=runner.prefill_shape)
        for i in range(rng.randint(1, 2 * slots)):
            n = rng.randint(1, 3 * chunk)
            sched.add(Tracked(i, None, Prefill(torch.zeros(n), torch.zeros(n), 0, 0)))
        sched.admit()
        while (plan := sched.next_prefill()) is not None:
            batch, c = plan
            shape = runner.prefill_shape(len(batch), c, batch[0].written == 0)
            assert len(batch) == 1 or shape[0] * shape[1] <= budget
            if batch[0].written == 0:
                assert ("prefill", *shape) in runner.graphs, (len(batch), c)
            for t in batch:
                t.written += min(c, t.prefill_left)
            sched.ready()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_engine_with_prefill_graphs_captured_first():
    """A server's engine captures its prefill graphs at start; prompts then run from them, and
    every row still equals the reference."""
    pm = layout_model("private", scheme="shared").to("cuda")
    prompts = [encode(p) for p in PROMPTS + ["0123456789", "b"]]
    reqs = [Request(tuple(p), 10, mode="adaptive") for p in prompts]
    engine = Engine.sized_for(pm, reqs, options=EngineOptions(max_slots=3, prefill_chunk=8, prefill_rows=2))
    made = engine.capture_prefill()
    assert made > 0
    before = dict(engine.runner.graphs)
    index = {engine.submit(r): i for i, r in enumerate(reqs)}
    got = {i: [] for i in index.values()}
    for e in engine.run():
        got[index[e.request]].append(e.token)
    assert {k for k in engine.runner.graphs if k[0] == "prefill"} <= set(before)
    for i, p in enumerate(prompts):
        assert got[i] == reference(pm, p, 10, "adaptive", Sampling(), 0)[0]


@pytest.mark.parametrize("visibility", ["shared", "private", "gated"])
def test_read_at_reads_every_token_out_at_that_step(visibility):
    """The ablation option: read at step 1, the answers of a model whose dk prior is minus
    infinity (one step per token); read at step M, those of one whose dk always wins before the
    last step; the reported ``d`` stays the model's own either way."""
    pm = layout_model(visibility)
    prompts = [encode(p) for p in PROMPTS]
    own, _ = engine_run(pm, prompts, "adaptive", Sampling())
    assert any(s > 1 for i in own for s in own[i][1]) and any(s < M for i in own for s in own[i][1])
    bias = pm._dk_bias
    for step, forced_bias in ((1, -math.inf), (M, 1e4)):
        got, _ = engine_run(pm, prompts, "adaptive", Sampling(), options=EngineOptions(read_at=step))
        assert all(got[i][1] == [step] * 8 for i in got)
        assert all(got[i][2][0][0] == pytest.approx(own[i][2][0][0], abs=1e-5) for i in got)
        pm._dk_bias = forced_bias
        try:
            for i, p in enumerate(prompts):
                tokens, steps, _ = reference(pm, p, 8, "adaptive", Sampling(), 0)
                assert got[i][0] == tokens and got[i][1] == steps
        finally:
            pm._dk_bias = bias
    with pytest.raises(ValueError, match="read_at"):
        EngineOptions(read_at=0)
