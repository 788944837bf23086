"""The HTTP side of ``cyb serve`` (Starlette): routes, authentication, limits, events.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``, ``GET /metrics`` (Prometheus text), and the tokenizer routes that
lm-evaluation-harness's remote tokenizer reads (``GET /tokenizer_info``, ``POST /tokenize``,
``POST /detokenize``).  Every error is a JSON ``{"error": {...}}`` with a one-line message.

What holds for every request: with an API key, ``Authorization: Bearer KEY`` (all routes but
``/health``); at most ``max_concurrency`` requests at once (503 beyond, with ``Retry-After``);
a body of at most ``max_body_bytes`` (413); after SIGTERM no new work (503).  A client that
disconnects has its rows aborted at once, streaming or not.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging

from ..extras import require

require("starlette", "cyb serve")
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, PlainTextResponse, Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

from ..data.tokenizer import encode_failure  # noqa: E402
from . import responses as R  # noqa: E402
from .jobs import Generation  # noqa: E402
from .metrics import SHARE_PERIOD_S  # noqa: E402
from .protocol import RequestError, first_line, parse_chat, parse_completion  # noqa: E402

log = logging.getLogger("cyb.serve")

#: bodies over the limit are still read (and dropped) up to this size, so that the client
#: reads the 413 instead of a reset connection
DISCARD_LIMIT = 64 << 20
ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/tokenize",
          "/detokenize", "/tokenizer_info")


class ServerState:
    """What the routes share: the model, the engine's worker, options, metrics, the requests
    in flight and whether the server is draining (after SIGTERM)."""

    def __init__(self, served, worker, options, metrics) -> None:
        self.served, self.worker, self.options, self.metrics = served, worker, options, metrics
        self.draining = False
        self.in_flight: dict[str, Generation] = {}
        self.loop: asyncio.AbstractEventLoop | None = None

    def peers(self) -> list[dict]:
        """The other HTTP processes' last shared counters (none with one HTTP process)."""
        return list(getattr(self.worker, "peers", {}).values())

    async def share_metrics(self) -> None:
        """Every :data:`~.metrics.SHARE_PERIOD_S`, hand this process's counters to the others."""
        while True:
            await asyncio.sleep(SHARE_PERIOD_S)
            self.worker.share_metrics(self.metrics.shareable())

    def deliver(self, batch) -> None:
        """From the worker's thread: hand a step's ``[(job, items)]`` to the loop."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._feed, batch)

    def _feed(self, batch) -> None:
        tokens = steps = 0
        for job, items in batch:
            n, s = job.feed(items)
            tokens += n
            steps += s
        if tokens:
            self.metrics.tokens(tokens, steps)


def error(status: int, message: str, *, kind: str | None = None, param: str | None = None,
          code: str | None = None, headers: dict | None = None) -> JSONResponse:
    """A JSON error response with a one-line message."""
    if kind is None:
        kind = {401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error",
                429: "rate_limit_error", 503: "server_busy"}.get(status, "invalid_request_error" if status < 500
                                                                  else "server_error")
    return JSONResponse(R.error_body(" ".join(message.split()), kind=kind, param=param, code=code),
                        status_code=status, headers=headers)


def _request_error(e: RequestError) -> JSONResponse:
    headers = {"Retry-After": "1"} if e.status == 503 else None
    return error(e.status, e.message, kind=e.kind, param=e.param, code=e.code, headers=headers)


# --------------------------------------------------------------------------- middleware


class Guard:
    """ASGI middleware: the API key, the routes' status counts, the JSON 404/405."""

    def __init__(self, app, state: ServerState) -> None:
        self.app, self.state = app, state
        key = state.options.api_key
        self._expected = f"Bearer {key}".encode() if key else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        route = path if path in ROUTES else "other"
        metrics = self.state.metrics

        async def counted(message) -> None:
            if message["type"] == "http.response.start":
                metrics.response(route, message["status"])
            await send(message)

        scope["cyb.send"] = send  # the uncounted send, for event streams (they count themselves)
        if self._expected is not None and path != "/health":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                why = "no Authorization header" if not given else "a wrong API key"
                await error(401, f"this server needs an API key (Authorization: Bearer KEY); the request has {why}",
                            headers={"WWW-Authenticate": "Bearer"})(scope, receive, counted)
                return
        await self.app(scope, receive, counted)


# --------------------------------------------------------------------------- bodies


async def read_json(request: Request, limit: int):
    """The body as JSON, or :class:`RequestError`: 413 over ``limit`` bytes, 400 for a body
    that is not UTF-8 or not JSON (NaN and Infinity are not JSON)."""
    declared = request.headers.get("content-length")
    size, chunks, over = 0, [], False
    if declared is not None and declared.isdigit() and int(declared) > DISCARD_LIMIT:
        raise RequestError(f"the body of {int(declared)} bytes is over the limit of {limit} bytes "
                           "(cyb serve --max-body-bytes)", status=413)
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            over = True
            chunks = []
            if size > DISCARD_LIMIT:
                break
        elif not over:
            chunks.append(chunk)
    if over:
        raise RequestError(f"the body of {size if size <= DISCARD_LIMIT else 'over ' + str(DISCARD_LIMIT)} bytes is "
                           f"over the limit of {limit} bytes (cyb serve --max-body-bytes)", status=413)
    raw = b"".join(chunks)
    if not raw.strip():
        raise RequestError("the body is empty: send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"the body is not UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start}") from None

    def no_constant(name):
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as e:
        raise RequestError(f"the body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except ValueError as e:
        raise RequestError(f"the body is not valid JSON: {e}") from None
    except RecursionError:
        raise RequestError("the body is not valid JSON: nested too deeply") from None


# --------------------------------------------------------------------------- generation


class _Admission:
    """A request's place among the ``max_concurrency``; released once (handler or stream end)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.held = False

    def take(self) -> None:
        s = self.state
        if s.draining:
            s.metrics.rejected["shutting_down"] += 1
            raise RequestError("the server is shutting down and accepts no new requests", status=503)
        if not s.worker.alive:
            s.metrics.rejected["engine_stopped"] += 1
            raise RequestError("the engine has stopped (see the server's log); restart cyb serve", status=503)
        limit = s.options.concurrency_per_process
        if s.metrics.in_flight >= limit:
            s.metrics.rejected["concurrency"] += 1
            where = "" if s.options.http_processes == 1 else f" in this of {s.options.http_processes} HTTP processes"
            raise RequestError(f"the server is busy: {s.metrics.in_flight} requests in flight{where}, the limit is "
                               f"{limit} (cyb serve --max-concurrency); retry later", status=503)
        s.metrics.in_flight += 1
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.state.metrics.in_flight -= 1


async def _watch_disconnect(receive, gen: Generation, gone: asyncio.Event) -> None:
    """Cancel ``gen`` as soon as the client disconnects."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
            gen.cancel("the client disconnected", 499)
            return


async def _generate(request: Request, chat: bool) -> Response:
    state: ServerState = request.app.state.cyb
    admission = _Admission(state)
    handed_off = False
    gen = None
    try:
        admission.take()
        body = await read_json(request, state.options.max_body_bytes)
        params = (parse_chat if chat else parse_completion)(body, state.served, state.options)
        gen = Generation(params, state.served, state.worker, state.metrics)
        state.metrics.prompt_tokens += params.prompt_tokens
        state.in_flight[gen.id] = gen
        if params.stream:
            handed_off = True
            return EventStream(state, gen, admission)
        return await _complete(request, state, gen)
    except RequestError as e:
        return _request_error(e)
    finally:
        if not handed_off:
            admission.release()
            if gen is not None:
                state.in_flight.pop(gen.id, None)


async def _complete(request: Request, state: ServerState, gen: Generation) -> Response:
    """A non-streamed request: wait for every choice (and the scoring of ``logprobs``)."""
    gone = asyncio.Event()
    watcher = asyncio.ensure_future(_watch_disconnect(request.receive, gen, gone))
    try:
        gen.start()
        await gen.wait()
        if gen.failure is None and gen.params.logprobs is not None:
            logprobs = await _score(state, gen)
        else:
            logprobs = [None] * len(gen.choices)
    finally:
        watcher.cancel()
    if gen.failure is not None:
        f = gen.failure
        return error(f.status, f.message, kind="server_error" if f.status >= 500 else None)
    served, params = state.served, gen.params
    model = served.name
    if params.chat:
        return JSONResponse(R.chat_completion(gen, model))
    texts = []
    for i, c in enumerate(gen.choices):
        prompt_text = served.text(params.prompt_of(i)) if params.echo else ""
        texts.append(prompt_text + c.text)
    return JSONResponse(R.completion(gen, model, texts, logprobs))


async def _score(state: ServerState, gen: Generation) -> list:
    """Each choice's ``logprobs`` object: one scoring of prompt and completion on the worker."""
    params, served = gen.params, state.served
    sequences = [params.prompt_of(i) + c.token_ids for i, c in enumerate(gen.choices)]
    # spare alternatives: tokens whose strings coincide share one entry of top_logprobs
    future = asyncio.wrap_future(state.worker.score(sequences, top=params.logprobs + 8 if params.logprobs else 0))
    try:
        scores = await future
    except Exception as e:  # noqa: BLE001 - the scoring forward failed: a 500 for this request
        gen.failure = gen.failure or _failure(f"scoring failed: {type(e).__name__}: {e}")
        return [None] * len(sequences)

    def build() -> list:  # decoding every prefix of long prompts: off the event loop
        return [R.logprobs_object(served, seq, scores[i], len(params.prompt_of(i)), top=params.logprobs,
                                  echo=params.echo) for i, seq in enumerate(sequences)]

    return await asyncio.to_thread(build)


def _failure(message: str):
    from .worker import WorkerFailure

    return WorkerFailure(" ".join(message.split()), 500)


class EventStream(Response):
    """A streamed request: server-sent events as the tokens come, ``data: [DONE]`` at the end
    (after a usage chunk with ``include_usage``).  A request that fails or is cancelled (the
    server shutting down) ends with an ``error`` event instead."""

    def __init__(self, state: ServerState, gen: Generation, admission: _Admission) -> None:
        self.state, self.gen, self.admission = state, gen, admission
        self.background = None
        self.status_code = 200

    async def __call__(self, scope, receive, send) -> None:
        gen, state = self.gen, self.state
        send = scope.get("cyb.send", send)  # past the middleware's wrappers: one call per event
        model = state.served.name
        gone = asyncio.Event()
        watcher = asyncio.ensure_future(_watch_disconnect(receive, gen, gone))
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                    (b"cache-control", b"no-cache"), (b"x-request-id", gen.id.encode())]})
            state.metrics.response(scope.get("path", ""), 200)
            gen.start()
            if gen.params.chat:
                await send({"type": "http.response.body", "body": R.role_chunk(gen, model), "more_body": True})
            prefix = R.chunk_prefix(gen, model)
            async for deltas in gen.deltas():
                payload = "".join(R.chunk_event(prefix, gen, d) for d in deltas).encode()
                await send({"type": "http.response.body", "body": payload, "more_body": True})
            if gone.is_set():
                return
            if gen.failure is not None:
                f = gen.failure
                kind = "server_error" if f.status >= 500 else "invalid_request_error"
                tail = R.sse(R.error_body(f.message, kind=kind))
            else:
                tail = (R.usage_chunk(gen, model) if gen.params.include_usage else b"") + R.sse("[DONE]")
            await send({"type": "http.response.body", "body": tail, "more_body": False})
        except OSError:  # the client went away while we wrote
            gen.cancel("the client disconnected", 499)
        except Exception:  # noqa: BLE001 - the response has started: end the stream, keep serving
            log.exception("cyb serve: a stream failed")
            gen.cancel("internal error", 500)
        finally:
            watcher.cancel()
            if not gen.finished:
                gen.cancel("the response ended early", 499)
            state.in_flight.pop(gen.id, None)
            self.admission.release()


# --------------------------------------------------------------------------- routes


async def completions(request: Request) -> Response:
    return await _generate(request, chat=False)


async def chat_completions(request: Request) -> Response:
    return await _generate(request, chat=True)


async def models(request: Request) -> Response:
    state: ServerState = request.app.state.cyb
    served = state.served
    return JSONResponse({"object": "list", "data": [{"id": served.name, "object": "model",
                                                     "created": int(state.metrics.started), "owned_by": "cyb",
                                                     **served.describe()}]})


async def health(request: Request) -> Response:
    state: ServerState = request.app.state.cyb
    in_use, queued, *_ = state.worker.snapshot
    in_flight = state.metrics.in_flight + sum(p["in_flight"] for p in state.peers())
    body = {"status": "ok", "model": state.served.name, "slots": state.worker.slots, "slots_in_use": in_use,
            "queued": queued, "requests_in_flight": in_flight}
    if state.draining:
        return JSONResponse({**body, "status": "shutting down"}, status_code=503)
    if not state.worker.alive:
        return JSONResponse({**body, "status": "engine stopped"}, status_code=503)
    return JSONResponse(body)


async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.cyb
    text = state.metrics.render(state.worker, state.worker.slots, state.draining, peers=state.peers())
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")


async def tokenizer_info(request: Request) -> Response:
    state: ServerState = request.app.state.cyb
    tok = state.served.tokenizer
    if tok is None:
        return error(404, "the model has no tokenizer")
    return JSONResponse({"eos_token": getattr(tok, "eos_token", None), "bos_token": getattr(tok, "bos_token", None),
                         "pad_token": getattr(tok, "pad_token", None),
                         "chat_template": getattr(tok, "chat_template", None),
                         "model_max_length": state.served.max_model_len,
                         "tokenizer_class": type(tok).__name__})


async def tokenize(request: Request) -> Response:
    state: ServerState = request.app.state.cyb
    try:
        body = await read_json(request, state.options.max_body_bytes)
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str) or set(body) - {
                "prompt", "add_special_tokens", "model"}:
            raise RequestError("the body must be {\"prompt\": TEXT, \"add_special_tokens\": BOOL}", param="prompt")
        tok = state.served.tokenizer
        if tok is None:
            raise RequestError("the model has no tokenizer", status=404)
        special = body.get("add_special_tokens", True)
        if not isinstance(special, bool):
            raise RequestError("add_special_tokens: must be true or false", param="add_special_tokens")
        try:
            ids = list(tok(body["prompt"], add_special_tokens=special)["input_ids"])
        except Exception as e:  # noqa: BLE001 - a tokenizer that cannot encode this text
            raise RequestError(f"prompt: {encode_failure(tok, body['prompt'], 'the prompt', e)}",
                               param="prompt") from None
    except RequestError as e:
        return _request_error(e)
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": state.served.max_model_len})


async def detokenize(request: Request) -> Response:
    state: ServerState = request.app.state.cyb
    try:
        body = await read_json(request, state.options.max_body_bytes)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise RequestError("the body must be {\"tokens\": [ID, ...]}", param="tokens")
        tok = state.served.tokenizer
        if tok is None:
            raise RequestError("the model has no tokenizer", status=404)
        if any(not 0 <= t < state.served.vocab.vocab_size for t in tokens):
            raise RequestError(f"tokens: ids must lie in [0, {state.served.vocab.vocab_size})", param="tokens")
        text = tok.decode(tokens, skip_special_tokens=False)
    except RequestError as e:
        return _request_error(e)
    return JSONResponse({"prompt": text})


async def _not_found(request: Request, exc) -> Response:
    status = getattr(exc, "status_code", 404)
    if status == 405:
        return error(405, f"{request.method} is not allowed on {request.url.path}")
    return error(404, f"no route {request.url.path} (routes: {', '.join(ROUTES)})")


async def _server_error(request: Request, exc) -> Response:
    return error(500, f"internal error: {type(exc).__name__}: {first_line(exc)}")


def create_app(state: ServerState):
    """The ASGI application of ``state``: the routes behind :class:`Guard`."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        state.loop = asyncio.get_running_loop()
        sharing = asyncio.ensure_future(state.share_metrics()) if state.options.http_processes > 1 else None
        yield
        if sharing is not None:
            sharing.cancel()

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/tokenizer_info", tokenizer_info, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={404: _not_found, 405: _not_found, Exception: _server_error})
    app.state.cyb = state
    return Guard(app, state)


__all__ = ["EventStream", "Guard", "ROUTES", "ServerState", "create_app", "error", "read_json"]
