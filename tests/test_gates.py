"""Gated pauses (``pause_visibility: gated``): the bias rule, the model's attention against an
eager-attention reference with a hand-built per-head mask (values and the gates' gradients),
its two limits (an open gate is the shared layout, a shut one the private layout and so the
base model), the block-sparse path, persistence and the errors where it does not apply."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from cyb import visibility as vis
from cyb.layout import expand, expand_variable
from cyb.model import PauseModel, gates

from test_model import hf_model, padding_mask, real_ids

M = 3


def _set_gates(pm, values):
    """Every layer's gate to ``values`` (one per head, or one number)."""
    for p in gates.gate_parameters(pm):
        with torch.no_grad():
            p.copy_(torch.as_tensor(values, dtype=p.dtype).expand_as(p))


def _layout(pm, kind):
    ids = real_ids(2, 6, 90)
    mask = padding_mask("right", 2, 6)
    if kind == "variable":
        counts = torch.randint(0, M, ids.shape, generator=torch.Generator().manual_seed(3))
        return expand_variable(ids, counts, pm.vocab, attention_mask=mask)
    return expand(ids, pm.vocab, attention_mask=mask)


def test_foreign_pauses_are_earlier_tokens_pauses():
    steps = vis.recipe1_steps(torch.ones(1, 3, dtype=torch.long), M)
    foreign = vis.foreign_pauses(steps.token, steps.step)[0]
    tok, stp = steps.token[0].tolist(), steps.step[0].tolist()
    for q in range(9):
        for k in range(9):
            assert foreign[q, k] == (tok[k] < tok[q] and stp[k] > 0)
    assert torch.equal(vis.visible(steps, "gated"), vis.visible(steps, "shared"))


@pytest.mark.parametrize("kind", ["recipe1", "variable"])
def test_gated_attention_matches_an_eager_reference(kind):
    """float64: hidden states and the gates' gradients equal an eager-attention copy of the
    model run with the additive mask ``[B, heads, T, T]`` built by hand (every layer the same
    per-head gate, so the reference gate gets the sum of the layers' gradients), to the float32
    of the eager softmax."""
    torch.manual_seed(0)
    pm = PauseModel.from_hf(hf_model("llama", "sdpa"), num_steps=M, pause_visibility="gated").double()
    heads = pm.config.num_attention_heads
    values = torch.linspace(-3.0, 1.0, heads, dtype=torch.float64)
    _set_gates(pm, values)
    lay = _layout(pm, kind)
    valid = lay.attention_mask.bool()
    hidden, _ = pm.hidden_states(lay.input_ids, lay.position_ids, lay.attention_mask, steps=lay.steps)
    hidden[valid].square().sum().backward()
    got_grad = sum(p.grad for p in gates.gate_parameters(pm))

    ref = copy.deepcopy(pm.hf_model)
    ref.set_attn_implementation("eager")
    gate = values.clone().requires_grad_(True)
    allowed = vis.visible(lay.steps, "shared").unsqueeze(1)
    foreign = vis.foreign_pauses(lay.steps.token, lay.steps.step).unsqueeze(1)
    zero = torch.zeros((), dtype=torch.float64)
    mask = torch.where(allowed, zero, float("-inf")) + torch.where(foreign, gate.view(1, -1, 1, 1), zero)
    out = ref.model(input_ids=lay.input_ids, position_ids=lay.position_ids, attention_mask=mask).last_hidden_state
    out[valid].square().sum().backward()
    torch.testing.assert_close(hidden.detach()[valid], out.detach()[valid], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_grad, gate.grad, atol=1e-5, rtol=1e-5)
    assert gate.grad.abs().min() > 0


def test_open_gates_are_shared_and_shut_gates_private():
    pm = PauseModel.from_hf(hf_model("llama", "sdpa"), num_steps=M, pause_visibility="gated")
    lay = _layout(pm, "recipe1")
    valid = lay.attention_mask.bool()
    with torch.no_grad():
        for value, visibility in ((0.0, "shared"), (float("-inf"), "private")):
            _set_gates(pm, value)
            got, _ = pm.hidden_states(lay.input_ids, lay.position_ids, lay.attention_mask, steps=lay.steps)
            want = pm.decoder(input_ids=lay.input_ids, position_ids=lay.position_ids,
                              attention_mask=vis.visible(lay.steps, visibility).unsqueeze(1)).last_hidden_state
            torch.testing.assert_close(got[valid], want[valid], atol=2e-5, rtol=1e-4)


def test_foreign_attention_is_the_share_an_eager_copy_puts_on_earlier_pauses():
    """float64: the recorded share per layer equals the attention weights of an eager copy run
    with the hand-built gated mask, summed over other tokens' pauses and averaged over the
    queries that have one in view (and the heads); a shut gate records 0, and nothing is recorded
    outside the block."""
    torch.manual_seed(0)
    pm = PauseModel.from_hf(hf_model("llama", "sdpa"), num_steps=M, pause_visibility="gated").double()
    heads = pm.config.num_attention_heads
    values = torch.linspace(-3.0, 1.0, heads, dtype=torch.float64)
    _set_gates(pm, values)
    lay = _layout(pm, "recipe1")
    with torch.no_grad(), gates.foreign_attention(pm.hf_model) as through:
        pm.hidden_states(lay.input_ids, lay.position_ids, lay.attention_mask, steps=lay.steps)
    ref = copy.deepcopy(pm.hf_model)
    ref.set_attn_implementation("eager")
    allowed = vis.visible(lay.steps, "shared").unsqueeze(1)
    foreign = vis.foreign_pauses(lay.steps.token, lay.steps.step).unsqueeze(1)
    zero = torch.zeros((), dtype=torch.float64)
    mask = torch.where(allowed, zero, float("-inf")) + torch.where(foreign, values.view(1, -1, 1, 1), zero)
    with torch.no_grad():
        attn = ref.model(input_ids=lay.input_ids, position_ids=lay.position_ids, attention_mask=mask,
                         output_attentions=True).attentions
    seen = foreign.any(-1).expand(len(lay.input_ids), heads, -1)
    want = [float((a * foreign).sum(-1)[seen].mean()) for a in attn]
    assert through.per_layer() == pytest.approx(want, abs=1e-6) and min(want) > 0.01  # float32 scores
    _set_gates(pm, float("-inf"))
    with torch.no_grad(), gates.foreign_attention(pm.hf_model) as shut:
        pm.hidden_states(lay.input_ids, lay.position_ids, lay.attention_mask, steps=lay.steps)
    assert shut.per_layer() == [0.0] * len(want) and gates._RECORDER is None
    shared = PauseModel.from_hf(hf_model("llama", "sdpa"), num_steps=M)
    with gates.foreign_attention(shared.hf_model) as nothing:
        assert nothing is None and gates._RECORDER is None  # no gates, nothing to record


def test_starting_gates_keep_the_base_model_close():
    """At the starting bias (-8) the real tokens' step-1 logits stay within 1% of the base
    model's, whatever the pause rows hold; a shut gate gives them exactly."""
    torch.manual_seed(0)
    base = hf_model("llama", "sdpa")
    ids = real_ids(2, 9, 90)
    with torch.no_grad():
        want = base(input_ids=ids, position_ids=torch.arange(9).expand(2, 9)).logits
    pm = PauseModel.from_hf(base, num_steps=4, pause_visibility="gated")
    with torch.no_grad():
        emb = pm.hf_model.get_input_embeddings().weight
        emb[want.shape[-1]:] = torch.randn_like(emb[want.shape[-1]:]) * 5
        start = pm(ids, return_logits=True).logits[:, :, 0, :want.shape[-1]]
        _set_gates(pm, float("-inf"))
        shut = pm(ids, return_logits=True).logits[:, :, 0, :want.shape[-1]]
    assert ((start - want).norm() / want.norm()).item() < 1e-2
    torch.testing.assert_close(shut, want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["recipe1", "variable"])
def test_gated_flex_path_matches_dense(kind):
    pytest.importorskip("torch.nn.attention.flex_attention")
    torch.manual_seed(0)
    pm = PauseModel.from_hf(hf_model("llama", "sdpa"), num_steps=M, pause_visibility="gated")
    _set_gates(pm, torch.linspace(-3.0, 1.0, pm.config.num_attention_heads))
    lay = _layout(pm, kind)
    valid = lay.attention_mask.bool()
    out = {}
    with torch.no_grad():
        for kernel in ("dense", "flex"):
            pm.pause_kernel = kernel
            out[kernel] = pm.hidden_states(lay.input_ids, lay.position_ids, lay.attention_mask,
                                           steps=lay.steps)[0][valid]
    torch.testing.assert_close(out["flex"], out["dense"], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("gate_scale", [0.0, 2.0, 30.0])
def test_gated_flex_takes_the_gates_gradient_outside_the_kernel(gate_scale):
    """:func:`cyb.model.attention.gated_flex`: the kernel sees the gate detached, and the gate's
    gradient from a second forward over earlier tokens' pauses equals the explicit softmax's
    (float64), for gates near zero, moderate and far open or shut (FlexAttention on the CPU, where
    it has no backward: the queries, keys and values take no gradient here)."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from cyb.model.attention import gated_flex

    torch.manual_seed(0)
    m, length, b, h, d = M, 7, 2, 3, 8
    t = m * length
    pos = torch.arange(t)
    token, step = (pos // m).view(1, t), (pos % m).view(1, t)
    q, k, v = (torch.randn(b, h, t, d, dtype=torch.float64) for _ in range(3))
    gate = (torch.randn(h, dtype=torch.float64) * gate_scale).requires_grad_()
    mask = create_block_mask(lambda bi, hi, qi, ki: ki <= qi, None, None, t, t, device="cpu", _compile=False)

    def flex(score_mod=None, return_lse=False):
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=mask, return_lse=return_lse)

    foreign = (token.view(t, 1) > token.view(1, t)) & (step.view(1, t) > 0)
    scores = (q @ k.transpose(-1, -2)) * d ** -0.5 + torch.where(foreign, gate.view(1, h, 1, 1), 0.0)
    want = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf")).softmax(-1) @ v
    grad = torch.randn_like(want)
    got = gated_flex(flex, gate, token, step)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    (want_dgate,) = torch.autograd.grad(want, gate, grad)
    (dgate,) = torch.autograd.grad(got, gate, grad)
    torch.testing.assert_close(dgate, want_dgate, atol=1e-10, rtol=1e-10)
    with torch.no_grad():  # the values alone
        torch.testing.assert_close(gated_flex(flex, gate, token, step), want, atol=1e-10, rtol=1e-10)


def test_flex_kernel_options_take_the_backward_tiles_up_to_their_head_size():
    """FlexAttention's options: the kernel's own choice off CUDA, the forward tiles on CUDA, and
    the backward tiles too at head sizes up to the one they were measured at."""
    from cyb.model import attention

    assert attention.kernel_options(torch.device("cpu"), 64) is None
    cuda = torch.device("cuda")
    small, large = attention.kernel_options(cuda, 64), attention.kernel_options(cuda, 128)
    assert small == {**attention.FORWARD_TILES, **attention.BACKWARD_TILES}
    assert large == attention.FORWARD_TILES and large is not attention.FORWARD_TILES


@pytest.mark.gpu
def test_gated_flex_matches_dense_on_cuda():
    """The compiled FlexAttention kernel with the gate as a learned score bias: values and the
    gates' gradients as the dense path's on CUDA."""
    import transformers

    from test_model import tiny_config

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.manual_seed(0)
    cfg = tiny_config("llama")
    cfg.hidden_size, cfg.head_dim = 64, 16
    base = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    pm = PauseModel.from_hf(base, num_steps=M, pause_visibility="gated").cuda()
    _set_gates(pm, torch.linspace(-3.0, 1.0, pm.config.num_attention_heads))
    lay = _layout(pm, "recipe1")
    lay.input_ids, lay.position_ids, lay.attention_mask = (x.cuda() for x in (lay.input_ids, lay.position_ids,
                                                                              lay.attention_mask))
    valid = lay.attention_mask.bool()
    out, grads = {}, {}
    for kernel in ("dense", "flex"):
        pm.pause_kernel = kernel
        pm.zero_grad()
        hidden, _ = pm.hidden_states(lay.input_ids, lay.position_ids, lay.attention_mask, steps=lay.steps)
        hidden[valid].square().sum().backward()
        out[kernel] = hidden.detach()[valid]
        grads[kernel] = torch.stack([p.grad for p in gates.gate_parameters(pm)])
    torch.testing.assert_close(out["flex"], out["dense"], atol=1e-4, rtol=1e-3)
    torch.testing.assert_close(grads["flex"], grads["dense"], atol=1e-4, rtol=1e-3)


def test_gates_save_and_load(tmp_path):
    pm = PauseModel.from_hf(hf_model("llama", "sdpa"), num_steps=M, pause_visibility="gated")
    _set_gates(pm, torch.linspace(-2.5, 0.5, pm.config.num_attention_heads))
    pm.save_pretrained(tmp_path / "m")
    loaded = PauseModel.from_pretrained(tmp_path / "m")
    assert loaded.pause_visibility == "gated"
    assert torch.equal(gates.gate_values(loaded.hf_model), gates.gate_values(pm.hf_model))


def test_gated_models_generate():
    """Gated models decode with a cache (the engine tags every column that holds a pause and
    adds the gates to other tokens' pauses) and without one (the eager decoder recomputes the
    row every step): with open gates (0) both make the shared model's decisions, with shut ones
    (minus infinity) the private model's; fixed and adaptive mode, greedy and sampled, prompts
    of several lengths, rows that end early."""
    import dataclasses

    import generation_helpers as gh
    from cyb.generation import generate

    shared = gh.build("llama", "cyb")
    prompts = [gh.encode(p) for p in gh.PROMPTS]

    def as_(visibility):
        settings = dataclasses.replace(shared.settings, pause_visibility=visibility)
        return PauseModel(copy.deepcopy(shared.hf_model), settings, shared.tokenizer).eval()

    gated, private = as_("gated"), as_("private")
    for value, reference in ((0.0, shared), (float("-inf"), private)):
        _set_gates(gated, value)
        # (sampled, and with an end token the random model emits early: rows leave the batch)
        for mode, kw in itertools.product(("fixed", "adaptive"), ({}, {"sample": True, "seed": 3},
                                                                   {"eos_token_ids": [7]})):
            want = generate(reference, prompts, mode=mode, max_new_tokens=5, **kw)
            for decoder in ("static", "eager"):
                got = generate(gated, prompts, mode=mode, max_new_tokens=5, decoder=decoder, **kw)
                if reference is shared:
                    gh.same_results(got, want)
                else:  # (the private model's cache holds real tokens only: other positions)
                    assert [(g.token_ids, g.steps, g.text) for g in got] == \
                        [(w.token_ids, w.steps, w.text) for w in want]


def test_gated_models_refuse_what_they_cannot_do():
    from cyb.config import ConfigError, RunConfig

    with pytest.raises(ValueError, match="sdpa"):
        PauseModel.from_hf(hf_model("llama", "eager"), num_steps=M, pause_visibility="gated")
    with pytest.raises(ConfigError, match="lora"):
        RunConfig.from_dict({"model": {"name_or_path": "x"}, "method": {"pause_visibility": "gated"},
                             "data": {"task": "addition"}, "lora": {"rank": 4}}).validate()


def test_a_run_starts_its_gates_where_configured(tmp_path):
    """``method.pause_gate_init`` sets fresh gates; a model saved gated keeps its trained ones."""
    from cyb.build import build_model
    from cyb.train import Trainer
    from test_train import tiny_cfg

    cfg = tiny_cfg(tmp_path / "run", method={"pause_visibility": "gated", "pause_gate_init": -3.0})
    trainer = Trainer(cfg)
    assert torch.all(gates.gate_values(trainer.model.hf_model) == -3.0)
    saved = tmp_path / "saved"
    _set_gates(trainer.model, 1.5)
    trainer.model.save_pretrained(saved)
    again = tiny_cfg(tmp_path / "run2", method={"pause_visibility": "gated"}, model={"name_or_path": str(saved)})
    model = build_model(again, trainer.tokenizer)
    assert model.gates_loaded and torch.all(gates.gate_values(model.hf_model) == 1.5)


def test_annealed_gates_open_on_their_schedule(tmp_path):
    """``method.pause_gate_anneal_steps``: the gates are not trained, their bias rises linearly
    from the start to 0 (the shared layout) and stays there."""
    from cyb.train import Trainer
    from test_train import tiny_cfg

    assert gates.annealed_bias(-8.0, 4, 1) == -6.0 and gates.annealed_bias(-8.0, 4, 9) == 0.0
    cfg = tiny_cfg(tmp_path / "run", method={"pause_visibility": "gated", "pause_gate_anneal_steps": 8})
    trainer = Trainer(cfg)
    assert not any(p.requires_grad for p in gates.gate_parameters(trainer.model))
    for want in (-7.0, -6.0):
        trainer.train_step()
        assert torch.all(gates.gate_values(trainer.model.hf_model) == want)
