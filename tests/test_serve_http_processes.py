"""``cyb serve --http-processes N``: several HTTP processes on one port in front of one engine
process.  Requests on many connections get the tokens one process gives them; ``/metrics`` and
``/health`` on any process count every process's requests; SIGTERM drains them all and exits 0;
an HTTP process that dies leaves the others serving."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from cyb.serve.http_processes import reuse_port_supported  # noqa: E402
from cyb.serve.metrics import Metrics  # noqa: E402
from cyb.serve.options import ServeOptions  # noqa: E402
from serve_helpers import NAME, pause_model, tokenizer  # noqa: E402

needs_reuse_port = pytest.mark.skipif(not reuse_port_supported(), reason="needs SO_REUSEPORT (Linux)")
BODY = {"model": NAME, "prompt": "The quick brown", "max_tokens": 12, "temperature": 0, "ignore_eos": True,
        "mode": "fixed"}


class Server:
    """``cyb serve`` as a program, its standard error kept."""

    def __init__(self, folder, *args: str) -> None:
        env = {**os.environ, "CYB_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "cyb", "serve", str(folder), "--port", "0",
                                      "--served-model-name", NAME, "--max-model-len", "2048", *args],
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        while True:
            line = self.proc.stderr.readline()
            assert line, "cyb serve did not start:\n" + "".join(self.lines)
            self.lines.append(line)
            m = re.search(r"listening: .* on (http://127\.0\.0\.1:\d+) ", line)
            if m:
                self.url = m.group(1)
                return

    def children(self) -> list[int]:
        """Process ids of the server's children (the engine's process and the HTTP processes)."""
        out = []
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            with open(f"/proc/{self.proc.pid}/task/{tid}/children") as f:
                out += [int(p) for p in f.read().split()]
        return out

    def stop(self) -> tuple[int, str]:
        """SIGTERM; the exit code and everything it wrote to standard error."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        return rc, "".join(self.lines) + self.proc.stderr.read()


def _many(url: str, count: int, body: dict, timeout: float = 120.0) -> list:
    """``count`` requests at once, each on a connection of its own (spread over the processes)."""
    async def one():
        async with httpx.AsyncClient(timeout=timeout) as client:
            return await client.post(url + "/v1/completions", json=body)

    async def go():
        return await asyncio.gather(*(one() for _ in range(count)))

    return asyncio.run(go())


def _counted(text: str, route: str, code: int) -> int:
    m = re.search(rf'cyb_requests_total{{route="{re.escape(route)}",code="{code}"}} (\d+)', text)
    return int(m.group(1)) if m else 0


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tok = tokenizer(tmp_path_factory.mktemp("tok"))
    return pause_model(tok, max_positions=4096).save_pretrained(tmp_path_factory.mktemp("model") / "tiny")


@needs_reuse_port
def test_three_http_processes_answer_count_together_and_outlive_one_of_them(folder):
    srv = Server(folder, "--http-processes", "3", "--log-level", "info")
    try:
        assert "3 HTTP processes" in srv.lines[-1]
        answers = _many(srv.url, 24, BODY)
        assert [r.status_code for r in answers] == [200] * 24
        texts = {r.json()["choices"][0]["text"] for r in answers}
        assert len(texts) == 1 and all(r.json()["usage"]["completion_tokens"] == 12 for r in answers)
        time.sleep(1.5)  # each process shares its counters every 0.5 s
        for _ in range(8):  # fresh connections: they land on different processes
            text = httpx.get(srv.url + "/metrics", headers={"Connection": "close"}).text
            assert _counted(text, "/v1/completions", 200) == 24, text
            assert re.search(r"^cyb_completion_tokens_total 288$", text, re.M), text
            health = httpx.get(srv.url + "/health", headers={"Connection": "close"}).json()
            assert health["status"] == "ok" and health["requests_in_flight"] == 0

        # an HTTP process killed: the kernel stops giving it connections, the others serve on
        started = {int(p) for p in re.findall(r"Started server process \[(\d+)\]", "".join(srv.lines))}
        t0 = time.monotonic()
        while len(started) < 3 and time.monotonic() - t0 < 30:  # uvicorn's line of each HTTP process
            line = srv.proc.stderr.readline()
            srv.lines.append(line)
            started |= {int(p) for p in re.findall(r"Started server process \[(\d+)\]", line)}
        os.kill(max(started - {srv.proc.pid}), signal.SIGKILL)
        time.sleep(2.5)
        again = _many(srv.url, 12, BODY)
        assert [r.status_code for r in again] == [200] * 12
        assert {r.json()["choices"][0]["text"] for r in again} == texts
        assert httpx.get(srv.url + "/health").json()["status"] == "ok"
    finally:
        rc, err = srv.stop()
    assert rc == 0, err
    assert re.search(r"HTTP process \d exited; the others go on serving", err), err
    assert "SIGTERM: no request in flight; stopping" in err
    assert err.rstrip().endswith("cyb serve: stopped"), err


@needs_reuse_port
def test_sigterm_lets_every_process_finish_its_streams(folder):
    srv = Server(folder, "--http-processes", "2", "--grace-period", "60")
    try:
        children = srv.children()
        body = {**BODY, "max_tokens": 300}
        out: dict = {}

        def load():
            out["answers"] = _many(srv.url, 8, body)

        t = threading.Thread(target=load, daemon=True)
        t.start()
        t0 = time.monotonic()
        while httpx.get(srv.url + "/health").json()["slots_in_use"] < 8 and time.monotonic() - t0 < 60:
            time.sleep(0.02)
        srv.proc.send_signal(signal.SIGTERM)
        t.join(120)
    finally:
        rc, err = srv.stop()
    assert rc == 0, err
    answers = out["answers"]
    assert [r.status_code for r in answers] == [200] * 8, [r.text for r in answers]
    assert all(r.json()["usage"]["completion_tokens"] == 300 for r in answers)
    assert "in flight get 60 s to finish" in err, err
    t0 = time.monotonic()
    while [p for p in children if _state(p) != "Z"] and time.monotonic() - t0 < 20:
        time.sleep(0.1)
    assert not [p for p in children if _state(p) != "Z"], err


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_counters_of_several_processes_add_up():
    a, b = Metrics(), Metrics()
    a.response("/v1/completions", 200)
    b.response("/v1/completions", 200)
    b.response("/v1/completions", 503)
    a.tokens(5, 7)
    b.tokens(3, 3)
    a.first_token(0.02)
    b.first_token(3.0)
    b.in_flight = 2

    class Worker:
        snapshot, failures = (1, 0, 10, 20, 30), 0

    text = a.render(Worker(), 4, False, peers=[b.shareable()])
    assert _counted(text, "/v1/completions", 200) == 2 and _counted(text, "/v1/completions", 503) == 1
    assert "cyb_completion_tokens_total 8\n" in text and "cyb_token_steps_total 10\n" in text
    assert "cyb_requests_in_flight 2\n" in text and "cyb_mean_steps_per_token 1.25\n" in text
    assert 'cyb_time_to_first_token_seconds_bucket{le="0.025"} 1\n' in text
    assert 'cyb_time_to_first_token_seconds_bucket{le="+Inf"} 2\n' in text


def test_http_processes_options_are_checked():
    assert ServeOptions(max_concurrency=10, http_processes=3).concurrency_per_process == 4
    with pytest.raises(ValueError, match="http_processes"):
        ServeOptions(http_processes=0)
    with pytest.raises(ValueError, match="must not exceed max_concurrency"):
        ServeOptions(max_concurrency=2, http_processes=3)


def test_several_http_processes_need_the_engine_process(folder):
    r = subprocess.run([sys.executable, "-m", "cyb", "serve", str(folder), "--engine", "thread", "--http-processes",
                        "2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "--http-processes above 1 needs the engine in its own process" in r.stderr


@needs_reuse_port
def test_a_killed_main_process_leaves_no_http_process_on_the_port(folder):
    srv = Server(folder, "--http-processes", "3")
    port = int(srv.url.rsplit(":", 1)[1])
    children = srv.children()
    srv.proc.kill()
    srv.proc.wait(30)
    t0 = time.monotonic()
    while [p for p in children if _state(p) != "Z"] and time.monotonic() - t0 < 30:
        time.sleep(0.1)
    left = [p for p in children if _state(p) != "Z"]
    for p in left:  # not left behind by a failing run
        os.kill(p, signal.SIGKILL)
    assert not left, f"processes of the killed server still running: {left}"
    from cyb.serve.server import bind

    bind("127.0.0.1", port).close()  # the port is free again
