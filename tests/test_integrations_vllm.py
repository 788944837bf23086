"""cyb.integrations.vllm without vLLM: the prompt layout, the steps read back from an output,
the refusals, the readout's decisions against cyb.decision, the readout's per-request state,
and the engine arguments set for a cyb folder.  (vLLM itself: test_integrations_vllm_engine.py.)"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from cyb.decision import greedy_decision, row_keys, sample_decision, stream_uniforms
from cyb.integrations.vllm import ServedPauses, Unservable, real_tokens, steps_per_token
from cyb.integrations.vllm import decisions, engine_args, readout, readout_v1
from cyb.integrations.vllm.pauses import mode_error, refusal, settings_of
from vllm_helpers import M, build, save_run, tokenizer

SHARED = ServedPauses(3, (10, 11), 12, 1.5, "shared")
ADVANCE = ServedPauses(3, (10, 10), 12, 1.5, "advance")


def test_prompts_are_laid_out_as_training_laid_them_out():
    assert SHARED.layout([5, 6, 7]) == [5, 10, 11, 6, 10, 11, 7]
    assert ADVANCE.layout([5, 6]) == [5, 10, 10, 6]
    assert SHARED.layout([5]) == [5]
    with pytest.raises(ValueError, match="prompt token 1 is id 12, reserved for pauses"):
        SHARED.layout([5, 12])
    with pytest.raises(ValueError, match="empty"):
        SHARED.layout([])


def test_default_modes_and_the_mode_each_layout_allows():
    assert SHARED.default_mode == "fixed" and ADVANCE.default_mode == "adaptive"
    assert dataclasses.replace(ADVANCE, dk_id=None).default_mode == "fixed"  # TBYS reads out at step M
    assert SHARED.mode_error("fixed") is None and ADVANCE.mode_error("adaptive") is None
    assert "per-request position offsets" in SHARED.mode_error("adaptive")
    assert "cyb serve" in SHARED.mode_error("adaptive")
    assert "must be one of fixed, adaptive" in mode_error("greedy", False)
    assert ServedPauses(1, (), None, 0.0, "shared").mode_error("adaptive") is None  # no pauses, no offsets


def test_steps_are_read_from_the_pauses_or_the_codes():
    ids = [10, 20, 21, 10, 11, 22, 10]  # 20 after a pause, 21 at once, 22 after two, a pause left over
    assert real_tokens(ids, (10, 11)) == [20, 21, 22]
    assert steps_per_token(ids, (10, 11)) == [2, 1, 3]
    # fixed mode feeds every pause: the steps are in the codes (each token's logprob)
    fixed = [10, 11, 20, 10, 11, 21]
    assert steps_per_token(fixed, (10, 11), [0.0, 0.0, 1.0, 0.0, 0.0, 2.9999]) == [1, 3]
    with pytest.raises(ValueError, match="no step in codes"):
        steps_per_token(fixed, (10, 11), [0.0] * 6)
    with pytest.raises(ValueError, match="one value per output token"):
        steps_per_token(fixed, (10, 11), [1.0])


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tokenizer(tmp_path_factory.mktemp("tok"))


def test_models_vllm_cannot_run_are_refused_in_one_line(tok, tmp_path):
    for visibility, words in (("private", "hides other tokens' pauses"), ("gated", "adds a learned gate")):
        folder = tmp_path / visibility
        build(tok, visibility=visibility).save_pretrained(folder)
        why = refusal(folder, settings_of(folder))
        assert words in why and "cyb serve" in why and "\n" not in why
    folder = tmp_path / "shared"
    build(tok).save_pretrained(folder)
    assert refusal(folder, settings_of(folder)) is None
    for name, words in (("cyb_lora.json", "LoRA adapters"), ("pause_adapters.json", "pause-step adapters")):
        (folder / name).write_text("{}")
        assert words in refusal(folder, settings_of(folder))
        (folder / name).unlink()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).rename(folder / (name + ".away"))
    assert "no Hugging Face tokenizer" in refusal(folder, settings_of(folder))


@pytest.mark.parametrize("dk", [True, False])
def test_the_readout_decides_as_cyb_decision_does(dk):
    """Step by step over a block, :func:`decisions.decide` stops where the sequential readout of
    cyb.decision stops and answers its token, greedy and sampled (the same uniforms)."""
    g = torch.Generator().manual_seed(0)
    n, v = 64, 40
    pauses = ServedPauses(M, (30, 31), 32 if dk else None, 1.2 if dk else 0.0, "advance")
    logits = torch.randn(n, M, v, generator=g) * 2
    keys = torch.tensor(row_keys(n, seed=3))
    counter = torch.randint(0, 50, (n,), generator=g)
    for sample in (False, True):
        z = logits.clone()
        z[..., [30, 31]] = float("-inf")  # pauses are never answers
        if sample:
            u = stream_uniforms(keys, counter, M + 1)
            want_tok, want_steps = sample_decision(z, dk_id=pauses.dk_id, dk_bias=pauses.dk_bias, temperature=0.7,
                                                   top_k=5, top_p=0.9, uniforms=u)
        else:
            want_tok, want_steps = greedy_decision(z, dk_id=pauses.dk_id, dk_bias=pauses.dk_bias)
        steps = torch.full((n,), M + 1)
        token = torch.zeros(n, dtype=torch.long)
        for s in range(M, 0, -1):  # the first step that answers wins
            answers, tok_s = decisions.decide(
                pauses, logits[:, s - 1], torch.full((n,), s), keys, counter, torch.full((n,), not sample),
                torch.full((n,), 0.7), torch.full((n,), 5), torch.full((n,), 0.9))
            steps = torch.where(answers, s, steps)
            token = torch.where(answers, tok_s, token)
        assert torch.equal(steps, want_steps) and torch.equal(token, want_tok)
        if dk:
            assert 1 < len(set(steps.tolist()))


def _processor(pauses):
    hf_config = SimpleNamespace(**{readout.CONFIG_KEY: readout.config_value(pauses)})
    return readout.PauseReadout(SimpleNamespace(model_config=SimpleNamespace(hf_config=hf_config)), "cpu", False)


def _params(**kw):
    base = dict(extra_args=None, temperature=0.0, top_k=0, top_p=1.0, seed=None)
    return SimpleNamespace(**{**base, **kw})


def test_the_processor_feeds_fixed_blocks_and_keeps_the_first_answer():
    p = _processor(SHARED)
    out: list[int] = []
    p.state.rows[0] = readout_v1._Row(_params(), out, SHARED.default_mode)
    v = 16

    def step(best: int, dk_wins: bool):
        z = torch.zeros(1, v)
        z[0, best] = 5.0
        z[0, 12] = 10.0 if dk_wins else -10.0
        got = p.apply(z)
        finite = torch.isfinite(got[0]).nonzero().flatten().tolist()
        assert len(finite) == 1
        return finite[0], float(got[0, finite[0]])

    # step 1 dk, step 2 answers 7, step 3 would answer 8: fixed mode feeds the pauses, then 7 (steps 2)
    assert step(3, True) == (10, 0.0)
    out.append(10)
    assert step(7, False) == (11, 0.0)
    out.append(11)
    assert step(8, False) == (7, 2.0)
    out.append(7)
    # a step computed again (vLLM recomputes a preempted request) replaces what it decided before
    assert step(5, False) == (10, 0.0)
    assert step(6, True) == (10, 0.0)
    out.append(10)
    assert step(9, True) == (11, 0.0)
    out.append(11)
    assert step(4, False) == (4, 3.0)  # dk at steps 1 and 2: the answer of step 3


def test_the_processor_in_adaptive_mode_and_its_codes_under_temperature():
    p = _processor(ADVANCE)
    out: list[int] = []
    p.state.rows[0] = readout_v1._Row(_params(temperature=0.5, seed=1), out, ADVANCE.default_mode)
    z = torch.zeros(1, 16)
    z[0, 12] = 30.0  # dk certain at steps 1 and 2
    got = p.apply(z.clone())
    assert torch.isfinite(got).sum() == 1 and float(got[0, 10]) == 0.0
    out.append(10)
    out.append(10)
    got = p.apply(z.clone())  # step 3: an answer, whatever dk says; its code is 3, times the temperature
    t = int(torch.isfinite(got[0]).nonzero())
    assert t not in (10, 12) and float(got[0, t]) == pytest.approx(3 * 0.5)


class _Config(SimpleNamespace):
    """What vLLM's Hugging Face config offers an override: ``update``."""

    def update(self, values: dict) -> None:
        self.__dict__.update(values)


def test_the_engine_arguments_of_a_run_folder(tok, tmp_path):
    run = save_run(build(tok), tmp_path / "run")
    args = SimpleNamespace(model=str(run), tokenizer=None, served_model_name=None, tokenizer_mode="auto",
                           hf_overrides={"rope_theta": 5.0}, logits_processors=None, logprobs_mode="raw_logprobs")
    engine_args.prepare(args)
    assert args.model == args.tokenizer == str(run / "final") and args.served_model_name == str(run)
    assert args.tokenizer_mode == engine_args.TOKENIZER_MODE and args.logprobs_mode == "processed_logits"
    assert args.logits_processors == ["cyb.integrations.vllm.readout:SharedPositionsReadout"]
    assert args.hf_overrides["architectures"] == ["CybSharedLlamaForCausalLM"]
    assert args.hf_overrides["max_position_embeddings"] == 256 * M and args.hf_overrides["rope_theta"] == 5.0
    assert readout.pauses_of(SimpleNamespace(**args.hf_overrides)) == ServedPauses.of(settings_of(run / "final"))
    engine_args.prepare(args)  # again (vLLM may build the config twice): nothing doubles
    assert len(args.logits_processors) == 1
    # pauses that advance positions: the plain architecture, adaptive by default
    adv = build(tok, scheme="advance")
    adv.save_pretrained(tmp_path / "advance")
    args = SimpleNamespace(model=str(tmp_path / "advance"), tokenizer=None, served_model_name=None,
                           tokenizer_mode="auto", hf_overrides=lambda c: c, logits_processors=["x:Y"],
                           logprobs_mode="raw_logits")
    engine_args.prepare(args)
    assert args.logits_processors == ["x:Y", "cyb.integrations.vllm.readout:AdaptiveReadout"]
    assert args.logprobs_mode == "raw_logits"  # what was asked for stays
    config = args.hf_overrides(_Config())  # a callable of the user's runs first, then the layout is set
    assert readout.pauses_of(config).position_scheme == "advance"
    # anything else is vLLM's; a private model is refused
    other = SimpleNamespace(model=str(tmp_path), tokenizer=None)
    engine_args.prepare(other)
    assert other.model == str(tmp_path)
    build(tok, visibility="private").save_pretrained(tmp_path / "private")
    with pytest.raises(Unservable, match="private"):
        engine_args.prepare(SimpleNamespace(model=str(tmp_path / "private")))
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.yaml").write_text("{}")
    (unfinished / "run.json").write_text("{}")
    with pytest.raises(Unservable, match="training has not finished"):
        engine_args.prepare(SimpleNamespace(model=str(unfinished)))



def test_a_checkpoint_folder_is_served_directly(tmp_path, monkeypatch):
    """A training checkpoint: its model is written into cyb's cache the first time (no other cyb
    command has to run first), and the engine serves that folder."""
    from cyb.train import Trainer
    from test_train import _docs, _write_jsonl, tiny_cfg

    monkeypatch.setenv("CYB_CACHE", str(tmp_path / "cache"))
    from cyb.data.tokenizer import train_bpe_tokenizer

    train_bpe_tokenizer(_docs(40, 0), 300, tmp_path / "bpe")
    text = {"source": str(_write_jsonl(tmp_path / "train.jsonl", _docs(40, 0))), "bpe_vocab_size": 300,
            "valid_source": str(_write_jsonl(tmp_path / "valid.jsonl", _docs(8, 1)))}
    cfg = tiny_cfg(tmp_path / "run", text=text, model={"hidden_size": 64, "num_heads": 2},
                   train={"steps": 2, "save_every": 2, "keep_last": 2})
    Trainer(cfg).run()
    [ckpt] = [p for p in (tmp_path / "run").iterdir() if p.name.startswith("ckpt-")]
    args = SimpleNamespace(model=str(ckpt), tokenizer=None, served_model_name=None, tokenizer_mode="auto",
                           hf_overrides=None, logits_processors=None, logprobs_mode="raw_logprobs")
    engine_args.prepare(args)
    assert str(tmp_path / "cache") in args.model and args.served_model_name == str(ckpt)
    assert settings_of(args.model) is not None
    again = SimpleNamespace(**{**vars(args), "model": str(ckpt), "served_model_name": None, "tokenizer": None})
    engine_args.prepare(again)  # built once: the same folder
    assert again.model == args.model


def test_head_dimensions_vllms_cpu_attention_does_not_take_are_refused(tok, tmp_path):
    pytest.importorskip("vllm")
    import transformers

    from cyb.model import PauseModel

    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    PauseModel.from_config(cfg, tok, num_steps=M, use_dk=True).save_pretrained(tmp_path / "m")
    assert engine_args.head_dim(tmp_path / "m") == 16
    if not engine_args._on_cpu():
        pytest.skip("vLLM's GPU build")
    with pytest.raises(Unservable, match="heads have dimension 16, which vLLM's CPU attention does not run") as e:
        engine_args.prepare(SimpleNamespace(model=str(tmp_path / "m"), tokenizer=None))
    assert "\n" not in str(e.value) and "cyb serve" in str(e.value)


def test_speculative_decoding_is_refused(tok, tmp_path):
    build(tok).save_pretrained(tmp_path / "m")
    with pytest.raises(Unservable, match="speculative decoding is not offered"):
        engine_args.prepare(SimpleNamespace(model=str(tmp_path / "m"), tokenizer=None,
                                            speculative_config={"method": "ngram"}))


def test_the_memory_share_fits_what_is_free_when_none_was_given(monkeypatch, tmp_path):
    pytest.importorskip("vllm")
    if not engine_args._on_cpu():
        pytest.skip("vLLM's GPU build")
    from vllm.engine.arg_utils import EngineArgs

    said = []
    monkeypatch.setattr(engine_args, "_say", said.append)
    monkeypatch.setattr(engine_args, "_memory", lambda: (100 << 30, 10 << 30))
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    default = EngineArgs.gpu_memory_utilization

    def share(folder=tmp_path, **kw):
        args = SimpleNamespace(**{"gpu_memory_utilization": default, "kv_cache_memory_bytes": None,
                                  "tensor_parallel_size": 1, "pipeline_parallel_size": 1, **kw})
        engine_args._fit_memory_share(args, folder)
        return args.gpu_memory_utilization

    assert share() == 0.05  # half the free memory for the cache
    assert "using 0.05 (5.0 GiB per worker: half the 10.0 GiB free" in said[-1] and "\n" not in said[-1]
    assert share(tensor_parallel_size=2) == 0.02  # two workers on this machine: half each
    n = len(said)
    assert share(gpu_memory_utilization=0.3) == 0.3  # what the user gave stays
    assert share(kv_cache_memory_bytes=1 << 30) == default
    assert len(said) == n
    weights = tmp_path / "w"
    weights.mkdir()
    with open(weights / "model.safetensors", "wb") as f:
        f.truncate(2 << 30)  # 2 GiB of 16-bit weights: 4 GiB loaded in float32
    assert share(weights) == 0.09  # 5 + 4 GiB
    monkeypatch.setattr(engine_args, "_memory", lambda: (100 << 30, 99 << 30))
    assert share() == 0.49  # where vLLM's default would fit, it would fill the machine: half of it
    monkeypatch.setattr(engine_args, "_memory", lambda: (100 << 30, 4 << 30))
    assert share(weights) == 0.03  # never more than 90% of what is free


def _devices():
    out = [pytest.param("cpu")]
    out.append(pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                                  reason="needs CUDA")]))
    return out


@pytest.mark.parametrize("device", _devices())
def test_the_v2_state_decides_as_the_v1_state(device):
    """Model Runner V2's state (slots, the token table on the device, rows in a new order each
    step) against the V1 runner's (rows, vLLM's output lists) on the same random logits: six
    requests in four slots, fixed and adaptive, greedy and seeded, every forced token and code
    equal.  No vLLM needed: the runner's tables are stood in for."""
    import numpy as np

    from cyb.integrations.vllm.readout_v1 import RowReadout, _Row
    from cyb.integrations.vllm.readout_v2 import SlotReadout

    pauses = ServedPauses(M, (30, 31), 32, 1.2, "advance")
    slots, width, vocab = 4, 128, 40
    table = torch.zeros(slots, width, dtype=torch.int32, device=device)
    prompt_len = np.zeros(slots, dtype=np.int32)
    states = SimpleNamespace(max_num_reqs=slots, device=torch.device(device), prompt_len=SimpleNamespace(np=prompt_len),
                             all_token_ids=SimpleNamespace(gpu=table))
    v2, v1 = SlotReadout(pauses, states), RowReadout(pauses)
    g = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    plan = [("fixed", None), ("adaptive", None), ("adaptive", 5), ("fixed", 6), ("adaptive", 7), ("fixed", None)]
    waiting = list(range(len(plan)))
    running: dict[int, dict] = {}  # slot -> request
    free = list(range(slots))
    decided = 0
    while waiting or running:
        while waiting and free:
            i = waiting.pop(0)
            slot = free.pop()
            mode, seed = plan[i]
            params = _params(extra_args={"mode": mode}, temperature=0.9 if seed else 0.0, seed=seed, top_k=8,
                             top_p=0.9)
            prompt = [int(t) for t in rng.integers(0, 30, size=int(rng.integers(1, 6)))]
            laid = pauses.layout(prompt)
            table[slot, :len(laid)] = torch.tensor(laid, dtype=torch.int32)
            prompt_len[slot] = len(laid)
            req = {"ids": laid, "output": [], "steps": 0}
            running[slot] = req
            v2.add_request(slot, params)
            v1.rows[slot] = _Row(params, req["output"], pauses.default_mode)
        v2.apply_staged_writes()
        order = [int(s) for s in rng.permutation(sorted(running))]
        logits = torch.randn(len(order), vocab, generator=g) * 2
        logits[:, 32] += torch.randn(len(order), generator=g)  # dk often
        pos = torch.tensor([len(running[s]["ids"]) - 1 for s in order])
        ctx = SimpleNamespace(
            expanded_idx_mapping=torch.tensor(order, device=device), idx_mapping_np=np.array(order),
            pos=pos.to(device), input_ids=torch.tensor([running[s]["ids"][-1] for s in order], device=device),
            seq_lens_upper_bound_np=(pos + 1).numpy())
        got = v2.apply(logits.clone().to(device), ctx).cpu()
        by_slot = torch.zeros(slots, vocab)
        by_slot[order] = logits
        one = v1.apply(by_slot)
        for row, s in enumerate(order):
            token = int(got[row].isfinite().float().argmax())
            assert torch.isfinite(got[row]).sum() == 1 and int(one[s].isfinite().float().argmax()) == token
            assert float(got[row].max()) == pytest.approx(float(one[s].max()))
            req = running[s]
            table[s, len(req["ids"])] = token
            req["ids"].append(token)
            req["output"].append(token)
            decided += 1
            if len(real_tokens(req["output"], pauses.pause_ids)) >= 6:
                del running[s], v1.rows[s]
                free.append(s)
    assert decided > 60
