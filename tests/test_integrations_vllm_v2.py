"""cyb.integrations.vllm on Model Runner V2, the runner vLLM picks on a GPU, run on the CPU build
(``tests/vllm_triton.py``: triton's interpreter runs vLLM's kernels).  This file needs a pytest
session of its own (scripts/test_vllm.sh runs it so); elsewhere it is skipped.

* The readout driven as the V2 runner drives it: vLLM's own request table (``RequestState``),
  requests joining, leaving and recycling slots, rows in a new order every step, chunked
  prefills, a preempted request coming back in another slot, fixed and adaptive modes, greedy
  and seeded sampling: every token equals the V1 readout's and cyb's ``generate()``.
* vLLM's V2 loader and frontend validator take the readout classes.
* ``vllm.LLM`` on Model Runner V2: tokens and steps equal cyb's engine, greedy and seeded.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from vllm_triton import force

_why = force()
if _why is not None:
    pytest.skip(_why, allow_module_level=True)

import vllm  # noqa: E402
from vllm.v1.sample.logits_processor.interface import BatchUpdate  # noqa: E402
from vllm.v1.worker.gpu.input_batch import post_update  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor import (  # noqa: E402
    LogitsContext, LogitsProcRequestState, build_custom_logits_processors_params_validator)
from vllm.v1.worker.gpu.states import RequestState  # noqa: E402

from cyb.generation import generate  # noqa: E402
from cyb.integrations.vllm import ServedPauses, real_tokens, steps_per_token  # noqa: E402
from cyb.integrations.vllm import readout  # noqa: E402
from cyb.integrations.vllm.readout_v2 import SlotReadout  # noqa: E402
from vllm_helpers import M, PROMPTS, build, save_run, tokenizer  # noqa: E402

N = 10  # real tokens per request


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def models(tok):
    return {"shared": build(tok, seed=0), "advance": build(tok, scheme="advance", seed=1)}


def _config(pauses: ServedPauses):
    hf_config = SimpleNamespace(**{readout.CONFIG_KEY: readout.config_value(pauses)})
    return SimpleNamespace(model_config=SimpleNamespace(hf_config=hf_config))


def _params(mode: str, seed: int | None):
    if seed is None:
        return vllm.SamplingParams(temperature=0.0, extra_args={"mode": mode})
    return vllm.SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=seed, extra_args={"mode": mode})


def _want(pm, prompt: str, mode: str, seed: int | None):
    kw = {} if seed is None else dict(sample=True, temperature=0.8, top_k=20, top_p=0.9, seed=seed)
    [w] = generate(pm, prompt, mode=mode, max_new_tokens=N, eos_token_ids=(), **kw)
    return w


def _last_logits(pm, ids: list[int], upto: int) -> torch.Tensor:
    """The model's logits at position ``upto`` of ``ids`` (vLLM's positions: divided by ``M``
    for shared positions)."""
    x = torch.tensor([ids[: upto + 1]])
    pos = torch.arange(upto + 1)
    if pm.settings.position_scheme == "shared":
        pos = pos // M
    with torch.no_grad():
        out = pm.hf_model(input_ids=x, position_ids=pos.unsqueeze(0), attention_mask=torch.ones_like(x))
    return out.logits[0, -1].float()


class _Request:
    def __init__(self, name: str, prompt: str, mode: str, seed: int | None, joins: int, pm, pauses):
        self.name, self.prompt, self.mode, self.seed, self.joins = name, prompt, mode, seed, joins
        self.params = _params(mode, seed)
        self.prompt_ids = pauses.layout(pm.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        self.output: list[int] = []  # what was fed after the prompt (vLLM's output ids)
        self.codes: list[float] = []
        self.slot: int | None = None
        self.chunk: int | None = None  # the end of the prefill's first chunk, while it runs

    def done(self, pauses) -> bool:
        return len(real_tokens(self.output, pauses.pause_ids)) >= N


def _drive(pm, requests: list[_Request], *, preempt: str | None = None, seed: int = 0):
    """Run ``requests`` through the V2 readout as Model Runner V2 calls it, and through the V1
    readout on the same logits; returns the V2 readout's outputs."""
    pauses = ServedPauses.of(pm.settings)
    cls = getattr(readout, readout.readout_class(pauses).split(":")[1])
    max_reqs, max_len, vocab = 4, 256, pm.hf_model.config.vocab_size
    states = RequestState(max_reqs, max_len, 512, 0, vocab, torch.device("cpu"))
    v2 = cls(_config(pauses), LogitsProcRequestState.from_request_state(states))
    v1 = cls(_config(pauses), torch.device("cpu"), False)
    assert isinstance(v2.state, SlotReadout)
    rng = random.Random(seed)
    waiting = sorted(requests, key=lambda r: r.joins)
    running: list[_Request] = []
    preempted = False
    step = 0
    while waiting or running:
        # joins: vLLM's request table first, then the sampler's processors, then the staged writes
        added = []
        while waiting and waiting[0].joins <= step and len(running) < max_reqs:
            r = waiting.pop(0)
            states.add_request(r.name, len(r.prompt_ids), r.prompt_ids + r.output, 0, 4 * N * M)
            r.slot = states.req_id_to_index[r.name]
            assert v2.add_request(r.slot, r.params)
            added.append((r.slot, r.params, r.prompt_ids, r.output))
            full = len(r.prompt_ids) + len(r.output)
            r.chunk = full // 2 if full >= 4 else None
            running.append(r)
        states.apply_staged_writes()
        v2.apply_staged_writes()
        v1.update_state(BatchUpdate(max_reqs, [], added, []) if added else None)
        if not running:
            step += 1
            continue
        rng.shuffle(running)  # the V2 runner orders rows anew every step
        rows, fed = [], []
        for r in running:
            full = r.prompt_ids + r.output
            upto = (r.chunk - 1) if r.chunk is not None else len(full) - 1
            rows.append(_last_logits(pm, full, upto))
            fed.append((full[upto], upto))
        logits = torch.stack(rows)
        slots = torch.tensor([r.slot for r in running])
        ctx = LogitsContext(
            expanded_idx_mapping=slots, idx_mapping=slots, idx_mapping_np=slots.numpy().copy(),
            expanded_local_pos=torch.zeros(len(running), dtype=torch.int32),
            input_ids=torch.tensor([t for t, _ in fed], dtype=torch.int32),
            pos=torch.tensor([p for _, p in fed]), seq_lens_upper_bound_np=torch.tensor([p + 1 for _, p in fed]).numpy())
        got = v2.apply(logits.clone(), ctx)
        assert torch.isfinite(got).sum(1).eq(1).all()
        token = got.isfinite().float().argmax(1)
        # the V1 readout on the same logits, rows by slot
        sampled = [i for i, r in enumerate(running) if r.chunk is None]
        if sampled:
            by_slot = torch.zeros(max_reqs, vocab)
            for i in sampled:
                by_slot[running[i].slot] = logits[i]
            one = v1.apply(by_slot)
            for i in sampled:
                s = running[i].slot
                assert int(one[s].isfinite().float().argmax()) == int(token[i]), (running[i].name, step)
                assert float(one[s].max()) == float(got[i].max())
        # commit what was sampled (not a prefill's first chunk) with vLLM's own kernel
        num_sampled = torch.tensor([0 if r.chunk is not None else 1 for r in running], dtype=torch.int32)
        post_update(slots, states.num_computed_tokens.gpu, states.last_sampled_tokens, None,
                    token.unsqueeze(1), num_sampled, torch.zeros_like(num_sampled), None, states.all_token_ids.gpu,
                    states.total_len.gpu)
        removed = []
        for i, r in enumerate(list(running)):
            if r.chunk is not None:
                r.chunk = None
                continue
            r.output.append(int(token[i]))
            # vLLM divides a sampled row's logits by its temperature before it reports them
            r.codes.append(float(got[i].max()) / (r.params.temperature or 1.0))
            leave = r.done(pauses)
            if preempt == r.name and not preempted and len(r.output) in (7, 8):
                preempted = leave = True
                r.joins = step + 2  # back two steps later, most likely in another slot
                waiting.insert(0, r)
            if leave:
                states.remove_request(r.name)
                removed.append(r.slot)
                running.remove(r)
        if removed:
            v1.update_state(BatchUpdate(max_reqs, removed, [], []))
        step += 1
    assert preempt is None or preempted
    return requests


def _check(pm, requests):
    pauses = pm.settings.pause_ids
    for r in requests:
        w = _want(pm, r.prompt, r.mode, r.seed)
        tokens = real_tokens(r.output, pauses)
        steps = steps_per_token(r.output, pauses, r.codes)
        assert (tokens[:N], steps[:N]) == (w.token_ids, w.steps), r.name


def test_the_v2_readout_on_the_runners_batch_states_advance_positions(models):
    """Seven requests, at most four at a time: slots recycled, rows shuffled each step, chunked
    prefills, fixed and adaptive modes, greedy and seeded sampling, one request preempted and
    brought back (adaptive mode: its steps and its stream's counter are read from the token
    table again)."""
    pm = models["advance"]
    pauses = ServedPauses.of(pm.settings)
    plan = [("a", 0, "adaptive", None, 0), ("b", 1, "fixed", None, 0), ("c", 2, "adaptive", 11, 1),
            ("d", 3, "fixed", 12, 2), ("e", 4, "adaptive", 13, 3), ("f", 5, "adaptive", None, 5),
            ("g", 6, "fixed", 14, 9)]
    requests = [_Request(n, PROMPTS[i], mode, seed, joins, pm, pauses) for n, i, mode, seed, joins in plan]
    _check(pm, _drive(pm, requests, preempt="c", seed=1))
    assert any(s > 1 for r in requests for s in steps_per_token(r.output, pm.settings.pause_ids, r.codes))


def test_the_v2_readout_on_the_runners_batch_states_shared_positions(models):
    pm = models["shared"]
    pauses = ServedPauses.of(pm.settings)
    plan = [("a", 0, None, 0), ("b", 5, 21, 0), ("c", 2, None, 1), ("d", 7, 22, 4), ("e", 1, 23, 6)]
    requests = [_Request(n, PROMPTS[i], "fixed", seed, joins, pm, pauses) for n, i, seed, joins in plan]
    _check(pm, _drive(pm, requests, seed=2))


def test_vllms_v2_loader_and_validator_take_the_readout():
    for name in ("SharedPositionsReadout", "AdvancePositionsReadout", "AdaptiveReadout"):
        validate = build_custom_logits_processors_params_validator([f"{readout.__name__}:{name}"])
        validate(vllm.SamplingParams(extra_args={"mode": "fixed"}))
        with pytest.raises(Exception, match="frequency_penalty: not offered"):
            validate(vllm.SamplingParams(frequency_penalty=0.5))
    validate = build_custom_logits_processors_params_validator([f"{readout.__name__}:SharedPositionsReadout"])
    with pytest.raises(Exception, match="per-request position offsets"):
        validate(vllm.SamplingParams(extra_args={"mode": "adaptive"}))


# ----------------------------------------------------------------------------- vllm.LLM on V2

#: as the V1 engine tests (test_integrations_vllm_engine.py): small enough for a 2-core machine
ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=256, gpu_memory_utilization=0.05,
              kv_cache_memory_bytes=64 << 20, max_num_seqs=16, seed=0)


@pytest.fixture(scope="module")
def engines(models, tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_v2")
    llms = {name: vllm.LLM(model=str(save_run(pm, root / name)), **ENGINE) for name, pm in models.items()}
    yield llms
    for llm in llms.values():
        llm.llm_engine.engine_core.shutdown()


def _read(out, pause_ids):
    codes = [lp[t].logprob for t, lp in zip(out.token_ids, out.logprobs)]
    return real_tokens(out.token_ids, pause_ids), steps_per_token(out.token_ids, pause_ids, codes)


@pytest.mark.parametrize("name,mode", [("shared", "fixed"), ("advance", "fixed"), ("advance", "adaptive")])
def test_vllm_on_model_runner_v2_gives_cybs_tokens_and_steps(models, engines, name, mode):
    pm, llm = models[name], engines[name]
    assert llm.llm_engine.vllm_config.use_v2_model_runner
    want = generate(pm, PROMPTS, mode=mode, max_new_tokens=N, eos_token_ids=())
    params = vllm.SamplingParams(max_tokens=N * M, temperature=0, logprobs=0, ignore_eos=True,
                                 extra_args={"mode": mode})
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    for o, w in zip(outs, want, strict=True):
        tokens, steps = _read(o.outputs[0], pm.settings.pause_ids)
        assert (tokens[:N], steps[:N]) == (w.token_ids, w.steps)


def test_seeded_sampling_on_model_runner_v2_draws_each_requests_own_stream(models, engines):
    pm, llm = models["advance"], engines["advance"]
    seeds = [300 + i for i in range(len(PROMPTS))]
    params = [vllm.SamplingParams(max_tokens=N * M, temperature=0.8, top_p=0.9, top_k=20, seed=s, logprobs=0,
                                  ignore_eos=True, extra_args={"mode": "adaptive"}) for s in seeds]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    for i, o in enumerate(outs):
        w = _want(pm, PROMPTS[i], "adaptive", seeds[i])
        tokens, steps = _read(o.outputs[0], pm.settings.pause_ids)
        assert (tokens[:N], steps[:N]) == (w.token_ids, w.steps)
