"""``cyb serve`` under traffic: two slots for eight concurrent requests with prompts of up to
220 tokens (several prefill chunks in a shared layout: 660 columns against chunks of 512),
fixed and adaptive, greedy and seeded sampling, streamed and not.  Every answer is what
:func:`cyb.generation.generate` gives its prompt alone (whose rows the engine tests hold to
the no-cache reference).  On the CPU in the suite and on CUDA under ``-m gpu``."""

from __future__ import annotations

import concurrent.futures
import copy
import random

import pytest
import torch

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from cyb.generation import generate  # noqa: E402
from serve_helpers import NAME, pause_model, running, tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

LENGTHS = [5, 180, 40, 220, 12, 150, 90, 3]
CUDA = pytest.param("cuda", marks=[pytest.mark.gpu,
                                   pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])


def plan(pm, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    real = min(pm.vocab.special_ids)
    out = []
    for i, n in enumerate(LENGTHS):
        sampled = i % 2 == 1
        out.append({"prompt": [rng.randrange(3, real) for _ in range(n)], "max_tokens": rng.randint(4, 16),
                    "mode": "fixed" if i % 3 == 0 else "adaptive", "stream": i % 4 < 2,
                    "sample": sampled, "seed": 100 + i, "temperature": 0.8 if sampled else 0.0})
    return out


def ask(url: str, r: dict) -> tuple[list[int], list[int]]:
    """``(token ids, steps)`` of one request, streamed or not."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    kw = dict(model=NAME, prompt=r["prompt"], max_tokens=r["max_tokens"], temperature=r["temperature"],
              seed=r["seed"], extra_body={"mode": r["mode"], "return_steps": True, "return_token_ids": True})
    if not r["stream"]:
        c = client.completions.create(**kw).choices[0]
        return c.model_extra["token_ids"], c.model_extra["steps"]
    ids, steps = [], []
    for chunk in client.completions.create(**kw, stream=True):
        for c in chunk.choices:
            ids += c.model_extra.get("token_ids") or []
            steps += c.model_extra.get("steps") or []
    return ids, steps


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("visibility", ["shared", "private"])
def test_two_slots_eight_long_requests_answer_as_alone(tmp_path_factory, visibility, device):
    tok = tokenizer(tmp_path_factory.mktemp("tok"))
    pm = pause_model(tok, visibility=visibility)
    if device != "cpu":
        pm = copy.deepcopy(pm).to(device)
    requests = plan(pm)
    with running(pm, served_kw={"max_model_len": 240}, slots=2) as srv:
        assert srv.worker.slots == 2
        with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
            got = list(pool.map(lambda r: ask(srv.url, r), requests))
    for r, (ids, steps) in zip(requests, got):
        want = generate(pm, [r["prompt"]], mode=r["mode"], max_new_tokens=r["max_tokens"], sample=r["sample"],
                        temperature=r["temperature"] or 1.0, seed=r["seed"])[0]
        assert (ids, steps) == (want.token_ids, want.steps), r
