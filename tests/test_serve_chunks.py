"""The stream's hot path without a server: the events :class:`cyb.serve.responses.StreamChunks`
writes (byte for byte ``json.dumps`` of the OpenAI chunk, for awkward text too) and how
:meth:`cyb.serve.jobs.Generation.next_deltas` hands out what the engine fed."""

import asyncio
import json
from types import SimpleNamespace

import pytest

from cyb.serve.jobs import Delta, Generation
from cyb.serve.responses import StreamChunks, chunk_dict, sse
from cyb.serve.worker import WorkerFailure

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


class _Worker:
    def __init__(self):
        self.aborted = []

    def submit(self, job):
        pass

    def abort(self, job, choices=None):
        self.aborted.append(choices)


def _generation(choices: int = 1):
    params = SimpleNamespace(chat=False, max_tokens=8, choices=choices, stop=(), requests=lambda eos: [0] * choices)
    served = SimpleNamespace(eos=frozenset(), decode=None)
    return Generation(params, served, _Worker())


def test_next_deltas_coalesces_what_arrived_and_ends():
    async def run():
        gen = _generation(choices=2)
        gen.feed([(0, 11, 1, 5, None), (1, 21, 2, 6, None)])
        gen.feed([(0, 12, 1, 7, None)])
        first = await gen.next_deltas()
        assert [(d.choice, d.tokens, d.steps, d.finish_reason) for d in first] == [
            (0, [11, 12], [1, 1], None), (1, [21], [2], None)]
        waiting = asyncio.ensure_future(gen.next_deltas())
        await asyncio.sleep(0)
        assert not waiting.done()  # nothing new: it waits
        gen.feed([(1, 22, 1, 8, "eos"), (0, 13, 1, 9, "length")])
        second = await waiting
        assert sorted((d.choice, d.finish_reason) for d in second) == [(0, "length"), (1, "stop")]
        assert await gen.next_deltas() == [] and gen.finished
        assert gen.choices[0].token_ids == [11, 12, 13] and gen.choices[0].positions == 9

    asyncio.run(run())


def test_next_deltas_after_a_failure_is_empty():
    async def run():
        gen = _generation()
        waiting = asyncio.ensure_future(gen.next_deltas())
        await asyncio.sleep(0)
        gen.feed(WorkerFailure("boom", 500))
        assert await waiting == [] and gen.failure.message == "boom"

    asyncio.run(run())
