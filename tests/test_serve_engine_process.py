"""``cyb serve``'s engine in a process of its own (:mod:`cyb.serve.engine_process`): the model is
loaded there from its folder, and the answers are those of the engine in a thread, token for
token (eight concurrent requests on two slots, streamed and not, greedy and sampled, echo with
logprobs).  A model that cannot be served is refused in one line; an engine process that dies
fails its requests with a 500, and the server says the engine stopped."""

from __future__ import annotations

import concurrent.futures
import functools
import os
import pickle
import signal
import time

import pytest
import torch

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from cyb.commands.serve import load  # noqa: E402
from cyb.generation import generate  # noqa: E402
from cyb.serve import ServeOptions  # noqa: E402
from cyb.serve.engine_process import EngineProcess  # noqa: E402
from cyb.serve.server import start_background  # noqa: E402
from serve_helpers import NAME, pause_model, served, tokenizer  # noqa: E402
from test_serve_traffic import ask, plan  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

CUDA = pytest.param("cuda", marks=[pytest.mark.gpu,
                                   pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tok = tokenizer(tmp_path_factory.mktemp("tok"))
    path = tmp_path_factory.mktemp("model") / "tiny"
    pause_model(tok).save_pretrained(path)
    return path


def started(folder, device="cpu", **options) -> tuple:
    options = ServeOptions(port=0, grace_s=5.0, model_name=NAME, **options)
    proc = EngineProcess(functools.partial(load, str(folder), options, device=device),
                         slots=options.slots).start(timeout=120)
    return proc, start_background(proc.served, options, worker=proc)


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_eight_requests_on_two_slots_answer_as_alone(folder, device):
    from cyb.model import PauseModel

    pm = PauseModel.from_pretrained(folder).eval()
    requests = plan(pm)
    proc, srv = started(folder, device, max_model_len=240, slots=2)
    try:
        assert proc.slots == 2 and srv.worker is proc and proc.served.model is None
        with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
            got = list(pool.map(lambda r: ask(srv.url, r), requests))
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        echoed = client.completions.create(model=NAME, prompt="The quick brown", max_tokens=4, temperature=0,
                                           echo=True, logprobs=2)
    finally:
        srv.stop()
    assert not proc.alive
    for r, (ids, steps) in zip(requests, got):
        want = generate(pm, [r["prompt"]], mode=r["mode"], max_new_tokens=r["max_tokens"], sample=r["sample"],
                        temperature=r["temperature"] or 1.0, seed=r["seed"])[0]
        assert (ids, steps) == (want.token_ids, want.steps), r
    lp = echoed.choices[0].logprobs
    assert echoed.choices[0].text.startswith("The quick brown") and len(lp.tokens) == len(lp.token_logprobs)
    assert lp.token_logprobs[0] is None and all(x <= 0 for x in lp.token_logprobs[1:])


def test_the_served_model_crosses_without_its_weights(folder):
    options = ServeOptions(port=0, model_name=NAME, max_model_len=64)
    here = load(str(folder), options, device="cpu")
    there = pickle.loads(pickle.dumps(here))
    assert there.model is None and here.model is not None
    assert there.describe() == here.describe() and there.eos == here.eos and there.columns == here.columns
    ids = there.encode("The quick brown fox")
    assert ids == here.encode("The quick brown fox") and there.text(ids) == here.text(ids)


def test_a_model_that_cannot_be_served_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="MODEL"):
        EngineProcess(functools.partial(load, str(tmp_path / "nothing"), ServeOptions(), device="cpu")).start(60)


def test_a_dead_engine_process_fails_its_requests(folder):
    proc, srv = started(folder, slots=2)
    try:
        body = {"model": NAME, "prompt": "The quick brown", "max_tokens": 200, "ignore_eos": True,
                "temperature": 0, "mode": "fixed"}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(httpx.post, srv.url + "/v1/completions", json=body, timeout=60)
            t0 = time.monotonic()
            while proc.snapshot[0] == 0 and time.monotonic() - t0 < 30:
                time.sleep(0.01)
            os.kill(proc._proc.pid, signal.SIGKILL)
            answer = pending.result()
        assert answer.status_code == 500 and "engine's process exited" in answer.json()["error"]["message"]
        assert httpx.get(srv.url + "/health").status_code == 503
        refused = httpx.post(srv.url + "/v1/completions", json=body, timeout=10)
        assert refused.status_code == 503 and "engine has stopped" in refused.json()["error"]["message"]
    finally:
        srv.stop()
