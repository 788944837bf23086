"""More HTTP processes in front of one engine's process (``cyb serve --http-processes N``).

One HTTP process, at some tens of thousands of streamed tokens a second, spends its event
loop's whole core on requests and server-sent events, and requests wait before the engine
sees them.  Here the main process (HTTP process 0, which started the engine's process) starts
N - 1 more.  Each has its own listening socket on the same port (``SO_REUSEPORT``: the kernel
spreads new connections over them), the served model's description and tokenizer, and its own
link to the engine's process (:class:`~.engine_process.EngineLink`).  Each counts its own
requests and shares its counters with the others (:mod:`.metrics`), so ``/metrics`` and
``/health`` on any of them speak for the whole server.

The main process forwards SIGTERM to the others; each drains its own requests
(:func:`~.server.drain`), and the main one stops the engine once they have exited.  When the
main process is killed outright, the engine's process stops with its link, and each other HTTP
process stops when its own link ends.  What each process runs is
:func:`~.server.serve_http_process` (this module only starts, signals and joins them).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sys
import time


def reuse_port_supported() -> bool:
    """Whether listening sockets can share a port with the kernel spreading connections
    (``SO_REUSEPORT`` on Linux)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def default_http_processes(device) -> int:
    """HTTP processes when ``--http-processes`` is not given: on CUDA one per four CPU cores, at
    most 4 (an H200 host with 16 cores: 4); 1 on the CPU, whose cores decode, and where
    ``SO_REUSEPORT`` is missing."""
    if not str(getattr(device, "type", device)).startswith("cuda") or not reuse_port_supported():
        return 1
    return max(1, min(4, (os.cpu_count() or 1) // 4))


class HttpProcesses:
    """The HTTP processes beyond the main one (none when ``options.http_processes`` is 1).

    Args:
        target: what each process runs (picklable by name): ``target(index, served, options,
            link, state, sock, log_level, access_log, threads, ready)`` serves ``sock``
            through ``link`` (``(receive, send)`` of the engine's pipes; ``state``: ``(slots,
            columns, (snapshot, failures, alive))``) until SIGTERM and sets the event ``ready``
            once it accepts connections (:func:`~.server.serve_http_process`).
        served: the :class:`~.served.ServedModel` (pickled to each process).
        options: the :class:`~.options.ServeOptions`.
        engine: the started :class:`~.engine_process.EngineProcess`, whose spare links the
            processes take.
        sockets: one listening socket per extra process (:func:`~.server.bind` with ``count``).
    """

    def __init__(self, target, served, options, engine, sockets, *, log_level: str = "warning",
                 access_log: bool = False) -> None:
        import torch

        if len(engine.spare_links) != len(sockets):
            raise ValueError(f"{len(sockets)} sockets for {len(engine.spare_links)} spare links to the engine")
        ctx = multiprocessing.get_context("spawn")
        state = (engine.slots, engine.columns, engine.state)
        self.processes, self._ready = [], []
        for i, (link, sock) in enumerate(zip(engine.spare_links, sockets), start=1):
            ready = ctx.Event()
            p = ctx.Process(target=target, name=f"cyb-http-{i}", daemon=False,
                            args=(i, served, options, link, state, sock, log_level, access_log,
                                  torch.get_num_threads(), ready))
            p.start()
            self.processes.append(p)
            self._ready.append(ready)
        # the children hold their own copies now: a child's end is then the end of its link and socket
        for link, sock in zip(engine.spare_links, sockets):
            for conn in link:
                conn.close()
            sock.close()
        engine.spare_links = []

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until every process accepts connections; RuntimeError if one exits first."""
        deadline = time.monotonic() + timeout
        for i, (p, ready) in enumerate(zip(self.processes, self._ready), start=1):
            while not ready.wait(0.1):
                if not p.is_alive():
                    raise RuntimeError(f"HTTP process {i} exited (code {p.exitcode}) before it was ready")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"HTTP process {i} was not ready within {timeout:g} s")
        self._ready = []  # the events' semaphores are released with them

    def signal(self, sig=signal.SIGTERM) -> None:
        """Send ``sig`` to every HTTP process still running."""
        for p in self.processes:
            if p.is_alive():
                try:
                    os.kill(p.pid, sig)
                except ProcessLookupError:
                    pass

    def join(self, timeout: float) -> list[int | None]:
        """Wait for them to exit (killed after ``timeout`` seconds); their exit codes."""
        import time

        deadline = time.monotonic() + timeout
        for p in self.processes:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.processes:
            if p.is_alive():
                p.kill()
                p.join()
        return [p.exitcode for p in self.processes]

    def dead(self) -> list[int]:
        """Indices (1, 2, ...) of processes that have exited."""
        return [i for i, p in enumerate(self.processes, start=1) if not p.is_alive()]


__all__ = ["HttpProcesses", "default_http_processes", "reuse_port_supported"]
