"""``cyb serve`` with real clients: the ``openai`` package and raw HTTP, on a tiny model.

The server runs on 127.0.0.1 in a thread of the test process.  What it sends must be what
:func:`cyb.generation.generate` gives in-process (greedy and seeded sampling, every mode, stop
strings, ``n`` choices), its prompt log-probabilities what the lm-eval scoring gives, and every
bad request a 4xx with a one-line message while the others are served.
"""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from cyb.generation import generate  # noqa: E402
from cyb.integrations.scoring import score_batch  # noqa: E402
from serve_helpers import NAME, metric, pause_model, running, tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def model(tok):
    return pause_model(tok)


@pytest.fixture(scope="module")
def server(model):
    with running(model) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def post(url: str, path: str, body, headers: dict | None = None, timeout: float = 30):
    """``(status, headers, decoded JSON or text)`` of a raw POST (``body``: bytes or JSON)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = raw.decode("utf-8", "replace")
    return resp.status, dict(resp.getheaders()), payload


def get(url: str, path: str, headers: dict | None = None):
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", path, headers=headers or {})
    resp = conn.getresponse()
    raw = resp.read().decode()
    conn.close()
    return resp.status, raw


def wait_idle(url: str, timeout: float = 5.0) -> dict:
    """/health once no slot is in use and nothing waits (or after ``timeout``)."""
    t0 = time.monotonic()
    while True:
        _, raw = get(url, "/health")
        health = json.loads(raw)
        if (health["slots_in_use"] == 0 and health["queued"] == 0) or time.monotonic() - t0 > timeout:
            return health
        time.sleep(0.01)


# ------------------------------------------------------------------ the openai client


@pytest.mark.parametrize("mode", ["adaptive", "fixed"])
def test_completions_are_what_generate_gives(client, model, mode):
    prompts = ["The quick brown", "Water freezes at"]
    r = client.completions.create(model=NAME, prompt=prompts, max_tokens=12, temperature=0,
                                  extra_body={"mode": mode, "return_steps": True, "return_token_ids": True})
    want = generate(model, prompts, mode=mode, max_new_tokens=12)
    assert r.object == "text_completion" and r.model == NAME and r.id.startswith("cmpl-")
    for choice, w in zip(sorted(r.choices, key=lambda c: c.index), want):
        extra = choice.model_extra
        assert choice.text == w.text
        assert extra["token_ids"] == w.token_ids and extra["steps"] == w.steps
        assert choice.finish_reason == {"eos": "stop", "length": "length"}[w.stop_reason]
    u = r.usage.model_extra
    assert r.usage.prompt_tokens == sum(len(w.prompt_ids) for w in want)
    assert r.usage.completion_tokens == sum(len(w.token_ids) for w in want)
    assert u["positions"] == sum(w.positions for w in want)
    assert u["real_tokens"] == r.usage.total_tokens
    steps = [s for w in want for s in w.steps]
    assert u["mean_steps"] == pytest.approx(sum(steps) / len(steps), abs=1e-4)


def test_default_mode_is_adaptive_for_a_model_with_dk(client, model):
    r = client.completions.create(model=NAME, prompt="The quick", max_tokens=6, temperature=0)
    assert r.choices[0].text == generate(model, "The quick", mode="adaptive", max_new_tokens=6)[0].text


def test_streamed_completion_equals_the_whole_one(client):
    kw = dict(model=NAME, prompt="Question: what is", max_tokens=10, temperature=0)
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True},
                                            extra_body={"return_steps": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == whole.choices[0].finish_reason and all(f is None for f in finals[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert sum(len(c.choices[0].model_extra["steps"]) for c in chunks if c.choices) == whole.usage.completion_tokens


def test_streamed_choices_are_the_whole_ones(client):
    kw = dict(model=NAME, prompt=["The lazy", "Water"], max_tokens=6, n=2, seed=3, temperature=0.7)
    whole = client.completions.create(**kw)
    texts: dict[int, str] = {}
    for ch in client.completions.create(**kw, stream=True):
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {c.index: c.text for c in whole.choices} and len(texts) == 4


def test_chat_streamed_and_not(client, model, tok):
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2 + 3?"}]
    r = client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0)
    ids = tok(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
              add_special_tokens=False)["input_ids"]
    want = generate(model, [ids], mode="adaptive", max_new_tokens=8)[0]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == want.text
    assert r.usage.prompt_tokens == len(ids)
    stream = list(client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0,
                                                 stream=True))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == want.text
    assert stream[-1].choices[0].finish_reason in ("stop", "length")


def test_seeded_sampling_and_n_choices_match_generate(client, model):
    r = client.completions.create(model=NAME, prompt="The lazy", max_tokens=8, n=3, seed=7, temperature=0.8,
                                  top_p=0.9, extra_body={"top_k": 20, "mode": "fixed"})
    want = generate(model, ["The lazy"] * 3, mode="fixed", max_new_tokens=8, sample=True, temperature=0.8,
                    top_p=0.9, top_k=20, seed=7)
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == [w.text for w in want]
    again = client.completions.create(model=NAME, prompt="The lazy", max_tokens=8, n=3, seed=7, temperature=0.8,
                                      top_p=0.9, extra_body={"top_k": 20, "mode": "fixed"})
    assert [c.text for c in again.choices] == [c.text for c in r.choices]


def test_stop_strings_cut_the_text(client, model):
    free = generate(model, "The quick brown", mode="adaptive", max_new_tokens=20)[0].text
    stop = next((ch for ch in free[2:] if ch.isascii() and ch.isalnum()), None)
    assert stop is not None, free
    want = generate(model, "The quick brown", mode="adaptive", max_new_tokens=20, stop=(stop,))[0]
    r = client.completions.create(model=NAME, prompt="The quick brown", max_tokens=20, temperature=0, stop=[stop])
    assert r.choices[0].text == want.text and stop not in r.choices[0].text
    assert r.choices[0].finish_reason == "stop" and want.stop_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=NAME, prompt="The quick brown", max_tokens=20, temperature=0, stop=[stop], stream=True))
    assert streamed == want.text


def test_echo_with_logprobs_gives_the_readout_of_the_lm_eval_model(client, model, tok):
    context, continuation = tok("Water freezes at")["input_ids"], tok(" zero degrees")["input_ids"]
    ids = context + continuation
    r = client.completions.create(model=NAME, prompt=ids, max_tokens=1, temperature=0, echo=True, logprobs=1)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + 1 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    [(want, greedy)] = score_batch(model, [(context, continuation)], max_length=1024)
    got = sum(lp.token_logprobs[len(context):-1])
    assert got == pytest.approx(want, abs=1e-4)
    # lm-eval's is_greedy: every continuation token's log-probability is the best listed
    is_greedy = all(t == max(top.values()) for t, top in zip(lp.token_logprobs[len(context):-1],
                                                            lp.top_logprobs[len(context):-1]))
    assert is_greedy == greedy
    text = r.choices[0].text
    assert text.startswith("Water freezes at zero degrees")
    assert lp.text_offset[0] == 0 and text[lp.text_offset[len(context)]:].startswith(" zero")
    assert lp.text_offset == sorted(lp.text_offset)
    # the prompt alone: max_tokens 0 with echo scores without generating
    r0 = client.completions.create(model=NAME, prompt=ids, max_tokens=0, echo=True, logprobs=3)
    lp0 = r0.choices[0].logprobs
    assert lp0.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:-1], abs=1e-5)
    assert all(1 <= len(top) <= 3 for top in lp0.top_logprobs[1:]) and r0.usage.completion_tokens == 0
    assert sum(len(top) == 3 for top in lp0.top_logprobs[1:]) >= len(ids) // 2  # strings may coincide
    # without echo: the log-probabilities of the new tokens only
    r1 = client.completions.create(model=NAME, prompt=ids, max_tokens=3, temperature=0, logprobs=2)
    assert len(r1.choices[0].logprobs.tokens) == r1.usage.completion_tokens
    assert all(x is not None and x <= 0 for x in r1.choices[0].logprobs.token_logprobs)


def test_models_health_metrics_and_tokenizer_routes(server, client, tok):
    [m] = client.models.list().data
    assert m.id == NAME and m.model_extra["num_steps"] == 3 and m.model_extra["default_mode"] == "adaptive"
    status, raw = get(server.url, "/health")
    health = json.loads(raw)
    assert status == 200 and health["status"] == "ok" and health["slots"] == server.worker.slots
    status, text = get(server.url, "/metrics")
    assert status == 200
    for name in ("cyb_slots_in_use", "cyb_queue_length", "cyb_tokens_per_second", "cyb_mean_steps_per_token",
                 "cyb_completion_tokens_total", "cyb_requests_in_flight"):
        metric(text, name)
    assert 'cyb_requests_total{route="/v1/completions",code="200"}' in text
    status, _, body = post(server.url, "/tokenize", {"prompt": "The quick", "add_special_tokens": False})
    assert status == 200 and body["tokens"] == tok("The quick", add_special_tokens=False)["input_ids"]
    status, _, back = post(server.url, "/detokenize", {"tokens": body["tokens"]})
    assert back["prompt"] == "The quick"
    status, raw = get(server.url, "/tokenizer_info")
    assert status == 200 and json.loads(raw)["eos_token"] == tok.eos_token


def test_metrics_show_the_prefix_cache_and_the_blocks(server, client):
    """The same prompt twice: the second finds the first's full blocks of prompt columns in the
    prefix cache, and ``/metrics`` counts them."""
    wait_idle(server.url)
    _, before = get(server.url, "/metrics")
    prompt = "The quick brown fox jumps over the lazy dog, then naps. " * 3
    for _ in range(2):
        client.completions.create(model=NAME, prompt=prompt, max_tokens=2, temperature=0)
    _, after = get(server.url, "/metrics")

    def grew(name):
        return metric(after, name) - metric(before, name)

    assert grew("cyb_prefix_cache_hit_blocks_total") > 0 and grew("cyb_prefix_cache_hit_columns_total") > 0
    assert grew("cyb_prefix_cache_lookup_blocks_total") >= grew("cyb_prefix_cache_hit_blocks_total")
    assert 0 < metric(after, "cyb_prefix_cache_hit_rate") <= 1
    assert metric(after, "cyb_preemptions_total") == 0
    assert metric(after, "cyb_cache_blocks") >= metric(after, "cyb_cache_blocks_free") > 0


# ------------------------------------------------------------------ raw HTTP (as curl sends it)


def test_raw_http_completion_and_event_stream(server):
    status, headers, body = post(server.url, "/v1/completions",
                                 {"model": NAME, "prompt": "The quick", "max_tokens": 4, "temperature": 0})
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert body["choices"][0]["finish_reason"] in ("stop", "length") and body["usage"]["completion_tokens"] <= 4
    status, headers, text = post(server.url, "/v1/chat/completions",
                                 {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                  "temperature": 0, "stream": True})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert events[-1] == "[DONE]" and all(not e.startswith("{") or json.loads(e)["object"] ==
                                           "chat.completion.chunk" for e in events[:-1])


BAD = [
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe{}", 400, "not UTF-8"),
    (b"", 400, "empty"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"prompt": "a", "max_tokens": NaN}', 400, "NaN"),
    ({"prompt": "a", "frobnicate": 1}, 400, "unknown field 'frobnicate'"),
    ({"prompt": "a", "model": "gpt-4"}, 404, "does not exist"),
    ({"prompt": "a", "max_tokens": 0}, 400, "max_tokens: must be an integer in [1, "),
    ({"prompt": "a", "max_tokens": 100000}, 400, "max_tokens: must be an integer in [1, "),
    ({"prompt": "a" * 2000}, 400, "a request may fill 256 tokens"),
    ({"prompt": [5, 100000]}, 400, "outside the vocabulary"),
    ({"prompt": "a", "temperature": 3}, 400, "temperature: must be a number in [0, 2]"),
    ({"prompt": "a", "top_p": 0}, 400, "top_p: must be a number in (0, 1]"),
    ({"prompt": "a", "n": 0}, 400, "n: must be an integer in [1, "),
    ({"prompt": "a", "stop": ["x"] * 40}, 400, "stop:"),
    ({"prompt": "a", "mode": "sometimes"}, 400, "mode: must be one of fixed, adaptive"),
    ({"prompt": "a", "frequency_penalty": 0.5}, 400, "not supported"),
    ({"prompt": "a", "stream": True, "logprobs": 1}, 400, "logprobs: not supported with stream"),
    ({"prompt": {"text": "a"}}, 400, "prompt: must be"),
    ({"max_tokens": 3}, 400, "prompt: required"),
]


def test_bad_requests_get_one_line_4xx_while_others_are_served(server, client):
    before = wait_idle(server.url)
    assert before["slots_in_use"] == 0
    for body, status, text in BAD:
        got, _, payload = post(server.url, "/v1/completions", body)
        message = payload["error"]["message"]
        assert got == status, (body, payload)
        assert text in message and "\n" not in message, (body, message)
    got, _, payload = post(server.url, "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]})
    assert got == 400 and "messages[0].role" in payload["error"]["message"]
    got, _, payload = post(server.url, "/v1/nothing", {})
    assert got == 404 and "no route" in payload["error"]["message"]
    status, raw = get(server.url, "/v1/completions")
    assert status == 405 and "not allowed" in json.loads(raw)["error"]["message"]
    big = b'{"prompt": "' + b"a" * (10 << 20) + b'"}'
    got, _, payload = post(server.url, "/v1/completions", big)
    assert got == 413 and "over the limit" in payload["error"]["message"]
    # still serving
    assert client.completions.create(model=NAME, prompt="ok", max_tokens=2, temperature=0).choices
    assert wait_idle(server.url)["slots_in_use"] == 0


def _send(url: str, body: dict, headers: bytes = b"") -> socket.socket:
    """A raw socket that sent ``body`` to /v1/completions (and read nothing yet)."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + headers
              + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def _open_stream(url: str, body: dict, headers: bytes = b"") -> socket.socket:
    """A raw socket that sent ``body`` as a streamed completion and read its first event."""
    s = _send(url, body, headers)
    got = b""
    while b"data:" not in got:
        got += s.recv(65536)
    return s


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_disconnects_frees_its_slot_at_once(server, stream):
    wait_idle(server.url)
    _, before = get(server.url, "/metrics")
    body = {"prompt": "The quick", "max_tokens": 240, "temperature": 0, "ignore_eos": True, "stream": stream}
    if stream:
        s = _open_stream(server.url, body)
    else:
        s = _send(server.url, body)
        t0 = time.monotonic()
        while json.loads(get(server.url, "/health")[1])["slots_in_use"] == 0 and time.monotonic() - t0 < 5:
            time.sleep(0.005)
    s.close()
    t0 = time.monotonic()
    health = wait_idle(server.url, timeout=5)
    assert health["slots_in_use"] == 0 and time.monotonic() - t0 < 2
    _, after = get(server.url, "/metrics")
    made = metric(after, "cyb_completion_tokens_total") - metric(before, "cyb_completion_tokens_total")
    assert made < 240  # the rest was never generated


def test_concurrency_limit_and_api_key(model):
    with running(model, max_concurrency=2, api_key="sekret") as srv:
        auth = {"Authorization": "Bearer sekret"}
        status, _, payload = post(srv.url, "/v1/completions", {"prompt": "a", "max_tokens": 1})
        assert status == 401 and "API key" in payload["error"]["message"]
        status, _, payload = post(srv.url, "/v1/completions", {"prompt": "a", "max_tokens": 1},
                                  {"Authorization": "Bearer wrong"})
        assert status == 401 and "wrong API key" in payload["error"]["message"]
        assert get(srv.url, "/health")[0] == 200  # no key needed
        assert get(srv.url, "/metrics")[0] == 401
        # two streams held open fill the limit
        held = [_open_stream(srv.url, {"prompt": "x", "max_tokens": 200, "ignore_eos": True, "stream": True},
                             b"Authorization: Bearer sekret\r\n") for _ in range(2)]
        status, headers, payload = post(srv.url, "/v1/completions", {"prompt": "a", "max_tokens": 1}, auth)
        assert status == 503 and "busy" in payload["error"]["message"] and headers.get("retry-after") == "1"
        for s in held:
            s.close()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5:
            status, _, payload = post(srv.url, "/v1/completions", {"prompt": "a", "max_tokens": 1}, auth)
            if status == 200:
                break
            time.sleep(0.02)
        assert status == 200
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="sekret", max_retries=0)
        assert c.completions.create(model=NAME, prompt="a", max_tokens=2).choices


@pytest.mark.parametrize("kind,visibility", [("cyb", "private"), ("tbys", "shared"), ("baseline", "shared")])
def test_other_layouts_and_methods(tok, kind, visibility):
    pm = pause_model(tok, kind, visibility=visibility)
    with running(pm) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        r = c.completions.create(model=NAME, prompt=["The quick", "Water"], max_tokens=6, temperature=0,
                                 extra_body={"return_steps": True})
        want = generate(pm, ["The quick", "Water"], mode="adaptive" if kind == "cyb" else "fixed", max_new_tokens=6)
        assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == [w.text for w in want]
        assert [c.model_extra["steps"] for c in sorted(r.choices, key=lambda c: c.index)] == [w.steps for w in want]
