"""A small asyncio client of the server's streaming API, for load: no dependency beyond the
standard library, little work per event (``cyb bench serve`` runs hundreds of streams from
one process).

:func:`stream` sends one streamed completion with ``return_steps`` and records when each event
came and how many tokens it carried.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class StreamResult:
    """What one streamed request saw.

    Attributes:
        status: the HTTP status (0: no response).
        error: the error message (HTTP error body, an ``error`` event, or the exception).
        start: when it was sent (``time.perf_counter``).
        events: ``(arrival time, tokens carried)`` per event with tokens.
        steps: the steps of every token, in order.
        text: the text received.
        finish_reason: of the last event.
        end: when the stream ended.
    """

    status: int = 0
    error: str | None = None
    start: float = 0.0
    events: list = field(default_factory=list)
    steps: list = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    end: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def tokens(self) -> int:
        return len(self.steps)

    @property
    def ttft(self) -> float | None:
        """Seconds from sending to the first token."""
        return self.events[0][0] - self.start if self.events else None

    def gaps(self) -> list[float]:
        """Seconds between consecutive events of the stream (each event carries every token
        decided since the one before)."""
        times = [t for t, _ in self.events]
        return [b - a for a, b in zip(times, times[1:])]


def split_url(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


async def _read_head(reader) -> tuple[int, dict]:
    line = await reader.readline()
    if not line:
        raise ConnectionError("the server closed the connection without a response")
    status = int(line.split()[1])
    headers = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            return status, headers
        key, _, value = line.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()


async def _body_chunks(reader, headers: dict):
    """The body's pieces as they come (chunked transfer encoding or a length)."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            line = await reader.readline()
            if not line:
                raise ConnectionError("the connection closed in the middle of the response")
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return
            data = await reader.readexactly(size)
            await reader.readexactly(2)
            yield data
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        yield await reader.read()


async def stream(url: str, path: str, body: dict, *, api_key: str | None = None,
                 timeout: float = 600.0) -> StreamResult:
    """POST ``body`` (``stream`` and ``return_steps`` set here) to ``url + path`` and read the
    events; never raises for HTTP or connection errors (they are in the result)."""
    res = StreamResult(start=time.perf_counter())
    payload = json.dumps({**body, "stream": True, "return_steps": True}).encode()
    host, port = split_url(url)
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n")
    if api_key:
        head += f"Authorization: Bearer {api_key}\r\n"
    writers = []

    async def run() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        writers.append(writer)
        writer.write(head.encode() + b"\r\n" + payload)
        await writer.drain()
        res.status, headers = await _read_head(reader)
        buffer = b""
        async for piece in _body_chunks(reader, headers):
            buffer += piece
            if res.status != 200:
                continue
            *events, buffer = buffer.split(b"\n\n")
            now = time.perf_counter()
            count = 0
            for event in events:
                if not event.startswith(b"data: ") or event == b"data: [DONE]":
                    continue
                obj = json.loads(event[6:])
                if "error" in obj:
                    res.error = obj["error"].get("message", "error")
                    continue
                for choice in obj.get("choices", ()):
                    steps = choice.get("steps") or []
                    res.steps += steps
                    count += len(steps)
                    res.text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                    if choice.get("finish_reason"):
                        res.finish_reason = choice["finish_reason"]
            if count:
                res.events.append((now, count))
        if res.status != 200:
            try:
                res.error = json.loads(buffer)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                res.error = buffer.decode("utf-8", "replace")[:200] or f"HTTP {res.status}"

    try:
        await asyncio.wait_for(run(), timeout)
    except (OSError, ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"
    finally:
        res.end = time.perf_counter()
        for writer in writers:
            writer.close()
    return res


__all__ = ["StreamResult", "split_url", "stream"]
