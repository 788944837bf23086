"""Running the server: the engine's worker (its own process or a thread), the socket, uvicorn,
and shutdown.

:func:`serve` is ``cyb serve`` (in the foreground, SIGTERM and Ctrl-C handled);
:func:`start_background` runs the same server in a thread of the calling process (tests,
notebooks) and returns a handle with its URL.

**Shutdown.**  On SIGTERM (or Ctrl-C) the server stops accepting: the listening socket closes,
idle connections close, and a request that still arrives on an open connection is answered 503.
Requests in flight get ``grace_s`` seconds to finish; those still running then are cancelled
(a non-streamed one is answered 503, a stream ends with an ``error`` event), their rows aborted
in the engine.  Standard error says which finished and which were cancelled.  A second Ctrl-C
quits at once.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import threading
import time

from ..extras import require

require("uvicorn", "cyb serve")
import uvicorn  # noqa: E402

from .app import ServerState, create_app  # noqa: E402
from .metrics import Metrics  # noqa: E402
from .worker import SWITCH_INTERVAL_S, EngineWorker, default_slots, frozen_start_up  # noqa: E402


#: who speaks on standard error (each extra HTTP process names itself)
WHO = "cyb serve"


def say(message: str) -> None:
    """One line on standard error, prefixed ``cyb serve:``."""
    print(f"{WHO}: {message}", file=sys.stderr, flush=True)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(2048)
    return sock


def bind_shared(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` listening sockets on one port with ``SO_REUSEPORT`` (the kernel spreads new
    connections over them; port 0: a free one).  The port is first bound alone, so that a
    server already on it is refused as by :func:`bind`, not joined."""
    probe = bind(host, port)
    family, address = probe.family, probe.getsockname()
    probe.close()
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
            sock.listen(2048)
    except OSError as e:
        for sock in socks:
            sock.close()
        raise ValueError(f"cannot listen on {host}:{address[1]}: {e.strerror or e}") from None
    return socks


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def _loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


class _Uvicorn(uvicorn.Server):
    """uvicorn's server whose SIGTERM / Ctrl-C start the drain of :func:`drain` and do not
    re-raise the signal at the end (the process exits with status 0 after a clean drain)."""

    def __init__(self, config, state: ServerState) -> None:
        super().__init__(config)
        self.cyb_state = state
        self.drained: asyncio.Future | None = None
        self.others = None  # the other HTTP processes (http_processes.HttpProcesses), told of SIGTERM

    def handle_exit(self, sig, frame) -> None:  # noqa: D401 - uvicorn's hook
        if self.should_exit:
            if sig == signal.SIGINT:
                self.force_exit = True
            return
        name = signal.Signals(sig).name if sig else "stop"
        self.should_exit = True
        if self.others is not None:
            self.others.signal(signal.SIGTERM)
        loop = self.cyb_state.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._start_drain, name)

    def _start_drain(self, why: str) -> None:
        if self.drained is None:
            self.drained = asyncio.ensure_future(drain(self.cyb_state, why))

    async def shutdown(self, sockets=None) -> None:
        for server in self.servers:  # stop accepting before the grace period
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # idle keep-alive connections close, busy ones after their response
        self._start_drain("stop")
        await asyncio.shield(self.drained)
        await super().shutdown(sockets=sockets)


async def drain(state: ServerState, why: str) -> tuple[list[str], list[str]]:
    """Stop taking requests, give those in flight ``grace_s`` to finish, cancel the rest;
    says which finished and which were cancelled.  Returns ``(finished ids, cancelled ids)``."""
    state.draining = True
    grace = state.options.grace_s
    pending = list(state.in_flight)
    if pending:
        say(f"{why}: no new requests; {len(pending)} in flight get {grace:g} s to finish: {', '.join(pending)}")
    else:
        say(f"{why}: no request in flight; stopping")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while state.in_flight and loop.time() < deadline:
        await asyncio.sleep(0.02)
    cancelled = []
    for gen_id, gen in list(state.in_flight.items()):
        if gen.cancel(f"the server is shutting down: the request was cancelled after the {grace:g} s grace period",
                      503):
            cancelled.append(gen_id)
    t0 = loop.time()
    while state.in_flight and loop.time() < t0 + 5:  # their handlers send the cancellation
        await asyncio.sleep(0.02)
    finished = [g for g in pending if g not in cancelled]
    if pending:
        say(f"{len(finished)} finished in the grace period ({', '.join(finished) or 'none'}), "
            f"{len(cancelled)} cancelled ({', '.join(cancelled) or 'none'})")
    return finished, cancelled


def build(served, options, *, worker=None, log_level: str = "warning", access_log: bool = False):
    """The worker, the state and the uvicorn server of ``served`` under ``options``.

    ``worker``: a started :class:`~.engine_process.EngineProcess` (the engine in its own
    process); None builds an :class:`~.worker.EngineWorker` (the engine in a thread of this
    process, on ``served.model``)."""
    metrics = Metrics()
    state = ServerState(served, None, options, metrics)
    if worker is None:
        slots = options.slots or default_slots(served.device)
        worker = EngineWorker(served, slots=slots, cache_bytes=options.cache_bytes,
                              engine_options=options.engine_options, deliver=state.deliver).start()
    else:
        worker.deliver = state.deliver
    state.worker = worker
    config = uvicorn.Config(create_app(state), log_level=log_level, access_log=access_log, lifespan="on",
                            timeout_graceful_shutdown=int(options.grace_s) + 10, timeout_keep_alive=30)
    return state, _Uvicorn(config, state)


def describe(state: ServerState, url: str) -> str:
    """The line printed once the server listens."""
    served, worker = state.served, state.worker
    key = ", API key required" if state.options.api_key else ""
    return (f"{served.name} on {url} (M = {served.num_steps}, default mode {served.default_mode}; "
            f"{worker.slots} slots of {served.max_model_len} tokens{key})")




def serve(served, options, *, worker=None, log_level: str = "warning", access_log: bool = False) -> int:
    """Run the server in the foreground until SIGTERM or Ctrl-C (see the module docstring);
    ``worker`` as in :func:`build` (an :class:`~.engine_process.EngineProcess` with
    ``options.http_processes`` links when there are several HTTP processes)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    count = options.http_processes
    socks: list[socket.socket] = []
    try:  # whatever fails before the server runs stops the engine's process, which would keep the command alive
        if count > 1:
            from .http_processes import reuse_port_supported

            if not reuse_port_supported():
                raise ValueError("several HTTP processes need SO_REUSEPORT (Linux); use --http-processes 1")
            if len(getattr(worker, "spare_links", ())) != count - 1:
                raise ValueError("several HTTP processes need the engine in its own process (--engine process)")
        socks = bind_shared(options.host, options.port, count) if count > 1 else [bind(options.host, options.port)]
        state, server = build(served, options, worker=worker, log_level=log_level, access_log=access_log)
    except BaseException:
        if worker is not None:
            worker.stop()
        for sock in socks:
            sock.close()
        raise
    if not options.api_key and not _loopback(options.host):
        say(f"warning: listening on {options.host} without --api-key: anyone who reaches this port can use the model")
    others = None
    url = url_of(socks[0])
    try:
        if count > 1:
            from .http_processes import HttpProcesses

            others = server.others = HttpProcesses(serve_http_process, served, options, state.worker, socks[1:],
                                                   log_level=log_level, access_log=access_log)
            try:
                others.wait_ready()
            except RuntimeError as e:
                raise ValueError(str(e)) from None
            threading.Thread(target=_watch, args=(others, server), daemon=True).start()
        processes = f"; {count} HTTP processes" if count > 1 else ""
        say("listening: " + describe(state, url) + processes)
        with frozen_start_up():
            server.run(sockets=[socks[0]])
    finally:
        if others is not None:
            others.signal(signal.SIGTERM)
            others.join(options.grace_s + 15)
        state.worker.stop()
        for sock in socks:
            sock.close()
    say("stopped")
    return 0


def serve_http_process(index, served, options, link, state, sock, log_level, access_log, threads, ready) -> None:
    """HTTP process ``index`` of several (:class:`~.http_processes.HttpProcesses`): serve ``sock``
    through ``link`` (``(receive, send)`` of the engine's pipes) until SIGTERM, as the main
    process does; sets ``ready`` (an event) once it accepts connections.  It also stops when its
    link ends without being stopped (the engine's process has gone, with the main process), so
    that it never holds the port answering 503 on its own."""
    import torch

    from .engine_process import EngineLink

    global WHO
    torch.set_num_threads(threads)
    WHO = f"cyb serve (HTTP process {index})"
    worker = EngineLink(*link, served=served, slots=state[0], columns=state[1], state=state[2])
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    _, uv = build(served, options, worker=worker, log_level=log_level, access_log=access_log)
    worker.on_end = lambda: uv.handle_exit(0, None)  # drains as on SIGTERM; its requests have failed already
    worker.start_reading()

    def tell_ready() -> None:
        while not uv.started and not uv.should_exit:
            time.sleep(0.01)
        ready.set()

    threading.Thread(target=tell_ready, daemon=True).start()
    try:
        with frozen_start_up():
            uv.run(sockets=[sock])
    finally:
        worker.stop()
        sock.close()


def _watch(others, server) -> None:
    """Say once when one of the other HTTP processes exits before the server stops."""
    told: set[int] = set()
    while not server.should_exit:
        for i in others.dead():
            if i not in told and not server.should_exit:
                told.add(i)
                say(f"HTTP process {i} exited; the others go on serving")
        time.sleep(1.0)


class BackgroundServer:
    """A server running in a thread of this process (:func:`start_background`)."""

    def __init__(self, state: ServerState, server: _Uvicorn, sock: socket.socket, thread: threading.Thread) -> None:
        self.state, self.server, self.sock, self.thread = state, server, sock, thread
        self.url = url_of(sock)

    @property
    def worker(self):
        return self.state.worker

    def stop(self, timeout: float = 30.0) -> None:
        """Drain as on SIGTERM (the options' grace period), then stop the thread and the engine."""
        if self.thread.is_alive():
            self.server.handle_exit(0, None)
            self.thread.join(timeout)
        self.state.worker.stop()
        self.sock.close()

    def __enter__(self) -> "BackgroundServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_background(served, options, *, worker=None, timeout: float = 60.0) -> BackgroundServer:
    """Start the server of ``served`` in a daemon thread; returns once it accepts connections
    (``worker`` as in :func:`build`)."""
    sock = bind(options.host, options.port)
    state, server = build(served, options, worker=worker)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="cyb-serve", daemon=True)
    thread.start()
    t0 = time.monotonic()
    while not server.started:
        if not thread.is_alive() or time.monotonic() - t0 > timeout:
            state.worker.stop()
            sock.close()
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    return BackgroundServer(state, server, sock, thread)


__all__ = ["BackgroundServer", "bind", "bind_shared", "build", "describe", "drain", "serve", "serve_http_process", "start_background", "url_of"]
