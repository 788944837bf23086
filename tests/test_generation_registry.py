"""cyb.generation.registry: what each decoder name means for a model, the errors of names that
cannot run it, and the eager class :func:`make_decoder` builds for each mode."""

from __future__ import annotations

import pytest

from cyb.generation import GenerationConfig, generate
from generation_helpers import PROMPTS, encode, model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_decoder_choice():
    from cyb.generation.registry import resolve_decoder

    llama, gemma = model("llama"), model("gemma2")  # gemma2: sliding-window layers
    assert resolve_decoder(llama, "auto") == "static"  # the engine without graphs: no CUDA here
    assert resolve_decoder(llama, "static") == "static"
    assert resolve_decoder(gemma, "auto") == "static"  # the engine cuts the windows itself
    with pytest.raises(ValueError, match="needs the model on a CUDA device"):
        resolve_decoder(llama, "graph")
    with pytest.raises(ValueError, match="needs the model on a CUDA device"):
        generate(gemma, "a", decoder="graph")
    with pytest.raises(ValueError, match="decoder must be one of"):
        GenerationConfig(decoder="fast")
    assert GenerationConfig().decoder == "auto"


def test_make_decoder_picks_the_eager_class_of_each_mode():
    from cyb.generation import registry
    from cyb.generation.decoders import AdaptiveDecoder, BlockAdaptiveDecoder, FixedDecoder
    from cyb.layout import left_pad

    pm = model("llama")
    ids, mask = left_pad([encode(p) for p in PROMPTS], "cpu")

    def cls(mode, model=pm, **kw):
        return type(registry.make_decoder(model, ids, mask, mode=mode, **kw))

    assert registry.DECODERS == ("auto", *registry.REGISTRY) and registry.DEFAULT == "auto"
    assert cls("fixed") is FixedDecoder
    assert cls("adaptive") is AdaptiveDecoder  # on a CPU: one position per step
    assert cls("adaptive", one_position=False) is BlockAdaptiveDecoder
    assert cls("adaptive", model=model("gemma2"), one_position=None) is AdaptiveDecoder
    with pytest.raises(ValueError, match="mode must be one of"):
        registry.make_decoder(pm, ids, mask, mode="fast")
    assert registry.describe().startswith("graph = ") and "auto = graph on CUDA" in registry.describe()
