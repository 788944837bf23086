"""Generation with pauses: cache vs recompute, batching, stopping, sampling, results, CLI.

Tiny random Llama and Gemma 2 (softcapped) models with a character tokenizer.  For the CYB
models the dk row of the output projection and the dk prior are set so that both dk and
answer decisions occur; the references below recompute every step from scratch without a
cache and implement the sequential decision directly (not through :mod:`cyb.decision`).
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import transformers

from cyb.cli import main
from cyb.data.synthetic import CharTokenizer
from cyb.generation import GenerationConfig, GenerationResult, generate, stream
from cyb.generation.shade import legend, step_rgb
from cyb.generation.text import TextStream
from cyb.layout import expand, expand_variable
from cyb.model import PauseModel

TOK = CharTokenizer().to_hf()
PROMPTS = ["12+34=", "hello world", "a", "xyz 7"]

# (init range, dk row scale, psi_dk): settings that give a mix of dk and answer decisions
MIXED = {"llama": (0.3, 0.3, 0.5), "gemma2": (0.3, 1.0, None)}
RARE = ("llama", 0.3, 1.0, None)  # dk is rare


pytestmark = pytest.mark.usefixtures("one_thread")


def build(family="llama", kind="cyb", *, init=0.3, dk_scale=0.3, psi_dk=0.5, num_steps=3,
          scheme="shared", seed=0) -> PauseModel:
    """A 2-layer model with the character tokenizer; ``kind`` is cyb (dk), tbys (no dk) or
    baseline (M = 1)."""
    common = dict(vocab_size=len(TOK), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  initializer_range=init, tie_word_embeddings=False,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if family == "llama":
        cfg, impl = transformers.LlamaConfig(**common), None
    else:
        cfg, impl = transformers.Gemma2Config(**common, head_dim=8, sliding_window=16,
                                              final_logit_softcapping=3.0), "eager"
    m = 1 if kind == "baseline" else num_steps
    torch.manual_seed(seed)
    pm = PauseModel.from_config(cfg, CharTokenizer().to_hf(), num_steps=m, use_dk=kind == "cyb",
                                psi_dk=psi_dk if kind == "cyb" else None, position_scheme=scheme,
                                attn_implementation=impl).eval()
    if pm.settings.dk_id is not None:
        with torch.no_grad():
            w = pm.hf_model.get_output_embeddings().weight
            w[pm.settings.dk_id] = torch.randn(w.shape[1]) * dk_scale
    return pm


_CACHE: dict = {}


def model(family="llama", kind="cyb", **kw) -> PauseModel:
    if kind == "cyb" and not kw:
        init, dk_scale, psi = MIXED[family]
        kw = dict(init=init, dk_scale=dk_scale, psi_dk=psi)
    key = (family, kind, tuple(sorted(kw.items())))
    if key not in _CACHE:
        _CACHE[key] = build(family, kind, **kw)
    return _CACHE[key]


def encode(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------ references (no cache)


def _banned(z: torch.Tensor, pm: PauseModel) -> torch.Tensor:
    z = z.float().clone()
    z[..., list(pm.vocab.pause_ids)] = -math.inf
    return z


@torch.no_grad()
def reference_fixed(pm: PauseModel, prompt: list[int], n: int) -> tuple[list[int], list[int]]:
    """Fixed mode recomputed from scratch: expand the whole sequence, read out its last block."""
    m, dk, bias = pm.num_steps, pm.settings.dk_id, pm.dk_bias
    ids, tokens, steps = list(prompt), [], []
    for _ in range(n):
        lay = expand(torch.tensor([ids]), pm.vocab)
        h, _ = pm.hidden_states(lay.input_ids, lay.position_ids, lay.attention_mask)
        z = _banned(pm.logits(h[0, -m:]), pm)  # [M, V]
        for i in range(m):
            zb = z[i].clone()
            if i < m - 1:  # dk or answer; without dk (TBYS) the readout is at step M
                if dk is None:
                    continue
                zb[dk] += bias
                if int(zb.argmax()) == dk:
                    continue
            if dk is not None:
                zb[dk] = -math.inf
            tokens.append(int(zb.argmax()))
            steps.append(i + 1)
            break
        ids.append(tokens[-1])
    return tokens, steps


@torch.no_grad()
def reference_adaptive(pm: PauseModel, prompt: list[int], n: int) -> tuple[list[int], list[int]]:
    """Adaptive mode recomputed from scratch: the list of fed steps, run whole at every step."""
    m, dk, bias = pm.num_steps, pm.settings.dk_id, pm.dk_bias
    advance = pm.vocab.position_scheme == "advance"
    seq, pos = [], []
    for k, t in enumerate(prompt[:-1]):
        for j in range(m):
            seq.append(t if j == 0 else pm.vocab.pause_ids[j - 1])
            pos.append(k * m + j if advance else k)
    seq.append(prompt[-1])
    pos.append((len(prompt) - 1) * (m if advance else 1))
    tokens, steps, step = [], [], 1
    while len(tokens) < n:
        h, _ = pm.hidden_states(torch.tensor([seq]), torch.tensor([pos]))
        zb = _banned(pm.logits(h[0, -1]), pm)
        wants_dk = False
        if dk is not None:
            zb[dk] += bias
            wants_dk = int(zb.argmax()) == dk
            zb[dk] = -math.inf
        if (wants_dk or dk is None) and step < m:  # dk, or TBYS before its readout step
            seq.append(pm.vocab.pause_ids[step - 1])
            pos.append(pos[-1] + (1 if advance else 0))
            step += 1
            continue
        tokens.append(int(zb.argmax()))
        steps.append(step)
        seq.append(tokens[-1])
        pos.append(pos[-1] + 1)
        step = 1
    return tokens, steps


# ------------------------------------------------------------------------ cache vs recompute


CASES = [(f, k, "shared") for f in ("llama", "gemma2") for k in ("cyb", "tbys", "baseline")]
CASES.append(("llama", "cyb", "advance"))


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
@pytest.mark.parametrize("family,kind,scheme", CASES)
def test_greedy_with_cache_equals_recompute(family, kind, scheme, mode):
    pm = model(family, kind) if scheme == "shared" else build(family, kind, scheme=scheme)
    prompt = encode("12+34=")
    [res] = generate(pm, [prompt], mode=mode, max_new_tokens=8, eos_token_ids=())
    ref = reference_fixed if mode == "fixed" else reference_adaptive
    tokens, steps = ref(pm, prompt, 8)
    assert res.token_ids == tokens
    assert res.steps == steps


def test_dk_models_make_both_decisions():
    for family in ("llama", "gemma2"):
        for mode in ("fixed", "adaptive"):
            res = generate(model(family), PROMPTS, mode=mode, max_new_tokens=12, eos_token_ids=())
            used = {s for r in res for s in r.steps}
            assert 1 in used and len(used) > 1, (family, mode, used)


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_eager_decode_steps_run_under_the_growing_attention_kernels(monkeypatch, mode):
    from contextlib import contextmanager

    from cyb import runtime
    from cyb.generation import decoders

    entered = []

    @contextmanager
    def recording(device):
        entered.append(device.type)
        with runtime.growing_attention(device):
            yield

    monkeypatch.setattr(decoders, "growing_attention", recording)
    generate(model("llama"), PROMPTS[:1], mode=mode, max_new_tokens=3, eos_token_ids=(), decoder="eager")
    assert len(entered) >= 3 and set(entered) == {"cpu"}


def test_growing_attention_leaves_cpu_alone():
    from contextlib import nullcontext

    from cyb.runtime import growing_attention

    assert isinstance(growing_attention(torch.device("cpu")), nullcontext)


@pytest.mark.parametrize("kind", ["tbys", "baseline"])
def test_adaptive_equals_fixed_without_dk(kind):
    pm = model("llama", kind)
    fixed = generate(pm, PROMPTS, mode="fixed", max_new_tokens=6, eos_token_ids=())
    adaptive = generate(pm, PROMPTS, mode="adaptive", max_new_tokens=6, eos_token_ids=())
    for f, a in zip(fixed, adaptive):
        assert f.token_ids == a.token_ids
        assert f.steps == a.steps == [pm.num_steps] * 6
        assert f.positions == a.positions


@pytest.mark.parametrize("scheme", ["shared", "advance"])
def test_adaptive_reads_what_recipe2_training_lays_out(scheme):
    """Adaptive mode is Recipe 2's training layout with the pause counts the model chose: the
    prompt's tokens but the last with ``M-1`` pauses, every later token with ``steps - 1``.
    Teacher forcing the generated tokens through :func:`cyb.layout.expand_variable` (ids and
    positions as in training) and reading out each block's valid steps gives the same tokens
    and steps."""
    from cyb.decision import greedy_decision

    pm = model("llama") if scheme == "shared" else build("llama", "cyb", scheme=scheme)
    m, used = pm.num_steps, set()
    for text in PROMPTS:
        prompt = encode(text)
        [res] = generate(pm, [prompt], mode="adaptive", max_new_tokens=8, eos_token_ids=())
        used.update(res.steps)
        ids = torch.tensor([prompt + res.token_ids])
        counts = torch.tensor([[m - 1] * (len(prompt) - 1) + [s - 1 for s in res.steps] + [0]])
        lay = expand_variable(ids, counts, pm.vocab)
        with torch.no_grad():
            h, _ = pm.hidden_states(lay.input_ids, lay.position_ids, lay.attention_mask)
            z = _banned(lay.gather(pm.logits(h)), pm)[0]  # [L, M, V]
        blocks = slice(len(prompt) - 1, len(prompt) - 1 + len(res.steps))
        tokens, steps = greedy_decision(z[blocks], dk_id=pm.settings.dk_id, dk_bias=pm.dk_bias,
                                        num_valid_steps=counts[0, blocks] + 1)
        assert tokens.tolist() == res.token_ids
        # a block's last valid step answers whether or not dk is the argmax there
        assert steps.tolist() == res.steps
    assert 1 in used and len(used) > 1  # pauses were fed and skipped


# ------------------------------------------------------------------------------- batching


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_batch_equals_alone(family, mode):
    pm = model(family)
    alone0 = generate(pm, PROMPTS[0], mode=mode, max_new_tokens=8, eos_token_ids=())[0]
    eos = (alone0.token_ids[2],)  # row 0 ends early: the batch shrinks mid-way
    batch = generate(pm, PROMPTS, mode=mode, max_new_tokens=8, eos_token_ids=eos)
    assert len({len(r.token_ids) for r in batch}) > 1
    for prompt, got in zip(PROMPTS, batch):
        [want] = generate(pm, prompt, mode=mode, max_new_tokens=8, eos_token_ids=eos)
        assert got.token_ids == want.token_ids
        assert got.steps == want.steps
        assert got.stop_reason == want.stop_reason
        assert got.positions == want.positions
        torch.testing.assert_close(torch.tensor(got.d), torch.tensor(want.d), equal_nan=True,
                                   atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------------ static decoder == eager


def _same_results(got: list[GenerationResult], want: list[GenerationResult], *,
                  whole_blocks: bool = False) -> None:
    """``whole_blocks``: ``got`` fed every token with all its pauses (the block-adaptive
    decoder), so its positions are those of fixed mode."""
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids
        assert g.steps == w.steps
        assert g.text == w.text and g.stop_reason == w.stop_reason
        if whole_blocks:
            assert g.positions == g.num_steps * (len(g.prompt_ids) + len(g.token_ids) - 1)
        else:
            assert g.positions == w.positions
        torch.testing.assert_close(torch.tensor(g.d), torch.tensor(w.d), equal_nan=True,
                                   atol=1e-5, rtol=1e-4)
        if w.expected_steps is not None:
            assert g.expected_steps == pytest.approx(w.expected_steps, abs=1e-5)


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
    _same_results(got, want, whole_blocks=mode == "adaptive" and not sample)
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
    _same_results(got, want, whole_blocks=mode == "adaptive" and not sample)


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


@pytest.mark.parametrize("kind,scheme", [("cyb", "shared"), ("cyb", "advance"), ("tbys", "shared")])
def test_eager_block_adaptive_decoder_equals_one_position_decoder(kind, scheme, monkeypatch):
    """The eager block decoder (greedy adaptive decoding on CUDA) against the one-position one
    (on a CPU), float32: same tokens, steps and ``d`` for left-padded prompts; the finished rows
    leave its batch as they leave the other's."""
    from cyb.generation import registry

    pm = model("llama", kind) if scheme == "shared" else build("llama", kind, scheme=scheme)
    opts = dict(mode="adaptive", max_new_tokens=9, decoder="eager")
    eos = (generate(pm, PROMPTS, **opts)[0].token_ids[2],)
    want = generate(pm, PROMPTS, eos_token_ids=eos, **opts)
    eager = registry.REGISTRY["eager"]
    blocks = dataclasses.replace(  # what generate builds on CUDA
        eager, build=lambda *a, **k: eager.build(*a, **{**k, "one_position": False}))
    monkeypatch.setitem(registry.REGISTRY, "eager", blocks)
    got = generate(pm, PROMPTS, eos_token_ids=eos, **opts)
    assert len({len(r.token_ids) for r in want}) > 1
    _same_results(got, want, whole_blocks=True)


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


def test_decoder_choice():
    from cyb.generation.registry import resolve_decoder

    llama, gemma = model("llama"), model("gemma2")  # gemma2: sliding-window layers
    assert resolve_decoder(llama, "auto") == "eager"  # no CUDA here
    assert resolve_decoder(llama, "static") == "static"
    assert resolve_decoder(gemma, "auto") == "eager"
    with pytest.raises(ValueError, match="needs the model on a CUDA device"):
        resolve_decoder(llama, "graph")
    with pytest.raises(ValueError, match="sliding-window"):
        resolve_decoder(gemma, "static")
    with pytest.raises(ValueError, match="sliding-window"):
        generate(gemma, "a", decoder="graph")
    with pytest.raises(ValueError, match="decoder must be one of"):
        GenerationConfig(decoder="fast")
    assert GenerationConfig().decoder == "auto"


def test_make_decoder_picks_the_class_of_each_mode():
    from cyb.generation import registry
    from cyb.generation.decoders import AdaptiveDecoder, BlockAdaptiveDecoder, FixedDecoder, StepReadout
    from cyb.generation.static import StaticAdaptiveDecoder, StaticBlockAdaptiveDecoder, StaticFixedDecoder
    from cyb.layout import left_pad

    pm = model("llama")
    ids, mask = left_pad([encode(p) for p in PROMPTS], "cpu")
    sampled = StepReadout(pm.vocab, pm.dk_bias, sample=True, generator=torch.Generator())

    def cls(name, mode, readout=None, model=pm, **kw):
        return type(registry.make_decoder(name, model, ids, mask, readout, mode=mode, max_new_tokens=4, **kw))

    assert registry.DECODERS == ("auto", *registry.REGISTRY) and registry.DEFAULT == "auto"
    assert cls("auto", "fixed") is cls("eager", "fixed") is FixedDecoder  # no CUDA here
    assert cls("eager", "adaptive") is AdaptiveDecoder  # greedy on a CPU: one position per step
    assert cls("eager", "adaptive", one_position=False) is BlockAdaptiveDecoder
    assert cls("eager", "adaptive", model=model("gemma2"), one_position=None) is AdaptiveDecoder
    assert cls("static", "fixed") is StaticFixedDecoder
    assert cls("static", "adaptive") is StaticBlockAdaptiveDecoder  # greedy: whole blocks
    assert cls("static", "adaptive", sampled) is cls("static", "adaptive", one_position=True) \
        is StaticAdaptiveDecoder
    with pytest.raises(ValueError, match="decoder must be one of"):
        registry.make_decoder("fast", pm, ids, mask)
    with pytest.raises(ValueError, match="mode must be one of"):
        registry.make_decoder("eager", pm, ids, mask, mode="fast")
    with pytest.raises(ValueError, match="max_new_tokens"):
        registry.make_decoder("static", pm, ids, mask)
    with pytest.raises(ValueError, match="CUDA"):
        registry.make_decoder("graph", pm, ids, mask, max_new_tokens=4)
    assert registry.describe().startswith("graph = ") and "auto = graph on CUDA" in registry.describe()


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
@pytest.mark.parametrize("decoder", ["eager", "static"])
def test_decode_steps_read_nothing_back_to_the_host(mode, decoder):
    """A decode step leaves the device alone: no ``.item()``-like read (on CUDA each would wait
    for the queued work); the one read per step is the caller's (the decisions)."""
    from cyb.generation.decoders import AdaptiveDecoder, FixedDecoder, StepReadout
    from cyb.generation.registry import make_decoder
    from cyb.layout import left_pad

    pm = model("llama")
    ids, mask = left_pad([encode(p) for p in PROMPTS], "cpu")
    readout = StepReadout(pm.vocab, pm.dk_bias, sample=True, temperature=0.9, top_p=0.9,
                          generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        if decoder == "eager":
            dec = (FixedDecoder if mode == "fixed" else AdaptiveDecoder)(pm, ids, mask, readout)
        else:
            dec = make_decoder("static", pm, ids, mask, readout, mode=mode, max_new_tokens=8)
    assert _host_reads(dec) == {}


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_block_adaptive_steps_read_nothing_back_to_the_host(static):
    from cyb.generation.decoders import BlockAdaptiveDecoder, StepReadout
    from cyb.generation.static import StaticBlockAdaptiveDecoder
    from cyb.layout import left_pad

    pm = build("llama", "cyb", scheme="advance")
    ids, mask = left_pad([encode(p) for p in PROMPTS], "cpu")
    readout = StepReadout(pm.vocab, pm.dk_bias)
    dec = (StaticBlockAdaptiveDecoder(pm, ids, mask, readout, max_new_tokens=8) if static
           else BlockAdaptiveDecoder(pm, ids, mask, readout))
    assert _host_reads(dec) == {}


def _host_reads(dec) -> dict:
    """Host reads of device values (``.item()`` and the like) during 3 steps of a new decoder,
    after its start and one untimed step: ``{op: count}``."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        dec.start()
        dec.step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                dec.step()
    return {e.key: e.count for e in prof.key_averages()
            if e.key in ("aten::_local_scalar_dense", "aten::item", "aten::is_nonzero")}


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
            _same_results(got, want, whole_blocks=mode == "adaptive" and not sample)
        else:
            same = sum(a == b for g, w in zip(got, want) for a, b in zip(g.token_ids, w.token_ids))
            assert same >= 0.5 * sum(len(w.token_ids) for w in want)


# ------------------------------------------------------------------------------- stopping


def test_max_new_tokens_and_eos():
    pm = model("llama")
    [res] = generate(pm, "hello world", max_new_tokens=7, eos_token_ids=())
    assert len(res.token_ids) == 7 and res.stop_reason == "length"
    eos = res.token_ids[3]
    first = res.token_ids.index(eos)
    [stopped] = generate(pm, "hello world", max_new_tokens=7, eos_token_ids=(eos,))
    assert stopped.token_ids == res.token_ids[: first + 1]  # the EOS is kept
    assert stopped.stop_reason == "eos"


def test_stop_string_cuts_text_and_stream_matches():
    pm = model("llama")
    [full] = generate(pm, "hello world", max_new_tokens=12, eos_token_ids=())
    stop = full.text[5:7]
    cut = full.text.find(stop)
    events = []
    [res] = generate(pm, "hello world", max_new_tokens=12, eos_token_ids=(), stop=[stop],
                     on_token=events.append)
    assert res.stop_reason == "stop"
    assert res.text == full.text[:cut]
    assert res.token_ids == full.token_ids[: len(res.token_ids)]
    assert "".join(e.text for e in events) == res.text
    assert [e.token_id for e in events] == res.token_ids
    assert [e.steps for e in events] == res.steps
    assert events[-1].finished and events[-1].stop_reason == "stop"
    assert not any(e.finished for e in events[:-1])


def test_text_stream_holds_back_possible_stop_strings():
    ts = TextStream(lambda ids: "".join(chr(i) for i in ids), stop=["ab"])
    assert ts.push(ord("x")) == ("x", False)
    assert ts.push(ord("a")) == ("", False)  # could start "ab"
    assert ts.push(ord("c")) == ("ac", False)
    assert ts.push(ord("a")) == ("", False)
    assert ts.push(ord("b")) == ("", True)
    assert ts.text == "xac"
    ts = TextStream(lambda ids: "".join(chr(i) for i in ids))
    assert ts.push(0xFFFD) == ("", False)  # an incomplete character waits
    assert ts.push(ord("z")) == ("\ufffdz", False)
    assert ts.flush() == ""


def test_stream_yields_rows_and_results():
    pm = model("llama")
    s = stream(pm, PROMPTS[:2], mode="adaptive", max_new_tokens=4, eos_token_ids=())
    assert s.results is None
    events = list(s)
    assert len(events) == 8 and {e.row for e in events} == {0, 1}
    for row, res in enumerate(s.results):
        mine = [e for e in events if e.row == row]
        assert [e.index for e in mine] == [0, 1, 2, 3]
        assert "".join(e.text for e in mine) == res.text


# ------------------------------------------------------------------------------- sampling


def test_sampling_is_reproducible_and_temperature_zero_is_greedy():
    pm = model("llama")
    opts = dict(sample=True, temperature=0.8, top_k=10, top_p=0.9, max_new_tokens=10, eos_token_ids=())
    for mode in ("fixed", "adaptive"):
        a = generate(pm, PROMPTS, mode=mode, seed=3, **opts)
        b = generate(pm, PROMPTS, mode=mode, seed=3, **opts)
        assert [r.token_ids for r in a] == [r.token_ids for r in b]
        assert [r.steps for r in a] == [r.steps for r in b]
        c = generate(pm, PROMPTS, mode=mode, generator=torch.Generator().manual_seed(3), **opts)
        assert [r.token_ids for r in a] == [r.token_ids for r in c]
        greedy = generate(pm, PROMPTS, mode=mode, max_new_tokens=10, eos_token_ids=())
        cold = generate(pm, PROMPTS, mode=mode, sample=True, temperature=0.0, seed=1,
                        max_new_tokens=10, eos_token_ids=())
        assert [r.token_ids for r in cold] == [r.token_ids for r in greedy]
        assert [r.steps for r in cold] == [r.steps for r in greedy]


# ------------------------------------------------------------------------ result contents


def _check_result(res: GenerationResult, m: int, mode: str) -> None:
    n = len(res.token_ids)
    assert len(res.steps) == len(res.d) == n
    assert all(1 <= s <= m for s in res.steps)
    for steps, d in zip(res.steps, res.d):
        assert len(d) == m and d[-1] == 0.0
        run = d[:steps] if mode == "adaptive" else d
        assert all(0.0 <= x <= 1.0 for x in run)
        if mode == "adaptive":
            assert all(math.isnan(x) for x in d[steps : m - 1])
    if mode == "fixed":
        assert len(res.expected_steps) == n
        assert all(1.0 - 1e-5 <= e <= m + 1e-5 for e in res.expected_steps)
    else:
        assert res.expected_steps is None


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
@pytest.mark.parametrize("kind", ["cyb", "tbys", "baseline"])
def test_result_shapes_and_ranges(kind, mode):
    pm = model("llama", kind)
    m = pm.num_steps
    res = generate(pm, PROMPTS[:2], mode=mode, max_new_tokens=6, eos_token_ids=())
    for r in res:
        _check_result(r, m, mode)
        assert r.mode == mode and r.num_steps == m
        json.dumps(r.to_dict())  # JSON-ready: no NaN
        if kind != "cyb":
            assert r.steps == [m] * 6
            assert all(d == [1.0] * (m - 1) + [0.0] for d in r.d)
            if mode == "fixed":
                assert r.expected_steps == [float(m)] * 6


def test_adaptive_feeds_fewer_positions_when_dk_is_rare():
    family, init, dk_scale, psi = RARE
    pm = model(family, "cyb", init=init, dk_scale=dk_scale, psi_dk=psi)
    m, n = pm.num_steps, 10
    fixed = generate(pm, PROMPTS, mode="fixed", max_new_tokens=n, eos_token_ids=())
    adaptive = generate(pm, PROMPTS, mode="adaptive", max_new_tokens=n, eos_token_ids=())
    for f, a in zip(fixed, adaptive):
        length = len(f.prompt_ids)
        assert f.positions == (length + n - 1) * m  # the last token is never fed
        assert a.positions == (length - 1) * m + sum(a.steps)
        assert a.positions < f.positions


def test_one_forward_per_token_in_fixed_mode(monkeypatch):
    pm = model("llama")
    calls = []
    inner = pm.hidden_states

    def counting(input_ids, *args, **kw):
        calls.append(tuple(input_ids.shape))
        return inner(input_ids, *args, **kw)

    monkeypatch.setattr(pm, "hidden_states", counting)
    [res] = generate(pm, "12+34=", mode="fixed", max_new_tokens=6, eos_token_ids=())
    assert calls == [(1, 7 * 3)] + [(1, 3)] * 5  # <bos> and prompt, then one block of M per token
    calls.clear()
    [res] = generate(pm, "12+34=", mode="adaptive", max_new_tokens=6, eos_token_ids=())
    assert calls == [(1, 6 * 3 + 1)] + [(1, 1)] * (sum(res.steps) - 1)


# ---------------------------------------------------------------------------------- errors


def test_bad_input_errors():
    pm = model("llama")
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(pm, "a", max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        GenerationConfig(temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        GenerationConfig(top_p=1.5)
    with pytest.raises(ValueError, match="mode"):
        GenerationConfig(mode="eager")
    with pytest.raises(TypeError, match="unknown generation option"):
        generate(pm, "a", max_tokens=3)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(pm, ["a", []])  # (empty text is just <bos> for a tokenizer that adds it)
    with pytest.raises(ValueError, match="prompt 0: .*reserved as a pause/dk id"):
        generate(pm, [[5, pm.vocab.pause_ids[0]]])
    with pytest.raises(ValueError, match="max_position_embeddings"):
        stream(pm, "a", max_new_tokens=300)  # checked before the stream is iterated


def test_model_without_tokenizer_takes_ids():
    pm = model("llama")
    bare = PauseModel(pm.hf_model, pm.settings)
    prompt = encode("12+34=")
    [res] = generate(bare, torch.tensor(prompt), max_new_tokens=5, eos_token_ids=())
    [want] = generate(pm, prompt, max_new_tokens=5, eos_token_ids=())
    assert res.token_ids == want.token_ids and res.text is None
    with pytest.raises(ValueError, match="no tokenizer"):
        generate(bare, "12+34=")
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        generate(bare, [prompt], stop=["x"])


# ------------------------------------------------------------------------------- shading


def test_shading_colours():
    assert step_rgb(1, 4) == (255, 255, 255)
    assert step_rgb(4, 4) == (8, 48, 107)
    assert step_rgb(1, 1) == (255, 255, 255)
    line = legend(3, truecolor=True)
    assert line.count("\x1b[48;2;") == 3
    assert legend(3, truecolor=False).count("\x1b[48;5;") == 3


# ------------------------------------------------------------------------------------ CLI


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    model("llama").save_pretrained(path)
    return path


def test_cli_generate(saved, tmp_path, capsys):
    out_json = tmp_path / "out.json"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("xyz\n\nab 1\n")
    code = main(["generate", str(saved), "--prompt", "12+", "--file", str(prompts),
                 "--max-new-tokens", "5", "--ignore-eos", "--json", str(out_json), "--device", "cpu"])
    assert code == 0
    out = capsys.readouterr().out
    assert "12+" in out and "xyz" in out and "ab 1" in out
    data = json.loads(out_json.read_text())
    assert data["num_steps"] == 3 and data["config"]["mode"] == "fixed"
    assert len(data["results"]) == 3
    assert all(len(r["token_ids"]) == 5 and len(r["d"]) == 5 for r in data["results"])


def test_cli_generate_shaded_adaptive_batch(saved, capsys):
    code = main(["generate", str(saved), "--prompt", "12+", "--prompt", "hello", "--mode", "adaptive",
                 "--shade", "--batch-size", "2", "--sample", "--seed", "0", "--max-new-tokens", "5"])
    assert code == 0
    out = capsys.readouterr().out
    assert "steps used per token" in out
    assert "\x1b[48;" in out and "12+" in out and "hello" in out


def test_cli_errors(saved, tmp_path, capsys):
    assert main(["generate", str(tmp_path / "missing"), "--prompt", "a"]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{}")
    assert main(["generate", str(tmp_path), "--prompt", "a"]) == 2
    assert "not a saved cyb model: expected cyb_pause.json" in capsys.readouterr().err
    assert main(["generate", str(saved), "--prompt", "a", "--temperature", "0.5"]) == 2
    assert "only apply with --sample" in capsys.readouterr().err
    assert main(["generate", str(saved), "--prompt", "a", "--sample", "--top-p", "2"]) == 2
    assert "--top-p must lie in (0, 1]" in capsys.readouterr().err
    assert main(["generate", str(saved), "--prompt", "a", "--max-new-tokens", "0"]) == 2
    assert "--max-new-tokens must be >= 1" in capsys.readouterr().err
    assert main(["generate", str(saved)]) == 2
    assert "no prompt given" in capsys.readouterr().err
    assert main(["generate", str(saved), "--prompt", "a", "--decoder", "graph", "--device", "cpu"]) == 2
    assert "--decoder graph: " in capsys.readouterr().err


def test_cli_generate_decoders_agree(saved, tmp_path, capsys):
    texts = {}
    for decoder in ("eager", "static"):
        out_json = tmp_path / f"{decoder}.json"
        assert main(["generate", str(saved), "--prompt", "12+", "--prompt", "hello", "--batch-size", "2",
                     "--max-new-tokens", "6", "--decoder", decoder, "--json", str(out_json),
                     "--device", "cpu"]) == 0
        data = json.loads(out_json.read_text())
        assert data["decoder_used"] == decoder and data["config"]["decoder"] == decoder
        texts[decoder] = [r["token_ids"] for r in data["results"]]
    assert texts["eager"] == texts["static"]
    assert "auto = graph on CUDA" in " ".join(_help_lines(capsys))


def _help_lines(capsys) -> list[str]:
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    return capsys.readouterr().out.split()


def test_shade_marks_line_breaks_on_their_colour():
    from cyb.generation.shade import NEWLINE_MARK, shade

    assert shade("", 2, 4, truecolor=True) == ""
    two = shade("\n\n", 3, 4, truecolor=False)
    assert two.count(NEWLINE_MARK) == 2 and two.count("\n") == 2
    assert shade("ab", 2, 4, truecolor=True).endswith("ab\x1b[0m")
    assert shade("a\nb", 2, 4, truecolor=True).split("\n")[0].endswith(NEWLINE_MARK + "\x1b[0m")


def test_cli_generate_accepts_a_run_folder(saved, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("method: {name: cyb}\n")
    assert main(["generate", str(run), "--prompt", "a"]) == 2
    assert "training has not finished" in capsys.readouterr().err
    shutil.copytree(saved, run / "final")
    assert main(["generate", str(run), "--prompt", "12+", "--max-new-tokens", "3", "--device", "cpu"]) == 0
    assert "12+" in capsys.readouterr().out


def test_bench_decode_times_a_saved_model(tmp_path):
    """``cyb bench decode --model DIR --prompts FILE``: the rows of a trained model, its own
    ``M`` and dk decisions, text prompts of different lengths (left-padded; no plain HF rows)."""
    pm = build("llama", "cyb")
    folder = pm.save_pretrained(tmp_path / "model")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("12+34=\n7+8=\n\n", encoding="utf-8")
    out = tmp_path / "decode.json"
    assert main(["bench", "decode", "--quick", "--model", str(folder), "--prompts", str(prompts),
                 "--batches", "2", "--new-tokens", "3", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["trained_model"]["num_steps"] == pm.num_steps and "2 prompts" in res["trained_model"]["prompts"]
    rows = {(r["impl"], r["mode"], r["num_steps"]): r for r in res["results"]}
    assert set(rows) == {("cyb_eager", "fixed", 1), ("cyb_eager", "fixed", 3), ("cyb_static", "fixed", 1),
                         ("cyb_static", "fixed", 3), ("cyb_eager", "adaptive", 3),
                         ("cyb_eager_pos", "adaptive", 3), ("cyb_static", "adaptive", 3),
                         ("cyb_static_pos", "adaptive", 3)}
    assert all(r["status"] == "ok" for r in rows.values())
    assert rows[("cyb_static", "adaptive", 3)]["tokens_vs_cyb_eager"]["equal"]
    assert res["agreement_fp32"]["status"] == "skipped"
    assert any("latency M=3" in c["target"] for c in res["targets"])  # the model's M
    assert main(["bench", "decode", "--quick", "--prompts", str(prompts)]) == 2


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
