"""The engine's fused small operations (:mod:`cyb.engine.fused`): the same outputs as the model's
own modules, inside the context only; the options that ask for them."""

from __future__ import annotations

import sys

import pytest
import torch

from cyb.engine import Engine, EngineOptions, Request
from cyb.engine.fused import ROTARY, fusable, fused_small_ops
from engine_helpers import layout_model, sliding_model


def _hidden(pm, ids):
    pos = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.no_grad():
        return pm.decoder(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state


@pytest.mark.parametrize("make", [lambda: layout_model("shared"), lambda: sliding_model("gemma3", "shared", "sdpa")],
                         ids=["llama", "gemma3"])
def test_fused_small_ops_give_the_modules_outputs_inside_the_context_only(make):
    pm = make()
    layers = len(pm.decoder.layers)
    mods = fusable(pm)
    norms = [m for m in mods if type(m).__name__.endswith("RMSNorm")]
    assert len(mods) - len(norms) == layers  # one gated MLP a layer
    assert len(norms) >= 2 * layers + 1  # (Gemma 3 has four a layer, and per-head q and k norms)
    home = sys.modules[type(pm.decoder.layers[0].self_attn).__module__]
    rotary = getattr(home, ROTARY)
    ids = torch.randint(3, 40, (2, 7))
    want = _hidden(pm, ids)
    with fused_small_ops(pm):
        assert all("forward" in m.__dict__ for m in mods)
        assert getattr(home, ROTARY) is not rotary
        got = _hidden(pm, ids)
    assert all("forward" not in m.__dict__ for m in mods)
    assert getattr(home, ROTARY) is rotary
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_fused_kernels_need_cuda_graphs():
    pm = layout_model("shared")
    req = Request((5, 6, 7), 4, mode="fixed")
    with pytest.raises(ValueError, match="fused kernels apply to decoding steps captured as CUDA graphs"):
        Engine.sized_for(pm, [req], options=EngineOptions(fused=True))
    with pytest.raises(ValueError, match="fused must be True, False or None"):
        EngineOptions(fused=1)
    assert not Engine.sized_for(pm, [req]).runner.fused  # (no graphs on the CPU: nothing to fuse)


def test_warm_up_on_the_cpu_captures_nothing():
    pm = layout_model("shared")
    engine = Engine.sized_for(pm, [Request((5, 6, 7), 4, mode="fixed")])
    engine.warm_up()
    assert engine.runner.graphs == {}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("visibility", ["shared", "private", "gated"])
def test_fused_engine_compiles_at_warm_up_and_gives_the_plain_engines_tokens(visibility):
    """After :meth:`Engine.warm_up` a fused engine compiles nothing more while rows of 1 to 3
    come and go (and, where steps attend per row, captures no graph more), and decides what the
    engine without fused kernels decides (float32)."""
    from torch._dynamo.utils import counters

    from generation_helpers import PROMPTS, encode

    pm = layout_model(visibility).to("cuda")
    reqs = [Request(tuple(encode(p)), 9, mode=mode) for p in PROMPTS for mode in ("fixed", "adaptive")]
    out = {}
    for fused in (True, False):
        engine = Engine.sized_for(pm, reqs, options=EngineOptions(max_slots=3, prefill_chunk=4, fused=fused))
        engine.warm_up()
        assert engine.runner.fused == fused
        compiled = counters["stats"]["unique_graphs"]
        captured = set(engine.runner.graphs)
        ids = {engine.submit(r): i for i, r in enumerate(reqs)}
        got = {i: [] for i in ids.values()}
        for e in engine.run():
            got[ids[e.request]].append((e.token, e.steps))
        assert counters["stats"]["unique_graphs"] == compiled  # nothing compiled while rows decoded
        if engine.runner.row_attention:
            assert set(engine.runner.graphs) == captured  # nor captured
        out[fused] = got
    assert out[True] == out[False]


def test_fused_small_ops_trace_through_unmerged_lora_adapters():
    """A served model may keep its LoRA adapters unmerged: the compiled MLPs run them too."""
    peft = pytest.importorskip("peft")
    pm = layout_model("shared")
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["gate_proj", "up_proj", "q_proj"])
    lora = peft.get_peft_model(pm.hf_model, cfg)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    ids = torch.randint(3, 40, (2, 7))
    want = _hidden(pm, ids)
    with fused_small_ops(pm):
        got = _hidden(pm, ids)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.equal(want, _hidden(layout_model("shared"), ids))  # the adapters changed the model
