"""Decoding with private pauses: a cache of real tokens only, equal to recomputing without a
cache; adaptive mode making fixed mode's decisions; eager, sparse decoders and the engine alike."""

from __future__ import annotations

import pytest
import torch
import transformers

from cyb.data.synthetic import CharTokenizer
from cyb.decision import row_keys
from cyb.generation import generate
from cyb.generation.decoders import StepReadout
from cyb.generation.private import PrivateBlockDecoder, PrivateSparseDecoder
from cyb.layout import left_pad
from cyb.model import PauseModel

TOK = CharTokenizer().to_hf()
PROMPTS = ["12+34=", "hello world", "a", "xyz 7"]
SHORT = ["a", "bc"]  # prompts shorter than M - 1

pytestmark = pytest.mark.usefixtures("one_thread")


def build(family="llama", *, m=3, scheme="shared", seed=0, dk_scale=0.3, psi_dk=0.5) -> PauseModel:
    common = dict(vocab_size=len(TOK), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  initializer_range=0.3, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2)
    if family == "llama":
        cfg, impl = transformers.LlamaConfig(**common), None
    elif family == "gemma3":
        cfg, impl = transformers.Gemma3TextConfig(**common, head_dim=8, sliding_window=4,
                                                  layer_types=["sliding_attention", "full_attention"]), "eager"
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    pm = PauseModel.from_config(cfg, CharTokenizer().to_hf(), num_steps=m, psi_dk=psi_dk,
                                position_scheme=scheme, pause_visibility="private",
                                attn_implementation=impl).eval()
    with torch.no_grad():
        w = pm.hf_model.get_output_embeddings().weight
        w[pm.settings.dk_id] = torch.randn(w.shape[1]) * dk_scale
    return pm


def encode(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def recomputed(pm: PauseModel, prompt_ids: list[int], n: int) -> tuple[list[int], list[int]]:
    """Greedy tokens and stop steps by a full forward (no cache) of the prompt and the tokens so
    far, read out at the last token's block."""
    ids = list(prompt_ids)
    readout = StepReadout(pm.vocab, pm.dk_bias)
    tokens, steps = [], []
    for _ in range(n):
        out = pm(torch.tensor([ids]), return_logits=True)
        dec = readout.block(out.logits[:, -1])
        tokens.append(int(dec.token))
        steps.append(int(dec.steps))
        ids.append(tokens[-1])
    return tokens, steps


@pytest.mark.parametrize("scheme", ["shared", "advance"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_eager_decoding_equals_recomputation(family, scheme):
    pm = build(family, scheme=scheme)
    results = generate(pm, PROMPTS, max_new_tokens=6, eos_token_ids=(), decoder="eager")
    steps_seen = set()
    for prompt, res in zip(PROMPTS, results):
        tokens, steps = recomputed(pm, res.prompt_ids, 6)
        assert res.token_ids == tokens
        assert res.steps == steps
        steps_seen.update(steps)
    assert len(steps_seen) > 1  # the test model both pauses and answers


@pytest.mark.parametrize("sample", [False, True])
@pytest.mark.parametrize("decoder", ["eager", "static"])
def test_adaptive_mode_makes_fixed_modes_decisions(decoder, sample):
    pm = build()
    kw = dict(max_new_tokens=8, eos_token_ids=(), decoder=decoder, sample=sample, seed=3)
    fixed = generate(pm, PROMPTS, mode="fixed", **kw)
    adaptive = generate(pm, PROMPTS, mode="adaptive", **kw)
    for f, a in zip(fixed, adaptive):
        assert a.token_ids == f.token_ids and a.steps == f.steps
        for df, da, s in zip(f.d, a.d, a.steps):
            assert da[:s - 1] == pytest.approx(df[:s - 1], abs=1e-6)


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
@pytest.mark.parametrize("sample", [False, True])
def test_engine_and_sparse_decoder_equal_the_block_decoder(mode, sample):
    pm = build()
    kw = dict(max_new_tokens=7, eos_token_ids=(), mode=mode, sample=sample, seed=5)
    eager = generate(pm, PROMPTS, decoder="eager", **kw)
    static = generate(pm, PROMPTS, decoder="static", **kw)
    for e, s in zip(eager, static):
        assert s.token_ids == e.token_ids and s.steps == e.steps
    ids, mask = left_pad([encode(p) for p in PROMPTS])
    runs = []
    for cls in (PrivateBlockDecoder, PrivateSparseDecoder):
        keys = torch.tensor(row_keys(len(PROMPTS), seed=11))
        readout = StepReadout(pm.vocab, pm.dk_bias, sample=sample, keys=keys)
        dec = cls(pm, ids, mask, readout, mode="adaptive")
        outs = [dec.start()] + [dec.step() for _ in range(6)]
        runs.append([(o.token.tolist(), o.steps.tolist()) for o in outs])
    assert runs[0] == runs[1]


@pytest.mark.parametrize("decoder", ["eager", "static"])
def test_prompts_shorter_than_a_block(decoder):
    pm = build(m=4)
    results = generate(pm, SHORT, max_new_tokens=4, eos_token_ids=(), decoder=decoder)
    for res in results:
        assert res.token_ids == recomputed(pm, res.prompt_ids, 4)[0]


def test_cache_holds_real_tokens_only():
    pm = build(m=4)
    ids, mask = left_pad([encode(p) for p in PROMPTS])
    readout = StepReadout(pm.vocab, pm.dk_bias)
    for cls in (PrivateBlockDecoder, PrivateSparseDecoder):
        dec = cls(pm, ids, mask, readout, mode="adaptive")
        dec.start()
        for _ in range(5):
            dec.step()
        assert dec.cache.get_seq_length() == ids.shape[1] + 5


def test_sparse_decoder_runs_pauses_only_where_asked():
    pm = build(dk_scale=0.05, psi_dk=None)  # dk is rare
    results = generate(pm, PROMPTS, mode="adaptive", max_new_tokens=6, eos_token_ids=(),
                       decoder="eager")
    for res in results:
        fixed_cost = len(res.prompt_ids) + 6 * pm.num_steps
        assert res.positions < fixed_cost
        # one position per token, M for a token that paused (the first decision is in the prompt pass)
        paused = sum(1 for s in res.steps[1:] if s > 1)
        assert res.positions == len(res.prompt_ids) + pm.num_steps - 1 + 5 + paused * (pm.num_steps - 1)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_private_decode_steps_run_under_the_growing_attention_kernels(monkeypatch, mode, sparse):
    """Every forward of the real-token decoders (prompt and steps) avoids kernels that plan anew
    for every key length (cuDNN attention on CUDA), as the other eager decoders do."""
    from cyb.generation import private
    from generation_helpers import record_growing_attention

    entered = record_growing_attention(monkeypatch, private)
    pm = build()
    ids = torch.tensor([encode(PROMPTS[0])])
    dec = private.private_decoder(pm, ids, torch.ones_like(ids), StepReadout(pm.vocab, pm.dk_bias),
                                  mode=mode, sparse=sparse if mode == "adaptive" else None)
    with torch.no_grad():
        dec.start()
        for _ in range(3):
            dec.step()
    assert len(entered) >= 4 and set(entered) == {"cpu"}
