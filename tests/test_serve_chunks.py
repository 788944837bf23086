"""The stream's hot path without a server: the events :class:`cyb.serve.responses.StreamChunks`
writes (byte for byte ``json.dumps`` of the OpenAI chunk, for awkward text too)."""

import json
from types import SimpleNamespace

import pytest

from cyb.serve.jobs import Delta
from cyb.serve.responses import StreamChunks, chunk_dict, sse

AWKWARD = ["", "plain", 'say "hi"', "back\\slash", "tab\there\nnew\rline", "\x00\x01\x1f\x7f", "é漢字😀",
           "\u2028\u2029", "\ud800 lone surrogate", "</script>&<>'"]


def _gen(chat: bool, steps: bool, ids: bool):
    params = SimpleNamespace(chat=chat, return_steps=steps, return_token_ids=ids)
    return SimpleNamespace(id="cmpl-0123456789abcdef01234567", created=1700000000, params=params)


def _expected(gen, model: str, delta: Delta) -> dict:
    """The OpenAI stream chunk, written out independently of the code under test."""
    item = {"index": delta.choice}
    if gen.params.chat:
        item["delta"] = {"content": delta.text}
    else:
        item["text"] = delta.text
    item["logprobs"] = None
    item["finish_reason"] = delta.finish_reason
    if gen.params.return_steps:
        item["steps"] = delta.steps
    if gen.params.return_token_ids:
        item["token_ids"] = delta.tokens
    obj = "chat.completion.chunk" if gen.params.chat else "text_completion"
    return {"id": gen.id, "object": obj, "created": gen.created, "model": model, "choices": [item]}


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("steps,ids", [(False, False), (True, False), (False, True), (True, True)])
def test_events_are_json_dumps_of_the_chunk(chat, steps, ids):
    model = 'my "model" é'
    gen = _gen(chat, steps, ids)
    chunks = StreamChunks(gen, model)
    deltas = [Delta(i % 3, text, [5, 6 + i], [1, 3], (None, "stop", "length")[i % 3])
              for i, text in enumerate(AWKWARD)]
    for d in deltas:
        assert chunks.event(d).encode() == sse(chunk_dict(gen, model, d))
        assert json.loads(chunks.event(d)[len("data: "):]) == _expected(gen, model, d)
    assert chunks.events(deltas) == b"".join(sse(chunk_dict(gen, model, d)) for d in deltas)
    assert chunks.events(deltas).isascii()
