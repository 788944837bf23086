"""Request bodies of ``/v1/completions`` and ``/v1/chat/completions``, checked.

:func:`parse_completion` and :func:`parse_chat` turn a decoded JSON body into
:class:`GenerationParams` or raise :class:`RequestError`: one line that names the field and
what it allows (``max_tokens: must be an integer in [1, 2040] ...``).  Fields of the OpenAI API
that cyb does not implement are refused unless they hold their neutral value (a
``frequency_penalty`` of 0 is accepted, 0.5 is not); fields nobody defines are refused by name.

The pause extensions: ``mode`` (``"fixed"`` or ``"adaptive"``), ``return_steps`` (each choice
carries the steps of its tokens), ``return_token_ids`` (and their ids), ``ignore_eos``, and
``top_k``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..decision import row_keys
from ..engine import Request
from .options import MODES

#: the most stop strings a request may give
MAX_STOP = 16
#: the most choices per prompt (``n``)
MAX_N = 64
#: the most alternatives per token (``logprobs``)
MAX_LOGPROBS = 20


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` with a one-line ``message``, the field
    it concerns (``param``) and the error type of the OpenAI API."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.message = " ".join(message.split())  # one line
        self.status, self.param, self.kind, self.code = status, param, kind, code


@dataclass
class GenerationParams:
    """A checked request: what to generate and what to send back.

    Attributes:
        chat: from ``/v1/chat/completions``.
        prompts: token ids of each prompt (one for chat).
        max_tokens: new tokens per choice at most (0: score the prompt only, with ``echo``).
        n: choices per prompt.
        mode, temperature, top_p, top_k, seed: how each choice decodes (temperature 0: greedy).
        stop: stop strings.
        ignore_eos: EOS ends nothing.
        stream, include_usage: server-sent events, and a last chunk with the usage.
        echo: the completion's text starts with its prompt.
        logprobs: alternatives per token in ``logprobs`` (None: no ``logprobs``).
        return_steps, return_token_ids: each choice carries its tokens' steps / ids.
    """

    chat: bool
    prompts: list[list[int]]
    max_tokens: int
    n: int = 1
    mode: str = "adaptive"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    logprobs: int | None = None
    return_steps: bool = False
    return_token_ids: bool = False
    prompt_tokens: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.prompt_tokens = sum(len(p) for p in self.prompts)

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n

    def prompt_of(self, choice: int) -> list[int]:
        """The prompt ids of choice ``choice`` (choices are numbered prompt by prompt)."""
        return self.prompts[choice // self.n]

    def requests(self, eos: frozenset) -> list[Request]:
        """One engine request per choice; choice ``i`` of a request with ``seed`` samples from the
        stream of ``(seed, i)`` (:func:`cyb.decision.row_keys`), else from a fresh one."""
        sample = self.temperature > 0
        keys = row_keys(self.choices, seed=self.seed) if sample else [0] * self.choices
        ends = frozenset() if self.ignore_eos else eos
        return [Request(tuple(self.prompt_of(i)), self.max_tokens, mode=self.mode, sample=sample,
                        temperature=self.temperature if sample else 1.0, top_k=self.top_k,
                        top_p=self.top_p, key=keys[i], eos=ends)
                for i in range(self.choices)]


# --------------------------------------------------------------------------- fields

_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stream_options", "stop",
           "seed", "user", "frequency_penalty", "presence_penalty", "logit_bias", "mode", "return_steps",
           "return_token_ids", "ignore_eos"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "logprobs", "best_of", "suffix"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format",
                         "parallel_tool_calls", "tools", "tool_choice", "metadata", "store"}
ROLES = ("system", "user", "assistant", "developer", "tool")


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _int(body: dict, name: str, lo: int, hi: int, default):
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value) or not lo <= value <= hi:
        raise RequestError(f"{name}: must be an integer in [{lo}, {hi}], got {_show(value)}", param=name)
    return value


def _number(body: dict, name: str, lo: float, hi: float, default: float, *, open_low: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    ok = _is_number(value) and (lo < value if open_low else lo <= value) and value <= hi
    if not ok:
        bracket = "(" if open_low else "["
        raise RequestError(f"{name}: must be a number in {bracket}{lo:g}, {hi:g}], got {_show(value)}", param=name)
    return float(value)


def _bool(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{name}: must be true or false, got {_show(value)}", param=name)
    return value


def _neutral(body: dict, name: str, allowed, what: str) -> None:
    """Refuse an OpenAI field that cyb does not implement unless it has a value in ``allowed``."""
    value = body.get(name)
    if value is not None and value not in allowed:
        raise RequestError(f"{name}: not supported by cyb serve ({what}), got {_show(value)}", param=name)


def _check_fields(body, allowed: set, path: str) -> None:
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object, got a JSON {type(body).__name__}")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r} for {path} (allowed: {', '.join(sorted(allowed))})",
                           param=unknown[0])


def _model(body: dict, served) -> None:
    name = body.get("model")
    if name is None:
        return
    if not isinstance(name, str):
        raise RequestError(f"model: must be a string, got {_show(name)}", param="model")
    if name not in served.names:
        raise RequestError(f"model: the model {name!r} does not exist; this server serves {served.name!r}",
                           status=404, param="model", code="model_not_found")


def _stop(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > MAX_STOP or any(not isinstance(s, str) or not s for s in stops):
        raise RequestError(f"stop: must be a non-empty string or a list of at most {MAX_STOP} non-empty strings, "
                           f"got {_show(value)}", param="stop")
    return tuple(stops)


def _sampling(body: dict, served) -> dict:
    """The fields both endpoints share, checked."""
    _model(body, served)
    _neutral(body, "frequency_penalty", (0, 0.0), "no penalties")
    _neutral(body, "presence_penalty", (0, 0.0), "no penalties")
    _neutral(body, "logit_bias", ({},), "no logit bias")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise RequestError(f"user: must be a string, got {_show(user)}", param="user")
    mode = body.get("mode", served.default_mode)
    if mode is None:
        mode = served.default_mode
    if mode not in MODES:
        raise RequestError(f"mode: must be one of {', '.join(MODES)}, got {_show(mode)}", param="mode")
    top_k = _int(body, "top_k", -1, 1 << 30, 0)
    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not stream:
            raise RequestError("stream_options: only allowed with stream: true", param="stream_options")
        if not isinstance(opts, dict) or set(opts) - {"include_usage"}:
            raise RequestError(f"stream_options: must be an object with include_usage, got {_show(opts)}",
                               param="stream_options")
        include_usage = bool(opts.get("include_usage", False))
    n = _int(body, "n", 1, MAX_N, 1)
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not -(1 << 63) <= seed < (1 << 64)):
        raise RequestError(f"seed: must be an integer, got {_show(seed)}", param="seed")
    return dict(n=n, mode=mode, temperature=_number(body, "temperature", 0.0, 2.0, 1.0),
                top_p=_number(body, "top_p", 0.0, 1.0, 1.0, open_low=True), top_k=max(top_k, 0), seed=seed,
                stop=_stop(body), ignore_eos=_bool(body, "ignore_eos"), stream=stream, include_usage=include_usage,
                return_steps=_bool(body, "return_steps"), return_token_ids=_bool(body, "return_token_ids"))


def _max_tokens(body: dict, name: str, served, prompts: list[list[int]], default, *, allow_zero: bool,
                prompt_field: str) -> int:
    """``max_tokens`` within the context left by the longest prompt (``default`` None: all of it)."""
    limit = served.max_model_len
    longest = max(len(p) for p in prompts)
    low = 0 if allow_zero else 1
    if longest + low > limit:
        raise RequestError(f"{prompt_field}: the prompt has {_tokens(longest)}, but a request may fill {limit} tokens "
                           "(max_model_len), prompt and max_tokens together", param=prompt_field)
    room = limit - longest
    value = body.get(name)
    if value is None:
        return min(default, room) if default is not None else room
    if not _is_int(value) or not low <= value <= room:
        why = " (0 only with echo and logprobs: scoring the prompt)" if value == 0 and not allow_zero else ""
        raise RequestError(f"{name}: must be an integer in [{low}, {room}] (max_model_len {limit} less the prompt, "
                           f"{_tokens(longest)}), got {_show(value)}{why}", param=name)
    return value


def _prompts(value, served, max_choices: int) -> list[list[int]]:
    """The ``prompt`` field: a string, a list of strings, a list of ids or a list of id lists."""
    if isinstance(value, str) or (isinstance(value, list) and value and all(_is_int(x) for x in value)):
        items = [value]
    elif isinstance(value, list) and value and all(isinstance(x, (str, list)) for x in value):
        items = value
    else:
        raise RequestError("prompt: must be a string, a list of strings, a list of token ids or a list of lists "
                           f"of token ids, none empty, got {_show(value)}", param="prompt")
    if len(items) > max_choices:
        raise RequestError(f"prompt: at most {max_choices} prompts per request, got {len(items)}", param="prompt")
    prompts = []
    for i, item in enumerate(items):
        if isinstance(item, list) and not all(_is_int(x) for x in item):
            raise RequestError(f"prompt: prompt {i} must be a string or a list of integer token ids", param="prompt")
        try:
            prompts.append(served.encode(item, i))
        except ValueError as e:
            raise RequestError(f"prompt: {e}", param="prompt") from None
    return prompts


def parse_completion(body, served, options) -> GenerationParams:
    """A ``/v1/completions`` body as :class:`GenerationParams` (see the module docstring)."""
    _check_fields(body, COMPLETION_FIELDS, "/v1/completions")
    if "prompt" not in body:
        raise RequestError("prompt: required", param="prompt")
    common = _sampling(body, served)
    _neutral(body, "suffix", ("",), "no suffix")
    best_of = body.get("best_of")
    if best_of is not None and best_of != common["n"]:
        raise RequestError(f"best_of: only best_of = n is supported, got {_show(best_of)}", param="best_of")
    prompts = _prompts(body["prompt"], served, options.max_choices)
    echo = _bool(body, "echo")
    logprobs = _int(body, "logprobs", 0, MAX_LOGPROBS, None)
    max_tokens = _max_tokens(body, "max_tokens", served, prompts, 16, allow_zero=echo, prompt_field="prompt")
    if logprobs is not None and common["stream"]:
        raise RequestError("logprobs: not supported with stream: true", param="logprobs")
    if echo and common["stream"]:
        raise RequestError("echo: not supported with stream: true", param="echo")
    if max_tokens == 0 and logprobs is None:
        raise RequestError("max_tokens: 0 generates nothing; it needs echo with logprobs (scoring the prompt)",
                           param="max_tokens")
    params = GenerationParams(chat=False, prompts=prompts, max_tokens=max_tokens, echo=echo, logprobs=logprobs,
                              **common)
    _check_choices(params, options)
    _check_text_fields(params, served)
    return params


def _content(message: dict, i: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"messages[{i}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                                   "are supported", param="messages")
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"messages[{i}].content: must be a string or a list of text parts, got {_show(content)}",
                       param="messages")


def _messages(value) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise RequestError(f"messages: must be a non-empty list of messages, got {_show(value)}", param="messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}]: must be an object with role and content, got {_show(m)}",
                               param="messages")
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(f"messages[{i}].role: must be one of {', '.join(ROLES)}, got {_show(role)}",
                               param="messages")
        extra = set(m) - {"role", "content", "name"}
        if extra:
            raise RequestError(f"messages[{i}]: unknown or unsupported field {sorted(extra)[0]!r} (allowed: role, "
                               "content, name)", param="messages")
        out.append({"role": "system" if role == "developer" else role, "content": _content(m, i)})
    return out


def parse_chat(body, served, options) -> GenerationParams:
    """A ``/v1/chat/completions`` body as :class:`GenerationParams` (see the module docstring)."""
    _check_fields(body, CHAT_FIELDS, "/v1/chat/completions")
    if "messages" not in body:
        raise RequestError("messages: required", param="messages")
    common = _sampling(body, served)
    _neutral(body, "logprobs", (False,), "logprobs: use /v1/completions with echo and logprobs")
    _neutral(body, "top_logprobs", (0,), "logprobs: use /v1/completions with echo and logprobs")
    _neutral(body, "tools", ([],), "no tools")
    _neutral(body, "tool_choice", ("none",), "no tools")
    _neutral(body, "parallel_tool_calls", (False, True), "no tools")
    _neutral(body, "response_format", ({"type": "text"},), "text only")
    _neutral(body, "store", (False,), "nothing is stored")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise RequestError(f"metadata: must be an object, got {_show(metadata)}", param="metadata")
    messages = _messages(body["messages"])
    try:
        prompt = served.chat_ids(messages)
    except ValueError as e:
        raise RequestError(f"messages: {e}", param="messages") from None
    except Exception as e:  # a template that fails on these messages (e.g. roles it refuses)
        raise RequestError(f"messages: the chat template failed: {first_line(e)}", param="messages") from None
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    if body.get("max_completion_tokens") is not None and body.get("max_tokens") is not None:
        raise RequestError("max_tokens: give max_tokens or max_completion_tokens, not both", param="max_tokens")
    max_tokens = _max_tokens(body, name, served, [prompt], None, allow_zero=False, prompt_field="messages")
    params = GenerationParams(chat=True, prompts=[prompt], max_tokens=max_tokens, **common)
    _check_choices(params, options)
    _check_text_fields(params, served)
    return params


def _check_choices(params: GenerationParams, options) -> None:
    if params.choices > options.max_choices:
        raise RequestError(f"n: {len(params.prompts)} prompts x n = {params.n} make {params.choices} choices, more "
                           f"than the {options.max_choices} a request may ask for", param="n")


def _check_text_fields(params: GenerationParams, served) -> None:
    if params.stop and served.tokenizer is None:
        raise RequestError("stop: stop strings need a tokenizer, and the model has none", param="stop")


__all__ = ["CHAT_FIELDS", "COMPLETION_FIELDS", "GenerationParams", "RequestError", "first_line", "parse_chat",
           "parse_completion"]
