"""``cyb serve MODEL [--host 127.0.0.1] [--port 8000] [...]``: an OpenAI-compatible server."""

from __future__ import annotations

import argparse
import os
import sys

HELP = "serve a model over HTTP with the OpenAI API (completions, chat, streaming, echo + logprobs), on the engine"

KEY_ENV = "CYB_API_KEY"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL",
                   help="a saved cyb model folder, a run folder of cyb train (its final/ model) or one of its "
                        "checkpoints; a plain model folder, a .gguf file or a known model's name (smollm2-135m) "
                        "runs as a no-pause baseline")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: a free one, printed at start)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on every route but /health (default: ${KEY_ENV} "
                        "when set, else no key)")
    p.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="the name clients send as model (default: MODEL as given)")
    p.add_argument("--max-model-len", type=int, default=None, metavar="N",
                   help="real tokens a request may fill, prompt and max_tokens together (default: the model's "
                        "position limit, at most 2048)")
    p.add_argument("--slots", type=int, default=None, metavar="N",
                   help="requests that decode at once; more wait in the engine's queue (default: 256 on CUDA, "
                        "64 elsewhere; each holds only the cache blocks its request fills)")
    p.add_argument("--cache-memory", type=float, default=None, metavar="GIB",
                   help="GiB for the KV cache (default: 60%% of the free memory on CUDA, 2 GiB elsewhere)")
    p.add_argument("--block-size", type=int, default=None, metavar="N",
                   help="columns per block of the KV cache, a power of two (default: the engine's, 16)")
    p.add_argument("--no-prefix-caching", action="store_true",
                   help="do not share the cached blocks of prompts that begin alike (default: shared)")
    p.add_argument("--step-budget", type=int, default=None, metavar="N",
                   help="write prompts inside the decoding steps, at most N positions a step with the decoding "
                        "rows' (needs row attention: CUDA; default: prefill forwards of their own)")
    p.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                   help="prompt columns one request writes per prefill forward at most (default: the engine's, "
                        "2048); with --prefill-rows 1, 512 bounds the pause a prompt puts between two tokens of "
                        "the requests already decoding, for some throughput")
    p.add_argument("--prefill-rows", type=int, default=None, metavar="N",
                   help="a prefill forward computes at most N x --prefill-chunk positions (default: the "
                        "engine's, 2)")
    p.add_argument("--mode", choices=("fixed", "adaptive"), default=None,
                   help="mode of requests that do not choose one (default: adaptive for models with <don't know>, "
                        "fixed for the others)")
    p.add_argument("--max-concurrency", type=int, default=1024, metavar="N",
                   help="requests handled at once; more are answered 503 (retry later)")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20, metavar="N",
                   help="largest request body accepted (larger: 413)")
    p.add_argument("--max-choices", type=int, default=256, metavar="N",
                   help="choices (prompts x n) one request may ask for")
    p.add_argument("--grace-period", type=float, default=30.0, metavar="S",
                   help="after SIGTERM or Ctrl-C, seconds that requests in flight get to finish before they are "
                        "cancelled")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template file for /v1/chat/completions (default: the tokenizer's)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--dtype", default=None, choices=("auto", "float32", "bfloat16", "float16"),
                   help="parameter dtype (default, or auto: as transformers loads the checkpoint)")
    p.add_argument("--engine", choices=("process", "thread"), default="process",
                   help="where the engine runs: a process of its own, which loads the model (default: the HTTP "
                        "work never holds up a decoding step), or a thread of the server's process")
    p.add_argument("--http-processes", type=int, default=None, metavar="N",
                   help="processes that answer HTTP on the port, in front of the one engine process (Linux): "
                        "more streams per second than one event loop can write; each takes its share of "
                        "--max-concurrency (default: on CUDA one per 4 CPU cores, at most 4; 1 on the CPU)")
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"),
                   help="uvicorn's log level")
    p.add_argument("--access-log", action="store_true", help="log every request (uvicorn's access log)")


def _fail(message: str) -> int:
    print(f"cyb serve: error: {message}", file=sys.stderr)
    return 2


def _check_host(host: str) -> None:
    """Refuse a ``--host`` that names no address, before the engine starts."""
    import socket

    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError(f"--host {host}: no address of that name ({e.strerror})") from None


#: the fields of :class:`cyb.serve.ServeOptions` that a flag sets, so that its errors name the flag
_FLAGS = {"port": "--port", "max_model_len": "--max-model-len", "slots": "--slots", "max_concurrency":
          "--max-concurrency", "max_body_bytes": "--max-body-bytes", "max_choices": "--max-choices",
          "grace_s": "--grace-period", "http_processes": "--http-processes", "block_size": "--block-size",
          "step_budget": "--step-budget", "prefill_chunk": "--prefill-chunk", "prefill_rows": "--prefill-rows"}


def _in_flag_words(message: str) -> str:
    """An error of :class:`cyb.serve.ServeOptions` as the command line says it: ``slots must be an
    integer >= 1 or None, got 0`` becomes ``--slots must be an integer >= 1, got 0`` (None is the
    flag left out)."""
    field, _, rest = message.partition(" ")
    if field not in _FLAGS:
        return message
    return f"{_FLAGS[field]} {rest.replace(' or None', '')}"


def options_from(args):
    """The :class:`cyb.serve.ServeOptions` of the command line (ValueError for bad values)."""
    from ..serve.options import ServeOptions

    template = None
    if args.chat_template:
        path = os.path.expanduser(args.chat_template)
        if not os.path.isfile(path):
            raise ValueError(f"--chat-template {args.chat_template}: no such file")
        from ..data.sources import read_utf8

        template = read_utf8(path, f"--chat-template {args.chat_template}")
    cache = None
    if args.cache_memory is not None:
        if not args.cache_memory > 0:
            raise ValueError(f"--cache-memory must be > 0 GiB, got {args.cache_memory}")
        cache = int(args.cache_memory * 2**30)
    _check_host(args.host)
    key = args.api_key if args.api_key is not None else (os.environ.get(KEY_ENV) or None)
    http = args.http_processes
    if http is None:
        from ..runtime import resolve_device
        from ..serve.http_processes import default_http_processes

        http = 1 if args.engine != "process" else default_http_processes(resolve_device(args.device, what="--device"))
    try:
        return ServeOptions(host=args.host, port=args.port, api_key=key, model_name=args.served_model_name,
                            max_model_len=args.max_model_len, slots=args.slots, cache_bytes=cache,
                            block_size=args.block_size, prefix_caching=False if args.no_prefix_caching else None,
                            step_budget=args.step_budget, prefill_chunk=args.prefill_chunk,
                            prefill_rows=args.prefill_rows, mode=args.mode,
                            max_body_bytes=args.max_body_bytes, max_concurrency=args.max_concurrency,
                            max_choices=args.max_choices, grace_s=args.grace_period, chat_template=template,
                            http_processes=http)
    except ValueError as e:
        raise ValueError(_in_flag_words(str(e))) from None


def load(model_arg: str, options, *, device=None, dtype=None):
    """The :class:`cyb.serve.served.ServedModel` of ``model_arg`` (as ``cyb generate`` reads it)."""
    from ..engine import unsupported_reason
    from ..model import PauseModel
    from ..model.sources import plain_model_kwargs, plain_model_note
    from ..run_models import saved_model_folder
    from ..runtime import resolve_device
    from ..serve.served import ServedModel

    folder = saved_model_folder(model_arg, "MODEL", allow_plain=True)
    device = resolve_device(device, what="--device")
    plain = plain_model_kwargs(folder)
    if plain:
        print(plain_model_note(model_arg, "is served"), file=sys.stderr)
    model = PauseModel.from_pretrained(folder, torch_dtype=dtype, **plain).to(device).eval()
    reason = unsupported_reason(model)
    if reason is not None:
        raise ValueError(f"the engine cannot run this model: {reason}")
    return ServedModel(model, options.model_name or model_arg, max_model_len=options.max_model_len,
                       mode=options.mode, chat_template=options.chat_template,
                       aliases=(str(folder), os.path.abspath(str(folder))))


def run(args) -> int:
    from ..extras import require

    require("starlette", "cyb serve")
    require("uvicorn", "cyb serve")
    import functools

    worker = None
    try:
        options = options_from(args)
        if options.http_processes > 1 and args.engine != "process":
            raise ValueError("--http-processes above 1 needs the engine in its own process (--engine process)")
        if args.engine == "process":
            from ..run_models import saved_model_folder
            from ..serve.engine_process import EngineProcess

            saved_model_folder(args.model, "MODEL", allow_plain=True)  # a wrong MODEL: refused before the child starts
            loader = functools.partial(load, args.model, options, device=args.device, dtype=args.dtype)
            worker = EngineProcess(loader, slots=options.slots, cache_bytes=options.cache_bytes,
                                   engine_options=options.engine_options, links=options.http_processes).start()
            served = worker.served
        else:
            served = load(args.model, options, device=args.device, dtype=args.dtype)
    except ValueError as e:
        return _fail(str(e))
    except RuntimeError as e:
        return _fail(f"the engine could not start: {e}")
    from ..serve.server import serve

    try:
        return serve(served, options, worker=worker, log_level=args.log_level, access_log=args.access_log)
    except ValueError as e:
        return _fail(str(e))
