"""cyb.generation.static: the static-cache decoders against the eager ones.

Float32, left-padded prompts, rows that finish early, stop strings, greedy and sampled: the same
tokens, steps, ``d``, positions and text.  Attention limits that grow as decoding does, the
block-adaptive decoder's cache mask and positions, and on CUDA the graph decoder (tests marked
``gpu``).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cyb.generation import generate, stream
from generation_helpers import PROMPTS, build, encode, model, same_results

pytestmark = pytest.mark.usefixtures("one_thread")

STATIC_CASES = [("cyb", "shared"), ("tbys", "shared"), ("baseline", "shared"), ("cyb", "advance")]


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
@pytest.mark.parametrize("kind,scheme", STATIC_CASES)
def test_static_decoder_equals_eager(kind, scheme, mode, sample):
    """The CUDA-graph decoder's step run eagerly (``decoder="static"``) against the eager
    decoder, float32: left-padded prompts, a row that ends early at an EOS (it stays in the
    static batch, ignored), a stop string, greedy and sampled."""
    pm = model("llama", kind) if scheme == "shared" else build("llama", kind, scheme=scheme)
    opts = dict(mode=mode, max_new_tokens=9)
    if sample:
        opts.update(sample=True, temperature=0.9, top_k=20, top_p=0.9, seed=5)
    first = generate(pm, PROMPTS, eos_token_ids=(), decoder="eager", **opts)
    opts.update(eos_token_ids=(first[0].token_ids[2],), stop=[first[1].text[3:5] or "zz"])
    want = generate(pm, PROMPTS, decoder="eager", **opts)
    assert len({len(r.token_ids) for r in want}) > 1  # rows finish at different steps
    got = generate(pm, PROMPTS, decoder="static", **opts)
    same_results(got, want, whole_blocks=mode == "adaptive" and not sample)
    if kind == "cyb" and scheme == "shared" and not sample:  # both decisions were made
        assert len({s for r in want for s in r.steps}) > 1


@pytest.mark.parametrize("mode,sample", [("fixed", False), ("adaptive", False), ("adaptive", True)])
def test_static_decoder_attends_over_the_written_prefix(mode, sample, monkeypatch):
    """With small attention buckets the static decoder's attention covers only the slots
    written so far (rounded up to a bucket), growing as it decodes, and gives the eager tokens;
    without attention limits, or for batches below ``bucket_min_rows``, the whole cache."""
    from cyb.generation.static import StaticCacheOptions

    small = _small_buckets(monkeypatch)
    pm = build("llama", "cyb", scheme="advance")
    _same_as_eager(pm, "static", mode, sample, 16)
    seen = []
    dec = _stepped(pm, mode, 16, 14, lambda d: seen.append((d.cache.length, d.cache.limit)),
                   cache_options=small)
    for length, limit in seen:  # the written slots, rounded up to 4 x a power of two
        assert length <= limit and (limit < 2 * length or limit == dec.capacity)
    limits = [limit for _, limit in seen]
    assert limits == sorted(limits) and limits[0] < dec.capacity
    assert dec.capacity % 128 == 0
    for whole in (dataclasses.replace(small, bucket_min_rows=8),  # small batches: the whole cache
                  dataclasses.replace(small, attention_limits=False, capacity_multiple=1)):
        dec = _stepped(pm, mode, 16, 1, cache_options=whole)
        assert dec.cache.limit == dec.capacity
    assert dec.capacity % 128 != 0  # not rounded up
    with pytest.raises(ValueError, match="capacity_multiple must be an integer >= 1"):
        StaticCacheOptions(capacity_multiple=0)


def _small_buckets(monkeypatch):
    """Attention limits of 4 slots from 1 row up for the static decoders built without cache
    options (as ``generate`` builds them); returns those cache options."""
    from cyb.generation import registry
    from cyb.generation.static import StaticCacheOptions

    small = StaticCacheOptions(attention_bucket=4, bucket_min_rows=1)
    for name in ("static", "graph"):
        entry = registry.REGISTRY[name]

        def build(*args, entry=entry, cache_options=None, **kw):
            return entry.build(*args, cache_options=cache_options or small, **kw)
        monkeypatch.setitem(registry.REGISTRY, name, dataclasses.replace(entry, build=build))
    return small


def _same_as_eager(pm, decoder: str, mode: str, sample: bool, max_new_tokens: int) -> None:
    """``generate`` with ``decoder`` gives the eager decoder's results on PROMPTS."""
    opts = dict(mode=mode, max_new_tokens=max_new_tokens, eos_token_ids=())
    if sample:
        opts.update(sample=True, temperature=0.9, top_p=0.9, seed=5)
    want = generate(pm, PROMPTS, decoder="eager", **opts)
    got = generate(pm, PROMPTS, decoder=decoder, **opts)
    same_results(got, want, whole_blocks=mode == "adaptive" and not sample)


def _stepped(pm, mode: str, max_new_tokens: int, steps: int, each=None, cache_options=None):
    """A greedy static decoder of PROMPTS (graph on CUDA) after ``steps`` steps; ``each(dec)``
    after every step."""
    from cyb.generation.registry import make_decoder
    from cyb.layout import left_pad

    ids, mask = left_pad([encode(p) for p in PROMPTS], pm.device)
    with torch.inference_mode():
        dec = make_decoder("graph" if pm.device.type == "cuda" else "static", pm, ids, mask,
                           mode=mode, max_new_tokens=max_new_tokens, cache_options=cache_options)
        dec.start()
        for _ in range(steps):
            dec.step().token.tolist()
            if each is not None:
                each(dec)
    return dec


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_static_decoder_streams_the_same_events(sample):
    """Sampled, the one-position decoder emits the eager events in the same order; greedy, the
    block decoder emits every row's token at each step, so each row's events are the same but
    rows interleave differently."""
    pm = model("llama")
    opts = dict(mode="adaptive", max_new_tokens=5, eos_token_ids=())
    if sample:
        opts.update(sample=True, temperature=0.9, seed=3)
    want = [dataclasses.astuple(e) for e in stream(pm, PROMPTS[:3], decoder="eager", **opts)]
    got = [dataclasses.astuple(e) for e in stream(pm, PROMPTS[:3], decoder="static", **opts)]
    if sample:
        assert got == want
    else:
        assert sorted(got) == sorted(want)


def test_block_adaptive_decoder_is_one_step_per_token_and_keeps_adaptive_positions():
    """Greedy adaptive decoding on the static path feeds whole blocks: one step per token for
    every row, the steps after each stop step masked out, positions as adaptive mode has them."""
    from cyb.generation.decoders import BlockAdaptiveDecoder, StepReadout
    from cyb.generation.registry import make_decoder
    from cyb.generation.static import StaticBlockAdaptiveDecoder
    from cyb.layout import left_pad

    pm = build("llama", "cyb", scheme="advance")
    ids, mask = left_pad([encode(p) for p in PROMPTS], "cpu")
    greedy = StepReadout(pm.vocab, pm.dk_bias)
    with torch.inference_mode():
        dec = make_decoder("static", pm, ids, mask, greedy, mode="adaptive", max_new_tokens=6)
        assert isinstance(dec, StaticBlockAdaptiveDecoder) and dec.positions_per_step == pm.num_steps
        outs = [dec.start()] + [dec.step() for _ in range(4)]
        m, t0 = pm.num_steps, ids.shape[1] * pm.num_steps
        steps = torch.stack([o.steps for o in outs], 1)  # [B, 5]
        assert all(bool(o.answered.all()) for o in outs)
        assert (steps.min() >= 1) and (steps.max() <= m) and len(set(steps.flatten().tolist())) > 1
        # the cache's mask keeps steps 1..s of each block (the last prompt block included)
        kept = dec.valid[:, t0 - m:t0 + 4 * m].view(len(PROMPTS), 5, m)
        assert torch.equal(kept.sum(-1), steps)
        assert torch.equal(kept, torch.arange(m) < steps.unsqueeze(-1))
        # advance scheme: the next token sits right after the last kept step
        last_prompt_pos = mask.sum(1) * m - m
        assert torch.equal(dec.step_pos[:, 0], last_prompt_pos + steps.sum(1))
    sampled = StepReadout(pm.vocab, pm.dk_bias, sample=True, generator=torch.Generator())
    with pytest.raises(ValueError, match="greedy"):
        StaticBlockAdaptiveDecoder(pm, ids, mask, sampled, max_new_tokens=4)
    with pytest.raises(ValueError, match="greedy"):
        BlockAdaptiveDecoder(pm, ids, mask, sampled)
    assert not isinstance(make_decoder("static", pm, ids, mask, sampled, mode="adaptive", max_new_tokens=4),
                          StaticBlockAdaptiveDecoder)


# ---------------------------------------------------------------------------------- CUDA graphs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_cuda_graph_decoder_equals_eager(mode, dtype):
    """On CUDA the default decoder is the CUDA graph; in float32 it gives the eager tokens
    (greedy and sampled, left padding, early EOS); in bf16 most of them (kernels that sum in
    another order may flip a near-tie, and a row differs from there on)."""
    from cyb.generation.registry import resolve_decoder

    pm = build("llama", "cyb", init=0.3, dk_scale=0.3, psi_dk=0.5).to("cuda", dtype)
    assert resolve_decoder(pm, "auto") == "graph"
    for sample in (False, True):
        opts = dict(mode=mode, max_new_tokens=12, eos_token_ids=())
        if sample:
            opts.update(sample=True, temperature=0.9, top_p=0.9, seed=5)
        want = generate(pm, PROMPTS, decoder="eager", **opts)
        got = generate(pm, PROMPTS, **opts)
        if dtype == torch.float32:
            same_results(got, want, whole_blocks=mode == "adaptive" and not sample)
        else:
            same = sum(a == b for g, w in zip(got, want) for a, b in zip(g.token_ids, w.token_ids))
            assert same >= 0.5 * sum(len(w.token_ids) for w in want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_cuda_graph_decoder_recaptures_as_attention_grows(mode, monkeypatch):
    """Small attention buckets: the graph decoder captures a new graph each time decoding
    outgrows the current attention limit, and still gives the eager tokens in float32."""
    small = _small_buckets(monkeypatch)
    pm = build("llama", "cyb", init=0.3, dk_scale=0.3, psi_dk=0.5).to("cuda")
    for sample in (False, True):
        _same_as_eager(pm, "graph", mode, sample, 24)
    assert _stepped(pm, mode, 24, 20, cache_options=small).graphs_captured > 1
