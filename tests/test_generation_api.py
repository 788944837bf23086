"""cyb.generation.api: :func:`generate` and :func:`stream`.

Cache against recompute (references below recompute every step from scratch without a cache and
implement the sequential decision directly, not through :mod:`cyb.decision`), batching, stopping,
sampling, the results' contents, one forward per token, bad input.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from cyb.generation import GenerationConfig, GenerationResult, generate, stream
from cyb.layout import expand, expand_variable
from cyb.model import PauseModel
from generation_helpers import PROMPTS, RARE, build, encode, model

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------ references (no cache)


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


# --------------------------------------------------------------------------- cache vs recompute


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


# ------------------------------------------------------------------------------------- batching


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


# ------------------------------------------------------------------------------------- stopping


def test_max_new_tokens_and_eos():
    pm = model("llama")
    [res] = generate(pm, "hello world", max_new_tokens=7, eos_token_ids=())
    assert len(res.token_ids) == 7 and res.stop_reason == "length"
    eos = res.token_ids[3]
    first = res.token_ids.index(eos)
    [stopped] = generate(pm, "hello world", max_new_tokens=7, eos_token_ids=(eos,))
    assert stopped.token_ids == res.token_ids[: first + 1]  # the EOS is kept
    assert stopped.stop_reason == "eos"


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


# ------------------------------------------------------------------------------------- sampling


def test_sampling_is_reproducible_and_temperature_zero_is_greedy():
    pm = model("llama")
    opts = dict(sample=True, temperature=0.8, top_k=10, top_p=0.9, max_new_tokens=10, eos_token_ids=())
    for mode in ("fixed", "adaptive"):
        a = generate(pm, PROMPTS, mode=mode, seed=3, **opts)
        b = generate(pm, PROMPTS, mode=mode, seed=3, **opts)
        assert [r.token_ids for r in a] == [r.token_ids for r in b]
        assert [r.steps for r in a] == [r.steps for r in b]
        c = generate(pm, PROMPTS, mode=mode, generator=torch.Generator().manual_seed(3), **opts)
        d = generate(pm, PROMPTS, mode=mode, generator=torch.Generator().manual_seed(3), **opts)
        assert [r.token_ids for r in c] == [r.token_ids for r in d]  # streams drawn from the generator
        # prompt i of a seeded call draws from the stream of (seed, i), whatever its neighbours,
        # the batch or the decoder
        for others in ([PROMPTS[0]], [PROMPTS[0], "zzz", "q"]):
            for decoder, batch in (("static", 1), ("static", 8), ("eager", 8)):
                got = generate(pm, others, mode=mode, seed=3, decoder=decoder, max_batch=batch, **opts)[0]
                assert (got.token_ids, got.steps) == (a[0].token_ids, a[0].steps)
        greedy = generate(pm, PROMPTS, mode=mode, max_new_tokens=10, eos_token_ids=())
        cold = generate(pm, PROMPTS, mode=mode, sample=True, temperature=0.0, seed=1,
                        max_new_tokens=10, eos_token_ids=())
        assert [r.token_ids for r in cold] == [r.token_ids for r in greedy]
        assert [r.steps for r in cold] == [r.steps for r in greedy]


# ------------------------------------------------------------------------------ result contents


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


@pytest.mark.parametrize("decoder", ["static", "eager"])
def test_one_forward_per_token_in_fixed_mode(decoder):
    """Fixed mode: the prompt in one forward, then one forward of ``M`` positions per token;
    adaptive mode: one position per forward after the prompt.  The engine (``static``) writes
    the prompt but its last token, whose block is its first decoding step."""
    pm = model("llama")
    calls = []
    hook = pm.decoder.register_forward_pre_hook(
        lambda mod, args, kw: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    try:
        [res] = generate(pm, "12+34=", mode="fixed", max_new_tokens=6, eos_token_ids=(), decoder=decoder)
        if decoder == "eager":  # <bos> and prompt, then one block of M per token
            assert calls == [(1, 7 * 3)] + [(1, 3)] * 5
        else:
            assert calls == [(1, 6 * 3)] + [(1, 3)] * 6
        calls.clear()
        [res] = generate(pm, "12+34=", mode="adaptive", max_new_tokens=6, eos_token_ids=(), decoder=decoder)
        if decoder == "eager":
            assert calls == [(1, 6 * 3 + 1)] + [(1, 1)] * (sum(res.steps) - 1)
        else:
            assert calls == [(1, 6 * 3)] + [(1, 1)] * sum(res.steps)
    finally:
        hook.remove()


# --------------------------------------------------------------------------------------- errors


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
