"""Mixed steps: prompts written inside the decoding steps (``EngineOptions.step_budget``), one
forward carrying the decoding rows' positions and prompt chunks through the row attention
kernel's flattened entry.  Every request must decide the no-cache reference's tokens, steps
and ``d``: with prompts arriving while rows decode, chunks cut across steps, rows preempted and
prompts found in the prefix cache; on the CPU through the interpreted kernel, and on CUDA."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import cyb.engine.engine as engine_module
from cyb.decision import row_keys
from cyb.engine import Engine, EngineOptions
from engine_helpers import SAMPLED, Sampling, assert_same, layout_model, sliding_model
from generation_helpers import encode
from test_engine_paging import one_row_of_blocks, ref, requests, run

pytestmark = pytest.mark.usefixtures("one_thread")

STEM = "the quick brown fox jumps over the lazy dog "
TAILS = ("12+34=", "hello", "a", "xyz 7", "b")


@pytest.fixture
def small_chunks(monkeypatch):
    """Mixed steps carry as few as 3 prompt positions, so that the tests' short prompts are
    written across several steps."""
    monkeypatch.setattr(engine_module, "MIN_MIXED_CHUNK", 3)


def _check(pm, name, *, mode, s, positions, budget, arrive, preempt, device_lookahead=True):
    """The prompts of :data:`TAILS` through an engine with ``step_budget=budget``, arriving at
    steps ``arrive``; with ``preempt`` longer answers and a cache of one row and a block."""
    prompts = [encode(STEM + t) for t in TAILS]
    budgets = [30, 24, 34, 20, 28] if preempt else [9, 7, 11, 6, 8]
    keys = row_keys(len(prompts), seed=21)
    reqs = requests(prompts, budgets, mode, s, keys)
    base = EngineOptions(max_slots=3, block_size=16, capacity_multiple=16, prefill_chunk=16, positions=positions,
                         row_attention=True, step_budget=budget)
    options = base
    if preempt:
        one_row = one_row_of_blocks(pm, reqs, base)
        options = dataclasses.replace(one_row, cache_blocks=one_row.cache_blocks + 1)
    got, engine = run(pm, reqs, options, arrive=arrive, lookahead=device_lookahead)
    assert engine.stats["mixed_steps"] > 0, engine.stats
    for i, p in enumerate(prompts):
        assert_same(got[i], ref(pm, name, p, budgets[i], mode, s, keys[i]))
    return engine


@pytest.mark.parametrize("visibility", ["shared", "private", "gated"])
def test_mixed_steps_decide_what_the_reference_does(triton_interpreted, small_chunks, visibility):
    """Prompts arriving while rows decode go into the decoding steps, a few positions a step;
    adaptive rows one position a step and fixed rows a whole block, sampled and greedy (gated
    pauses: each chunk position's own pauses get no gate, earlier tokens' do)."""
    pm = layout_model(visibility)
    for mode, s, positions in (("adaptive", SAMPLED, "one"), ("fixed", Sampling(), "block")):
        engine = _check(pm, visibility, mode=mode, s=s, positions=positions, budget=5, arrive=[0, 2, 3, 5, 9],
                        preempt=False)
        assert engine.stats["prefix_hit_blocks"] > 0, engine.stats  # (the prompts share 2 blocks)


def test_mixed_steps_with_preemption_and_prefix_hits(triton_interpreted, small_chunks):
    """A cache of one row: rows are preempted as they grow and written again inside the steps
    of the rows that stay."""
    pm = layout_model("private")
    engine = _check(pm, "private", mode="adaptive", s=SAMPLED, positions="one", budget=6, arrive=[0, 0, 3, 6, 9],
                    preempt=True)
    assert engine.stats["preemptions"] > 0, engine.stats


def test_mixed_steps_under_sliding_windows(triton_interpreted, small_chunks):
    """Gemma 3's windows in positions (private pauses): the chunks' column positions are read
    for their own rows."""
    pm = sliding_model("gemma3", "private", attn="sdpa")
    _check(pm, "gemma3-private-sdpa", mode="fixed", s=SAMPLED, positions="block", budget=4, arrive=[0, 1, 2, 4, 7],
           preempt=False)


def test_the_step_budget_bounds_the_chunks(triton_interpreted):
    """Each mixed step writes at most what the decoding rows leave of the budget, and never
    fewer than ``MIN_MIXED_CHUNK`` prompt positions."""
    pm = layout_model("shared")
    prompts = [encode(STEM * 3 + t) for t in TAILS[:3]]
    reqs = requests(prompts, [40, 4, 4], "adaptive", SAMPLED, row_keys(3, seed=3))
    options = EngineOptions(max_slots=3, block_size=16, capacity_multiple=16, positions="one", row_attention=True,
                            step_budget=70, prefix_caching=False)
    engine = Engine.sized_for(pm, reqs, options=options)
    engine.submit(reqs[0])
    engine.step()  # no row decodes: the first prompt is written by a prefill forward
    assert engine.stats["mixed_steps"] == 0
    for r in reqs[1:]:
        engine.submit(r)
    written = []
    while engine.scheduler.prefilling or engine.scheduler.waiting:
        before = engine.stats["prefill_positions"]
        decoding = len(engine.scheduler.decoding)
        engine.step()
        written.append((decoding, engine.stats["prefill_positions"] - before))
    assert engine.stats["mixed_steps"] > 0
    for decoding, n in written:
        assert n <= max(70 - decoding, engine_module.MIN_MIXED_CHUNK)
    assert any(n == 70 - 1 for _, n in written), written  # one row decoding: 69 prompt positions
    for _ in engine.run():
        pass


def _warmed_then_run(pm, name, device_warm_up: bool):
    """An engine with a step budget whose mixed steps were warmed (the runner's warm-up steps on
    the CPU, :meth:`Engine.warm_up` on CUDA) and then runs :data:`TAILS`: the rows are as they
    were, and every request decides the reference's tokens."""
    from cyb.engine.readout import SamplingKind

    prompts = [encode(STEM + t) for t in TAILS]
    budgets = [9, 7, 11, 6, 8]
    keys = row_keys(len(prompts), seed=23)
    reqs = requests(prompts, budgets, "adaptive", SAMPLED, keys)
    options = EngineOptions(max_slots=3, block_size=16, capacity_multiple=16, prefill_chunk=16, positions="one",
                            row_attention=True, step_budget=40)
    engine = Engine.sized_for(pm, reqs, options=options)
    before = [t.clone() for t in engine.rows.snapshot()]
    if device_warm_up:
        engine.warm_up()
    else:
        with torch.inference_mode():
            for n in (1, engine.slots):
                engine.runner.warm_mixed(n, engine.q, 40 - n * engine.q, SamplingKind())
    assert all(torch.equal(a, b) for a, b in zip(before, engine.rows.snapshot()))
    index = {engine.submit(r): i for i, r in enumerate(reqs)}
    got = {i: ([], [], []) for i in range(len(reqs))}
    while engine.busy:
        for e in engine.step():
            tokens, steps, d = got[index[e.request]]
            tokens.append(e.token), steps.append(e.steps), d.append(list(e.d))
    assert engine.stats["mixed_steps"] > 0
    for i, p in enumerate(prompts):
        assert_same(got[i], ref(pm, name, p, budgets[i], "adaptive", SAMPLED, keys[i]))


@pytest.mark.parametrize("visibility", ["private", "gated"])
def test_warming_mixed_steps_changes_nothing(triton_interpreted, small_chunks, visibility):
    """The warm-up's mixed steps write only the scratch columns: nothing a request reads."""
    _warmed_then_run(layout_model(visibility), visibility, device_warm_up=False)


def test_step_budget_is_refused_where_it_cannot_run(triton_interpreted):
    with pytest.raises(ValueError, match="step_budget"):
        EngineOptions(step_budget=0)
    reqs = requests([encode("hello")], [3], "adaptive", SAMPLED, [1])
    with pytest.raises(ValueError, match="step_budget needs row attention"):  # no row attention
        Engine.sized_for(layout_model("shared"), reqs, options=EngineOptions(row_attention=False, step_budget=64))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("visibility", ["shared", "private", "gated"])
def test_cuda_mixed_steps(small_chunks, visibility):
    """On CUDA (decoding steps as graphs between the mixed steps, the host one step behind,
    blocks of 16 read through the tables): the reference's tokens, with preemption."""
    pm = layout_model(visibility).to("cuda")
    for mode, s, positions in (("adaptive", SAMPLED, "one"), ("fixed", Sampling(), "block")):
        engine = _check(pm, visibility, mode=mode, s=s, positions=positions, budget=5, arrive=[0, 1, 3, 5, 9],
                        preempt=True)
        assert engine.runner.use_graph


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("visibility", ["shared", "gated"])
def test_cuda_warm_up_with_a_step_budget(small_chunks, visibility):
    """On CUDA, :meth:`Engine.warm_up` with a step budget runs its mixed steps into the scratch
    columns: nothing a request reads."""
    _warmed_then_run(layout_model(visibility).to("cuda"), visibility, device_warm_up=True)
