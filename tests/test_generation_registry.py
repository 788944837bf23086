"""cyb.generation.registry: what each decoder name means for a model, the errors of names that
cannot run it, and the class :func:`make_decoder` builds for each mode and readout."""

from __future__ import annotations

import pytest
import torch

from cyb.generation import GenerationConfig, generate
from generation_helpers import PROMPTS, encode, model

pytestmark = pytest.mark.usefixtures("one_thread")

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
