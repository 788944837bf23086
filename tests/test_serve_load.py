"""``cyb serve`` under load and bad requests, on the CPU: 64 concurrent clients x 20 requests
of mixed lengths (completions and chat, streamed and not, fixed and adaptive, greedy and
sampled), every tenth a bad request.  Nothing is lost: every good request gets all its tokens,
its greedy answers are what :func:`cyb.generation.generate` gives alone, every bad one a 4xx,
and afterwards no slot is in use, nothing waits and nothing is in flight.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from cyb.generation import generate  # noqa: E402
from cyb.serve.client import stream  # noqa: E402
from serve_helpers import CORPUS, NAME, metric, pause_model, running, tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

CLIENTS, REQUESTS = 64, 20
WORDS = " ".join(CORPUS).split()


def plan(seed: int = 0) -> list[list[dict]]:
    """Per client, its requests: ``kind`` (completion, chat, bad, raw-bad), the body and
    whether it streams (seeded)."""
    rng = random.Random(seed)
    clients = []
    for c in range(CLIENTS):
        reqs = []
        for j in range(REQUESTS):
            if j % 10 == 9:
                kind = rng.choice(["bad-field", "bad-model", "bad-length", "raw-json", "raw-utf8"])
                reqs.append({"kind": kind})
                continue
            words = rng.randint(1, 24)
            start = rng.randint(0, len(WORDS) - words)
            text = " ".join(WORDS[start:start + words])
            body = {"max_tokens": rng.randint(1, 16), "mode": rng.choice(["fixed", "adaptive"]),
                    "ignore_eos": True}
            if rng.random() < 0.5:
                body["temperature"] = 0
            else:
                body.update(temperature=0.9, seed=rng.randint(0, 1000))
            chat = rng.random() < 0.2
            reqs.append({"kind": "chat" if chat else "completion", "text": text, "body": body,
                         "stream": rng.random() < 0.4})
        clients.append(reqs)
    return clients


async def _one(client, raw, url: str, req: dict) -> dict:
    kind = req["kind"]
    try:
        if kind == "bad-field":
            await client.completions.create(model=NAME, prompt="a", max_tokens=2, extra_body={"frobnicate": 1})
        elif kind == "bad-model":
            await client.completions.create(model="no-such-model", prompt="a", max_tokens=2)
        elif kind == "bad-length":
            await client.completions.create(model=NAME, prompt="a", max_tokens=10 ** 6)
        elif kind in ("raw-json", "raw-utf8"):
            data = b'{"prompt": "a",' if kind == "raw-json" else b'{"prompt": "\xff"}'
            r = await raw.post(url + "/v1/completions", content=data, headers={"Content-Type": "application/json"})
            return {"kind": kind, "status": r.status_code, "message": r.json()["error"]["message"]}
        else:
            body = req["body"]
            extra = {"mode": body["mode"], "ignore_eos": True, "return_steps": True}
            common = dict(model=NAME, max_tokens=body["max_tokens"], temperature=body["temperature"],
                          seed=body.get("seed"), extra_body=extra)
            if kind == "chat":
                messages = [{"role": "user", "content": req["text"]}]
                if req["stream"]:
                    text, n, finish = "", 0, None
                    async for ch in await client.chat.completions.create(messages=messages, stream=True, **common):
                        if ch.choices:
                            text += ch.choices[0].delta.content or ""
                            n += len(ch.choices[0].model_extra.get("steps") or [])
                            finish = ch.choices[0].finish_reason or finish
                    return {"kind": kind, "status": 200, "text": text, "tokens": n, "finish": finish}
                r = await client.chat.completions.create(messages=messages, **common)
                return {"kind": kind, "status": 200, "text": r.choices[0].message.content,
                        "tokens": r.usage.completion_tokens, "finish": r.choices[0].finish_reason}
            if req["stream"]:
                res = await stream(url, "/v1/completions", {"model": NAME, "prompt": req["text"], **body})
                return {"kind": kind, "status": res.status, "text": res.text, "tokens": res.tokens,
                        "finish": res.finish_reason, "error": res.error}
            r = await client.completions.create(prompt=req["text"], **common)
            return {"kind": kind, "status": 200, "text": r.choices[0].text, "tokens": r.usage.completion_tokens,
                    "finish": r.choices[0].finish_reason}
    except openai.APIStatusError as e:
        return {"kind": kind, "status": e.status_code, "message": e.body["message"] if isinstance(e.body, dict)
                else str(e)}
    raise AssertionError(f"a bad request of kind {kind} was accepted")


async def _load(url: str, clients: list[list[dict]]) -> list[list[dict]]:
    limits = httpx.Limits(max_connections=CLIENTS + 8, max_keepalive_connections=CLIENTS + 8)
    async with httpx.AsyncClient(limits=limits, timeout=120) as raw:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120,
                                    http_client=httpx.AsyncClient(limits=limits, timeout=120))

        async def one_client(reqs):
            return [await _one(client, raw, url, r) for r in reqs]

        results = await asyncio.gather(*(one_client(reqs) for reqs in clients))
        await client.close()
    return results


def test_64_clients_x_20_requests_nothing_lost_no_slot_leaked(tmp_path_factory):
    tok = tokenizer(tmp_path_factory.mktemp("tok"))
    pm = pause_model(tok)
    clients = plan()
    with running(pm, max_concurrency=CLIENTS, slots=32) as srv:
        t0 = time.monotonic()
        results = asyncio.run(asyncio.wait_for(_load(srv.url, clients), 240))  # bounded whatever happens
        took = time.monotonic() - t0
        t1 = time.monotonic()
        while True:
            health = json.loads(httpx.get(srv.url + "/health").text)
            if health["slots_in_use"] == 0 or time.monotonic() - t1 > 5:
                break
            time.sleep(0.01)
        text = httpx.get(srv.url + "/metrics").text
    assert (health["slots_in_use"], health["queued"], health["requests_in_flight"]) == (0, 0, 0)
    assert metric(text, "cyb_requests_in_flight") == 0
    good = bad = tokens = 0
    greedy = []
    for reqs, outs in zip(clients, results):
        assert len(outs) == REQUESTS  # nothing lost
        for req, out in zip(reqs, outs):
            if req["kind"] in ("completion", "chat"):
                assert out["status"] == 200 and not out.get("error"), out
                assert out["tokens"] == req["body"]["max_tokens"] and out["finish"] == "length", (req, out)
                good += 1
                tokens += out["tokens"]
                if req["kind"] == "completion" and req["body"]["temperature"] == 0:
                    greedy.append((req, out))
            else:
                assert 400 <= out["status"] < 500 and "\n" not in out["message"], out
                bad += 1
    assert good + bad == CLIENTS * REQUESTS and bad == CLIENTS * 2
    assert metric(text, "cyb_completion_tokens_total") >= tokens
    # under load a greedy request is answered as it would be alone
    for (mode, n), group in _groups(greedy).items():
        want = generate(pm, [r["text"] for r, _ in group], mode=mode, max_new_tokens=n, eos_token_ids=())
        assert [o["text"] for _, o in group] == [w.text for w in want]
    print(f"{CLIENTS} clients x {REQUESTS} requests: {good} good, {bad} bad, {tokens} tokens in {took:.1f} s")


def _groups(pairs):
    out: dict = {}
    for req, res in pairs:
        out.setdefault((req["body"]["mode"], req["body"]["max_tokens"]), []).append((req, res))
    return out
