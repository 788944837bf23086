"""The pieces of the size benchmark: the named model shapes, the jobs, the engine features asked
in one place, the slots of a whole-row cache, and one job through the engine."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cyb.bench import engine_features
from cyb.bench.jobs import JOBS, make_job
from cyb.bench.models import NAMED_CONFIGS, build_named_model, named_config, wrap
from cyb.bench.size_runs import engine_job, today_slots

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name, params, layers, kv_bytes_per_token", [
    ("llama-134m", 135.3e6, 12, 36864), ("smollm2-360m", 361.8e6, 32, 40960),
    ("smollm2-1.7b", 1711.4e6, 24, 196608), ("gemma3-1b", 999.9e6, 26, 26624)])
def test_named_models_have_their_real_shapes(name, params, layers, kv_bytes_per_token):
    from transformers import AutoModelForCausalLM

    config = named_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    count = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert count == pytest.approx(params, rel=1e-3)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    assert 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 2 == kv_bytes_per_token
    assert config.num_hidden_layers == layers
    if name == "gemma3-1b":  # five sliding-window layers of 512 positions to one global layer
        assert config.sliding_window == 512 and config.layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"]
    with pytest.raises(ValueError, match="model must be one of"):
        named_config("llama-7b")


def test_named_model_is_built_spread_and_seeded():
    a = build_named_model("tiny", dtype=torch.float32, device="cpu", seed=3)
    b = build_named_model("tiny", dtype=torch.float32, device="cpu", seed=3)
    w = a.get_input_embeddings().weight
    assert torch.equal(w, b.get_input_embeddings().weight)
    assert w.std().item() == pytest.approx(2.0 / w.shape[1] ** 0.5, rel=0.1)
    assert set(NAMED_CONFIGS) >= {"llama-134m", "smollm2-360m", "smollm2-1.7b", "gemma3-1b"}


def test_jobs_have_their_form_and_are_seeded():
    for name, spec in JOBS.items():
        assert spec.max_model_len == 4096 and spec.concurrency == 256
    few = make_job("fewshot", 1000, requests=50)
    prefix = few.prompts[0][:1500]
    assert all(p[:1500] == prefix and 50 <= len(p) - 1500 <= 200 for p in few.prompts)
    assert all(1 <= n <= 32 for n in few.answers) and JOBS["fewshot"].requests == 2000
    ev = make_job("eval", 1000, requests=40)
    assert all(1000 <= len(p) <= 3000 and max(p) < 1000 for p in ev.prompts)
    assert make_job("mixed", 1000, requests=8).items == make_job("mixed", 1000, requests=8).items
    assert make_job("mixed", 1000, requests=8, seed=1).items != make_job("mixed", 1000, requests=8).items
    s = make_job("mixed", 1000, requests=8).summary()
    assert s["requests"] == 8 and s["prompt_range"] == [16, 512] and s["shared_prefix"] == 0
    with pytest.raises(ValueError, match="job must be one of mixed, eval, fewshot"):
        make_job("chat", 1000)


def test_options_the_engine_lacks_are_dropped_and_taken_when_it_has_them(monkeypatch):
    import cyb.engine

    opts, dropped = engine_features.engine_options(max_slots=4, block_size=None, prefix_caching=None)
    assert opts.max_slots == 4 and dropped == []
    real = cyb.engine.EngineOptions

    @dataclasses.dataclass(frozen=True)
    class Whole:  # an engine of whole rows: no blocks, no prefix cache
        max_slots: int = 256
        cache_bytes: int | None = None

    for has in (False, True):
        monkeypatch.setattr(cyb.engine, "EngineOptions", real if has else Whole)
        opts, dropped = engine_features.engine_options(max_slots=4, block_size=32, prefix_caching=False)
        fields = engine_features.features()
        assert fields["paged"] is has
        assert fields["options"] == {"block_size": has, "prefix_caching": has, "step_budget": has}
        if has:
            assert dropped == [] and opts.block_size == 32 and opts.prefix_caching is False
        else:
            assert dropped == ["block_size", "prefix_caching"] and not hasattr(opts, "block_size")
    with pytest.raises(TypeError):
        engine_features.engine_options(max_slots=4, no_such_field=1)
    assert engine_features.prefix_hit_rate({"prefix_hit_blocks": 3, "prefix_lookup_blocks": 4}) == 0.75
    assert engine_features.prefix_hit_rate({"steps": 9}) is None


@pytest.fixture(scope="module")
def tiny():
    return build_named_model("tiny", dtype=torch.float32, device="cpu")


@pytest.mark.parametrize("method, steps", [("baseline", 1), ("tbys", 3)])
def test_today_slots_is_what_whole_rows_of_max_model_len_hold(tiny, method, steps):
    from cyb.engine.cache import bytes_per_column

    pm = wrap(tiny, method, steps)
    # a row of 64 real tokens: a one-token prompt and 63 decided tokens' blocks (M columns each
    # under shared pauses), plus two steps of slack, rounded up to whole 128-column rows, plus
    # the scratch columns
    columns = pm_capacity(pm, 64)
    assert columns == 63 * steps
    row = (-(-(columns + 2 * steps) // 128) * 128 + steps) * bytes_per_column(pm)
    for cache in (1_000_000, 4_000_000):
        assert today_slots(pm, 64, cache, steps) == cache // row


def pm_capacity(pm, max_model_len):
    from cyb.engine.layout import RowLayout

    return RowLayout.of(pm.vocab, pm.pause_visibility).columns_needed(1, max_model_len - 1)


def test_engine_job_counts_a_gap_per_token_and_the_slots_in_use(tiny):
    pm = wrap(tiny, "baseline", 1)
    items = [([1, 2, 3], 4), ([4, 5], 1), ([6], 3), ([7, 8, 9, 10], 2), ([11], 5)]
    r = engine_job(pm, items, mode="fixed", max_model_len=32, slots=2, cache_bytes=1 << 20, clients=3,
                   keep_tokens=True)
    assert r["failed"] == 0 and r["finished"] == 5 and r["real_tokens"] == 15
    assert [len(t) for t in r["tokens"]] == [4, 1, 3, 2, 5]
    assert r["slots_in_use_peak"] == 2 and r["slots_in_use_mean_queued"] is not None  # 3 clients, 2 slots
    assert r["stats"]["steps"] >= 15 / 2 and r["today_slots"] >= r["slots"] == 2
    # the same tokens at one client and whatever cache
    again = engine_job(pm, items, mode="fixed", max_model_len=32, slots=4, cache_bytes=1 << 22, clients=1,
                       keep_tokens=True)
    assert again["tokens"] == r["tokens"] and again["slots_in_use_peak"] == 1
    stopped = engine_job(pm, items, mode="fixed", max_model_len=32, slots=2, cache_bytes=1 << 20, deadline=0.0)
    assert stopped["stopped_early"] and stopped["finished"] < 5
