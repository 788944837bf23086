"""cyb.integrations.vllm in vLLM itself (the CPU build, float32; these run in the venv of their
own that scripts/test_vllm.sh builds, and are skipped where vLLM is not installed).

vLLM's greedy tokens and steps per token equal cyb's engine token for token (fixed mode with
shared positions; fixed and adaptive mode with advance positions; 8 prompts of mixed lengths in
one batch with EOS and stop strings); seeded sampling draws what cyb draws for the same seed, the
share of dk decisions at each step agrees with cyb's over other seeds within a binomial bound,
and the same seed gives the same output twice; ``vllm serve`` on a saved run folder answers the
openai client, streamed or not, and a private model or one whose heads vLLM's CPU attention does not
take is refused in one line.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")

from cyb.generation import generate  # noqa: E402
from cyb.integrations.vllm import real_tokens, steps_per_token  # noqa: E402
from vllm_helpers import M, PROMPTS, build, save_run, tokenizer  # noqa: E402

#: an engine small enough for the 2-core CI machine (its memory check would want most of it)
ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=256, gpu_memory_utilization=0.05,
              kv_cache_memory_bytes=64 << 20, max_num_seqs=128, seed=0)
N = 12  # real tokens per prompt
EOS_LIKE = 262  # the EOS row copies this token's (see vllm_helpers.build): EOS ends some rows


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm")
    tok = tokenizer(root / "tok")
    models = {"shared": build(tok, eos_like=EOS_LIKE), "advance": build(tok, scheme="advance", seed=1)}
    runs = {name: save_run(pm, root / name) for name, pm in models.items()}
    refused = {"private": save_run(build(tok, visibility="private"), root / "private"),
               "small_heads": save_run(build(tok, hidden=32), root / "small_heads")}
    return models, runs, refused


@pytest.fixture(scope="module")
def engines(saved):
    models, runs, _ = saved
    llms = {name: vllm.LLM(model=str(run), **ENGINE) for name, run in runs.items()}
    yield llms
    for llm in llms.values():
        llm.llm_engine.engine_core.shutdown()


def _params(mode: str, **kw):
    kw.setdefault("temperature", 0.0)
    return vllm.SamplingParams(logprobs=0, extra_args={"mode": mode}, **kw)


def _read(out, pause_ids):
    """(real tokens, steps) of a vLLM completion."""
    codes = [lp[t].logprob for t, lp in zip(out.token_ids, out.logprobs)]
    return real_tokens(out.token_ids, pause_ids), steps_per_token(out.token_ids, pause_ids, codes)


def _finish(out) -> str:
    """cyb's stop reason of a vLLM completion."""
    if out.finish_reason == "length":
        return "length"
    return "stop" if isinstance(out.stop_reason, str) else "eos"


@pytest.mark.parametrize("name,mode", [("shared", "fixed"), ("advance", "fixed"), ("advance", "adaptive")])
def test_greedy_tokens_and_steps_equal_cybs_engine(saved, engines, name, mode):
    models, _, _ = saved
    pm = models[name]
    want = generate(pm, PROMPTS, mode=mode, max_new_tokens=N, eos_token_ids=())
    outs = engines[name].generate(PROMPTS, _params(mode, max_tokens=N * M, ignore_eos=True), use_tqdm=False)
    pauses = pm.settings.pause_ids
    for o, w in zip(outs, want, strict=True):
        c = o.outputs[0]
        assert len(o.prompt_token_ids) == (len(w.prompt_ids) - 1) * M + 1  # laid out with its pauses
        tokens, steps = _read(c, pauses)
        if mode == "fixed":  # every token took M positions: exactly N tokens
            assert (tokens, steps) == (w.token_ids, w.steps)
            assert len(o.prompt_token_ids) + len(c.token_ids) - 1 == w.positions
        else:  # positions run out after N tokens at the earliest
            assert len(tokens) >= N and (tokens[:N], steps[:N]) == (w.token_ids, w.steps)
            assert steps_per_token(c.token_ids, pauses)[:N] == w.steps  # adaptive: counted from the pauses
    if mode == "adaptive":
        assert any(s > 1 for w in want for s in w.steps) and any(s == 1 for w in want for s in w.steps)


def test_a_batch_of_mixed_prompts_with_eos_and_stop_strings(saved, engines):
    models, _, _ = saved
    pm = models["shared"]
    stop = ["qu", "ion"]
    want = generate(pm, PROMPTS, mode="fixed", max_new_tokens=N, stop=stop)
    outs = engines["shared"].generate(PROMPTS, _params("fixed", max_tokens=N * M, stop=stop), use_tqdm=False)
    assert {w.stop_reason for w in want} == {"eos", "stop", "length"}  # every way of ending occurs
    for o, w in zip(outs, want, strict=True):
        c = o.outputs[0]
        assert _read(c, pm.settings.pause_ids) == (w.token_ids, w.steps)
        assert _finish(c) == w.stop_reason
        # an incomplete character at the end (U+FFFD) may be held back by one and not the other
        assert c.text.rstrip("\ufffd") == w.text.rstrip("\ufffd")


def _dk_counts(steps_lists) -> list[tuple[int, int]]:
    """Per step i < M: (decisions at step i, dk among them)."""
    counts = [[0, 0] for _ in range(M - 1)]
    for steps in steps_lists:
        for s in steps:
            for i in range(1, min(s, M - 1) + 1):
                counts[i - 1][0] += 1
                counts[i - 1][1] += s > i
    return [tuple(c) for c in counts]


def test_seeded_sampling_draws_from_each_requests_own_stream(saved, engines):
    models, _, _ = saved
    pm, llm = models["advance"], engines["advance"]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(128)]
    tokens = 16

    def run(seeds):
        params = [_params("adaptive", temperature=1.0, top_p=0.9, seed=s, max_tokens=tokens * M, ignore_eos=True)
                  for s in seeds]
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [_read(o.outputs[0], pm.settings.pause_ids) for o in outs]

    seeds = [1000 + i for i in range(len(prompts))]
    first = run(seeds)
    assert run(seeds) == first  # the same seeds, the same outputs
    # a request with seed s draws what cyb's generate(prompt, seed=s) draws for that prompt
    for i in (0, 3, 5):
        [w] = generate(pm, prompts[i], mode="adaptive", sample=True, temperature=1.0, top_p=0.9, seed=seeds[i],
                       max_new_tokens=tokens, eos_token_ids=())
        assert (first[i][0][:tokens], first[i][1][:tokens]) == (w.token_ids, w.steps)
    # against cyb's streams of other seeds: the share of dk at each step, within a binomial bound
    want = generate(pm, prompts, mode="adaptive", sample=True, temperature=1.0, top_p=0.9, seed=7,
                    max_new_tokens=tokens, eos_token_ids=())
    got_counts = _dk_counts(steps[:tokens] for _, steps in first)
    want_counts = _dk_counts(w.steps for w in want)
    assert sum(n for n, _ in got_counts) >= 2000
    for (n1, k1), (n2, k2) in zip(got_counts, want_counts):
        p = (k1 + k2) / (n1 + n2)
        assert 0 < p < 1
        assert abs(k1 / n1 - k2 / n2) <= 4 * math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))


def test_requests_are_refused_in_one_line(engines):
    llm = engines["shared"]
    cases = [({"extra_args": {"mode": "adaptive"}}, "needs per-request position offsets"),
             ({"extra_args": {"mode": "sometimes"}}, "mode must be one of fixed, adaptive"),
             ({"frequency_penalty": 0.5}, "frequency_penalty: not offered"),
             ({"skip_special_tokens": False}, "skip_special_tokens: must stay true")]
    for kw, words in cases:
        with pytest.raises(Exception, match=words) as e:  # vLLM's VLLMValidationError
            llm.generate(["A"], vllm.SamplingParams(max_tokens=3, **kw), use_tqdm=False)
        assert "\n" not in str(e.value).strip()
    with pytest.raises(Exception, match="reserved for pauses"):
        llm.generate([{"prompt_token_ids": [5, llm.get_tokenizer().convert_tokens_to_ids("<pause_1>")]}],
                     vllm.SamplingParams(max_tokens=3), use_tqdm=False)


# ----------------------------------------------------------------------------- vllm serve

VLLM = str(Path(sys.executable).with_name("vllm"))
SERVE = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "256", "--gpu-memory-utilization", "0.05",
         "--kv-cache-memory-bytes", str(64 << 20)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(saved, tmp_path_factory):
    _, runs, _ = saved
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([VLLM, "serve", str(runs["shared"]), "--host", "127.0.0.1", "--port", str(port),
                                 *SERVE], stdout=f, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"vllm serve did not start:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield url, str(runs["shared"]), log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_vllm_serve_answers_the_openai_client_on_a_run_folder(saved, server):
    from openai import OpenAI

    models, _, _ = saved
    pm = models["shared"]
    url, name, log = server
    assert f"cyb: {name}: the pause model in {name}/final (M = 3, shared positions" in log.read_text()
    client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    [w] = generate(pm, PROMPTS[0], mode="fixed", max_new_tokens=N, eos_token_ids=())
    r = client.completions.create(model=name, prompt=PROMPTS[0], max_tokens=N * M, temperature=0, logprobs=0,
                                  extra_body={"return_token_ids": True, "ignore_eos": True})
    choice = r.choices[0]
    ids = choice.model_extra["token_ids"]
    codes = choice.logprobs.token_logprobs
    assert real_tokens(ids, pm.settings.pause_ids) == w.token_ids
    assert steps_per_token(ids, pm.settings.pause_ids, codes) == w.steps
    assert choice.text.rstrip("\ufffd") == w.text.rstrip("\ufffd")
    # usage counts positions: the prompt with its pauses, and every pause decoded
    assert r.usage.prompt_tokens == (len(w.prompt_ids) - 1) * M + 1 and r.usage.completion_tokens == N * M
    # streamed: the same text, piece by piece
    pieces = [c.choices[0].text for c in client.completions.create(
        model=name, prompt=PROMPTS[0], max_tokens=N * M, temperature=0, stream=True,
        extra_body={"ignore_eos": True}) if c.choices]
    assert len(pieces) > 1 and "".join(pieces) == choice.text
    # chat, through the tokenizer's template
    chat = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "2 + 3?"}],
                                          max_tokens=4 * M, temperature=0)
    assert chat.choices[0].message.content is not None and chat.usage.completion_tokens <= 4 * M
    # raw HTTP, as curl sends it; a request for adaptive mode is a 400 with the reason
    body = json.dumps({"model": name, "prompt": "Water", "max_tokens": 6, "temperature": 0,
                       "vllm_xargs": {"mode": "adaptive"}}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400 and "per-request position offsets" in e.value.read().decode()


@pytest.mark.parametrize("name,words", [("private", "private"), ("small_heads", "heads have dimension 16")])
def test_vllm_serve_refuses_what_it_cannot_run_in_one_line(saved, name, words):
    """Private pauses; a head dimension vLLM's CPU attention does not take (it would start, then
    answer every request with an error)."""
    _, _, refused = saved
    done = subprocess.run([VLLM, "serve", str(refused[name]), *SERVE], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"})
    assert done.returncode != 0
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "cyb:" in line]
    assert len(lines) == 1 and words in lines[0] and "cyb serve" in lines[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr
