"""Pause visibility: the reference mask, the layouts' block steps, identity at initialisation
under private pauses, and the block-sparse (FlexAttention) path against the dense mask."""

from __future__ import annotations

import pytest
import torch

from cyb import visibility as vis
from cyb.layout import PauseVocab, expand, expand_variable, insert_pauses, random_pause_slots
from cyb.model import PauseModel
import transformers

from test_model import hf_model, padding_mask, real_ids, tiny_config

M = 3


def brute_visible(token, step, exported, valid):
    """The rule of docs/concepts/layouts.md written as loops."""
    t = len(token)
    out = torch.zeros(t, t, dtype=torch.bool)
    for q in range(t):
        for k in range(t):
            own = token[k] == token[q] and step[k] <= step[q]
            earlier = token[k] < token[q] and exported[k]
            out[q, k] = (valid[k] and (own or earlier)) or q == k
    return out


@pytest.mark.parametrize("visibility", vis.VISIBILITIES)
def test_recipe1_mask_is_the_rule(visibility):
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    steps = vis.recipe1_steps(mask, M)
    got = vis.visible(steps, visibility)
    for r in range(2):
        tok, stp = steps.token[0].tolist(), steps.step[0].tolist()
        exported = [{"shared": True, "gated": True, "private": s == 0}[visibility] for s in stp]
        assert torch.equal(got[r], brute_visible(tok, stp, exported, steps.valid[r].tolist()))


def test_shared_is_causal_over_the_layout():
    steps = vis.recipe1_steps(torch.ones(1, 5, dtype=torch.long), 4)
    t = 20
    assert torch.equal(vis.visible(steps, "shared")[0], torch.ones(t, t, dtype=torch.bool).tril())


def test_private_real_tokens_see_only_real_tokens():
    steps = vis.recipe1_steps(torch.ones(1, 4, dtype=torch.long), M)
    allowed = vis.visible(steps, "private")[0]
    real = torch.arange(12) % M == 0
    sub = allowed[real][:, real]
    assert torch.equal(sub, torch.ones(4, 4, dtype=torch.bool).tril())
    assert not allowed[real][:, ~real].any()  # no real token sees a pause
    # pause (token 2, step 2) sees reals 0..2 and its own block's steps 1..2
    q = 2 * M + 2
    assert allowed[q].nonzero().flatten().tolist() == [0, 3, 6, 7, 8]


def test_variable_and_inserted_steps():
    vocab = PauseVocab(num_steps=3, pause_ids=(50, 51), vocab_size=60)
    ids = torch.tensor([[5, 6, 7]])
    ex = expand_variable(ids, torch.tensor([[2, 0, 1]]), vocab)
    st = ex.steps
    assert st.token[0].tolist() == [0, 0, 0, 1, 2, 2]
    assert st.step[0].tolist() == [0, 1, 2, 0, 0, 1]
    ps = insert_pauses(ids, 50, lambda r, n, target: [1, 2])
    st = ps.steps
    assert ps.input_ids[0].tolist() == [5, 50, 50, 6, 7]
    assert st.token[0].tolist() == [0, 0, 0, 1, 2]
    assert st.step[0].tolist() == [0, 1, 2, 0, 0]


@pytest.mark.parametrize("visibility", vis.VISIBILITIES)
def test_real_first_order_is_a_permutation_with_exported_first(visibility):
    steps = vis.recipe1_steps(torch.ones(2, 5, dtype=torch.long), 4)
    order = vis.real_first_order(steps, visibility)
    assert sorted(order[0].tolist()) == list(range(20))
    exported = steps.exported(visibility)[0][order[0]]
    n = int(exported.sum())
    assert exported[:n].all() and not exported[n:].any()
    x = torch.randn(2, 20, 3)
    assert torch.equal(vis.reorder(vis.reorder(x, order), vis.inverse_order(order)), x)


# --------------------------------------------------------------------------- models


FAMILIES = ("llama", "qwen2", "qwen3", "gemma", "gemma3", "mistral")


@pytest.mark.parametrize("padding", ["none", "right", "left"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("family", FAMILIES)
def test_private_real_stream_is_the_base_model(family, impl, padding):
    """Identity at initialisation: whatever the pause and dk rows hold, the real tokens' step-1
    logits of a private pause model equal the base model's (float32)."""
    base = hf_model(family, impl, window=5)
    ids = real_ids(2, 9, 90)
    mask = padding_mask(padding, 2, 9)
    with torch.no_grad():
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        want = base(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    pm = PauseModel.from_hf(base, num_steps=4, pause_visibility="private")
    with torch.no_grad():
        emb = pm.hf_model.get_input_embeddings().weight
        emb[want.shape[-1]:] = torch.randn_like(emb[want.shape[-1]:]) * 5  # pause and dk rows: anything
        got = pm(ids, attention_mask=mask, return_logits=True).logits[:, :, 0, :want.shape[-1]]
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("visibility", ["private"])
def test_dense_mask_matches_hand_built_mask(visibility):
    """The model's private path equals the decoder run with the reference mask."""
    pm = PauseModel.from_hf(hf_model("llama", "sdpa"), num_steps=M, pause_visibility=visibility)
    ids = real_ids(2, 6, 90)
    mask = padding_mask("right", 2, 6)
    lay = expand(ids, pm.vocab, attention_mask=mask)
    with torch.no_grad():
        got, _ = pm.hidden_states(lay.input_ids, lay.position_ids, lay.attention_mask, steps=lay.steps)
        ref = pm.decoder(input_ids=lay.input_ids, position_ids=lay.position_ids,
                         attention_mask=vis.visible(lay.steps, visibility).unsqueeze(1)).last_hidden_state
    valid = lay.attention_mask.bool()
    torch.testing.assert_close(got[valid], ref[valid])


def test_private_model_needs_the_steps():
    pm = PauseModel.from_hf(hf_model("llama", "sdpa"), num_steps=M, pause_visibility="private")
    lay = expand(real_ids(1, 4, 90), pm.vocab)
    with pytest.raises(ValueError, match="steps"):
        pm.hidden_states(lay.input_ids, lay.position_ids, lay.attention_mask)


def _layout(pm, kind):
    ids = real_ids(2, 7, 90)
    mask = padding_mask("right" if kind == "padded" else "none", 2, 7)
    vocab = pm.vocab
    if kind == "variable":
        counts = torch.randint(0, M, ids.shape, generator=torch.Generator().manual_seed(3))
        return expand_variable(ids, counts, vocab, attention_mask=mask)
    if kind == "inserted":
        g = torch.Generator().manual_seed(4)
        return insert_pauses(ids, vocab.pause_ids[0], lambda r, n, target: random_pause_slots(n, 3, g))
    return expand(ids, vocab, attention_mask=mask)


def _hidden_and_grads(pm, lay, kernel: str, *, grads: bool):
    """The valid positions' hidden states and, with ``grads``, the parameters' gradients of
    their sum of squares, through ``kernel`` ("dense" or "flex")."""
    valid = lay.attention_mask.bool()
    pm.pause_kernel = kernel
    pm.zero_grad()
    with torch.set_grad_enabled(grads):
        hidden, _ = pm.hidden_states(lay.input_ids, lay.position_ids, lay.attention_mask, steps=lay.steps)
    g = []
    if grads:
        hidden[valid].double().square().sum().backward()
        g = [p.grad.double().cpu() for p in pm.parameters() if p.grad is not None]
    return hidden.detach()[valid].double().cpu(), g


def _dense_and_flex(pm, lay, *, grads: bool):
    return [_hidden_and_grads(pm, lay, kernel, grads=grads) for kernel in ("dense", "flex")]


def _to_cuda(pm, lay):
    for name in ("input_ids", "position_ids", "attention_mask", "grid_index", "step_mask", "last_step",
                 "is_pause"):
        if getattr(lay, name, None) is not None:
            setattr(lay, name, getattr(lay, name).cuda())
    return pm.cuda(), lay


def _rel(a, b):
    return ((a - b).norm() / b.norm().clamp(min=1e-12)).item()


LAYOUTS = ["recipe1", "padded", "variable", "inserted"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("visibility", ["private"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_flex_path_matches_dense(family, visibility, layout):
    """The block-sparse path (real-first order, FlexAttention; unfused on the CPU, which has no
    FlexAttention backward) gives the dense mask's hidden states, on odd lengths, with padding,
    sliding-window layers and every layout."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    torch.manual_seed(0)
    pm = PauseModel.from_hf(hf_model(family, "sdpa", window=4), num_steps=M, pause_visibility=visibility)
    dense, flex = _dense_and_flex(pm, _layout(pm, layout), grads=False)
    torch.testing.assert_close(flex[0], dense[0], atol=1e-5, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("visibility", ["private"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_flex_path_matches_dense_on_cuda(family, visibility, layout):
    """The compiled FlexAttention kernel on CUDA: values and gradients as close to the dense mask
    in float64 on the CPU as the dense mask on CUDA is.  (A tiny random Gemma 3's q_norm and
    k_norm gradients lose about a third of their value to float32 rounding on every kernel, the
    CPU's included, so a fixed tolerance against the dense path would measure float32, not
    FlexAttention.)"""
    import copy

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.manual_seed(0)
    # (the FlexAttention kernel needs heads of 16 or more dimensions)
    cfg = tiny_config(family, window=4)
    cfg.hidden_size, cfg.head_dim = 64, 16
    base = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    pm = PauseModel.from_hf(base, num_steps=M, pause_visibility=visibility)
    lay = _layout(pm, layout)
    ref, ref_grads = _hidden_and_grads(copy.deepcopy(pm).double(), lay, "dense", grads=True)
    (dense, dg), (flex, fg) = _dense_and_flex(*_to_cuda(pm, lay), grads=True)
    assert _rel(flex, ref) < 1e-3 and _rel(dense, ref) < 1e-3
    assert len(fg) == len(dg) == len(ref_grads)
    for f, d, r in zip(fg, dg, ref_grads):
        assert _rel(f, r) <= max(1e-2, 2 * _rel(d, r)), (tuple(r.shape), _rel(f, r), _rel(d, r))


@pytest.mark.gpu
def test_flex_kernels_follow_each_models_window_on_cuda():
    """Models with different sliding windows in one process each get their own window (the
    compiled kernels must not reuse one built for another window)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for window in (4, 64, 2):
        torch.manual_seed(0)
        cfg = tiny_config("gemma3", window=window)
        cfg.hidden_size, cfg.head_dim = 64, 16
        base = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
        pm = PauseModel.from_hf(base, num_steps=M, pause_visibility="private")
        for layout in ("recipe1", "padded"):
            (dense, _), (flex, _) = _dense_and_flex(*_to_cuda(pm, _layout(pm, layout)), grads=True)
            assert _rel(flex, dense) < 1e-3, (window, layout, _rel(flex, dense))
