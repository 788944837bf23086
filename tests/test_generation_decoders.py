"""cyb.generation.decoders: the eager decode loops.

Their steps run under the attention kernels for growing caches; the block-adaptive decoder
(adaptive decoding on CUDA) gives the one-position decoder's results; and no decode step reads
a device value back to the host (the engine's steps: tests/test_engine.py).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cyb.generation import generate
from generation_helpers import PROMPTS, build, encode, model, record_growing_attention, same_results

pytestmark = pytest.mark.usefixtures("one_thread")

@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_eager_decode_steps_run_under_the_growing_attention_kernels(monkeypatch, mode):
    from cyb.generation import decoders

    entered = record_growing_attention(monkeypatch, decoders)
    generate(model("llama"), PROMPTS[:1], mode=mode, max_new_tokens=3, eos_token_ids=(), decoder="eager")
    assert len(entered) >= 3 and set(entered) == {"cpu"}


def test_growing_attention_leaves_cpu_alone():
    from contextlib import nullcontext

    from cyb.runtime import growing_attention

    assert isinstance(growing_attention(torch.device("cpu")), nullcontext)


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
    same_results(got, want, whole_blocks=True)


# ----------------------------------------------------------------------------------- host reads


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_decode_steps_read_nothing_back_to_the_host(mode):
    """An eager decode step leaves the device alone: no ``.item()``-like read (on CUDA each would
    wait for the queued work); the one read per step is the caller's (the decisions)."""
    from cyb.decision import row_keys
    from cyb.generation.decoders import AdaptiveDecoder, FixedDecoder, StepReadout
    from cyb.layout import left_pad

    pm = model("llama")
    ids, mask = left_pad([encode(p) for p in PROMPTS], "cpu")
    readout = StepReadout(pm.vocab, pm.dk_bias, sample=True, temperature=0.9, top_p=0.9,
                          keys=torch.tensor(row_keys(len(PROMPTS), seed=0)))
    with torch.inference_mode():
        dec = (FixedDecoder if mode == "fixed" else AdaptiveDecoder)(pm, ids, mask, readout)
    assert _host_reads(dec) == {}


def test_block_adaptive_steps_read_nothing_back_to_the_host():
    from cyb.generation.decoders import BlockAdaptiveDecoder, StepReadout
    from cyb.layout import left_pad

    pm = build("llama", "cyb", scheme="advance")
    ids, mask = left_pad([encode(p) for p in PROMPTS], "cpu")
    dec = BlockAdaptiveDecoder(pm, ids, mask, StepReadout(pm.vocab, pm.dk_bias))
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
