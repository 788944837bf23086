"""The JSON of the OpenAI API: completions, chat completions, their stream chunks, errors,
``logprobs`` objects; with the pause fields (``steps``, ``token_ids``, the usage's
``positions``, ``real_tokens`` and ``mean_steps``)."""

from __future__ import annotations

import json

from .jobs import Delta, Generation


def error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """``{"error": {...}}`` as the OpenAI API writes it (``message`` is one line)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _extras(params, choice, target: dict) -> dict:
    if params.return_steps:
        target["steps"] = list(choice.steps)
    if params.return_token_ids:
        target["token_ids"] = list(choice.token_ids)
    return target


def completion(gen: Generation, model: str, texts: list[str], logprobs: list[dict | None]) -> dict:
    """The body of a finished ``/v1/completions`` request (``texts``: each choice's text,
    echo included)."""
    params = gen.params
    choices = []
    for c, text, lp in zip(gen.choices, texts, logprobs):
        item = {"index": c.index, "text": text, "logprobs": lp,
                "finish_reason": c.finish_reason or ("length" if params.max_tokens == 0 else None)}
        choices.append(_extras(params, c, item))
    return {"id": gen.id, "object": "text_completion", "created": gen.created, "model": model,
            "choices": choices, "usage": gen.usage()}


def chat_completion(gen: Generation, model: str) -> dict:
    """The body of a finished ``/v1/chat/completions`` request."""
    params = gen.params
    choices = []
    for c in gen.choices:
        item = {"index": c.index, "message": {"role": "assistant", "content": c.text},
                "logprobs": None, "finish_reason": c.finish_reason}
        choices.append(_extras(params, c, item))
    return {"id": gen.id, "object": "chat.completion", "created": gen.created, "model": model,
            "choices": choices, "usage": gen.usage()}


def sse(payload) -> bytes:
    """One server-sent event carrying ``payload`` (JSON, or the literal ``[DONE]``)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def chunk(gen: Generation, model: str, delta: Delta) -> dict:
    """The stream chunk of one :class:`~cyb.serve.jobs.Delta` (as :func:`chunk_event` writes it)."""
    return json.loads(chunk_event(chunk_prefix(gen, model), gen, delta)[6:])


def chunk_prefix(gen: Generation, model: str) -> str:
    """The start of every stream event of ``gen``, up to its choice index (written once)."""
    obj = "chat.completion.chunk" if gen.params.chat else "text_completion"
    return (f'data: {{"id":"{gen.id}","object":"{obj}","created":{gen.created},'
            f'"model":{json.dumps(model)},"choices":[{{"index":')


def chunk_event(prefix: str, gen: Generation, delta: Delta) -> str:
    """The server-sent event of one :class:`~cyb.serve.jobs.Delta`: a completion chunk
    (``text``) or a chat chunk (``delta.content``), with ``steps`` / ``token_ids`` when asked;
    built as a string (a stream writes one per choice per wake-up)."""
    params = gen.params
    text = json.dumps(delta.text)
    body = f',"delta":{{"content":{text}}}' if params.chat else f',"text":{text}'
    finish = "null" if delta.finish_reason is None else f'"{delta.finish_reason}"'
    extra = ""
    if params.return_steps:
        extra += ',"steps":[' + ",".join(map(str, delta.steps)) + "]"
    if params.return_token_ids:
        extra += ',"token_ids":[' + ",".join(map(str, delta.tokens)) + "]"
    return f'{prefix}{delta.choice}{body},"logprobs":null,"finish_reason":{finish}{extra}}}]}}\n\n'


def role_chunk(gen: Generation, model: str) -> bytes:
    """The first chunks of a chat stream: the assistant role of every choice."""
    return b"".join(sse({"id": gen.id, "object": "chat.completion.chunk", "created": gen.created, "model": model,
                         "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                      "finish_reason": None}]})
                    for i in range(gen.params.choices))


def usage_chunk(gen: Generation, model: str) -> bytes:
    """The last chunk of a stream with ``include_usage``: no choices, the usage."""
    obj = "chat.completion.chunk" if gen.params.chat else "text_completion"
    return sse({"id": gen.id, "object": obj, "created": gen.created, "model": model, "choices": [],
                "usage": gen.usage()})


def logprobs_object(served, ids: list[int], scores, prompt_len: int, *, top: int, echo: bool) -> dict:
    """The ``logprobs`` of a completions choice whose prompt and completion are ``ids`` (the
    first ``prompt_len`` the prompt): every token with ``echo``, else the completion's.

    ``scores`` is the :class:`cyb.integrations.scoring.TokenScores` of all of ``ids`` (entry
    ``k - 1`` is about token ``k``); the first token of the sequence has no log-probability
    (``null``, as its ``top_logprobs``).  ``top_logprobs`` hold, per token, the token the greedy
    sequential readout picks there, then the most likely others, ``top`` in all (tokens whose
    strings coincide share one entry); with ``top`` 1 a token's log-probability is the greatest
    listed exactly where greedy decoding would give it, as lm-evaluation-harness checks.
    ``tokens`` are each token's string (special tokens shown); ``text_offset`` where each token
    starts in the choice's ``text`` (special tokens are not in it)."""
    first = 0 if echo else prompt_len
    tokens = [served.token_string(t) for t in ids[first:]]
    token_logprobs, top_logprobs = [], []
    for k in range(first, len(ids)):
        if k == 0:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(scores.log_likelihood[k - 1])
        alternatives: dict[str, float] = {}
        if top:
            alternatives[served.token_string(scores.greedy[k - 1])] = scores.greedy_log_likelihood[k - 1]
            for tok, value in scores.top[k - 1]:
                if len(alternatives) >= top:
                    break
                alternatives.setdefault(served.token_string(tok), value)
        top_logprobs.append(alternatives)
    prompt, completion = ids[:prompt_len], ids[prompt_len:]
    offsets = [len(served.text(prompt[:k])) for k in range(prompt_len)] if echo else []
    base = len(served.text(prompt)) if echo else 0
    offsets += [base + len(served.text(completion[:k])) for k in range(len(completion))]
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": offsets}


__all__ = ["chat_completion", "chunk", "chunk_event", "chunk_prefix", "completion", "error_body", "logprobs_object",
           "role_chunk", "sse", "usage_chunk"]
