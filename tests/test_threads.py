"""CPU threads: the command line gives torch one thread (the same numbers whatever the load and
on any machine), follows the load while training only when CYB_NUM_THREADS=auto asks, and leaves
OMP_NUM_THREADS / CYB_NUM_THREADS settings alone."""

from __future__ import annotations

import pytest
import torch

from cyb import threads


@pytest.fixture(autouse=True)
def restore():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
    threads._state["active"] = False


def test_choose_takes_the_free_cores():
    assert threads.choose(2, 0.0, 2) == 2
    assert threads.choose(2, 1.0, 2) == 1  # one core busy elsewhere: one thread
    assert threads.choose(2, 3.5, 2) == 1  # never fewer than one
    assert threads.choose(16, 0.0, 8) == 8  # never more than torch's default
    assert threads.choose(8, 2.4, 8) == 6


def test_the_environment_fixes_the_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv(threads.ENV, "1")
    assert threads.configure() == 1 and torch.get_num_threads() == 1
    assert threads.adapt() is None  # fixed: never changed while training
    monkeypatch.setenv(threads.ENV, "zero")
    with pytest.raises(ValueError, match="CYB_NUM_THREADS must be a number of threads >= 1 or auto"):
        threads.configure()
    monkeypatch.delenv(threads.ENV)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads.fixed_by_environment() == 0  # torch read it itself
    monkeypatch.setenv(threads.ENV, "auto")  # cyb's own setting wins
    assert threads.fixed_by_environment() is None and threads.follows_load()


def test_by_default_one_thread_whatever_the_machine_and_its_load(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(threads.ENV, raising=False)
    torch.set_num_threads(2)
    for cores in (1, 2, 16):
        monkeypatch.setattr(threads, "cpus", lambda cores=cores: cores)
        for load in (0.0, 1.5, 3.0):
            monkeypatch.setattr(threads.os, "getloadavg", lambda load=load: (load, 0.0, 0.0))
            assert threads.configure() == 1 and torch.get_num_threads() == 1
            assert threads.adapt() is None  # never changed while training


def test_the_same_thread_count_gives_the_same_bits():
    """What the fixed default relies on (sums split between another number of threads may end in
    other last bits: docs/record/benchmarks/cpu.md, "CPU threads")."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 4096, generator=g), torch.randn(4096, 64, generator=g)
    torch.set_num_threads(2)
    two = [a @ b, (a @ b).sum(), a.sum(dim=1)]
    again = [a @ b, (a @ b).sum(), a.sum(dim=1)]
    assert all(torch.equal(x, y) for x, y in zip(two, again))


def test_the_threads_follow_the_load(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv(threads.ENV, "auto")
    torch.set_num_threads(2)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.1, 0.0, 0.0))
    monkeypatch.setattr(threads, "cpus", lambda: 2)
    clock = {"t": 100.0}
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock["t"])
    ticks = {"busy": 0, "own": 0}
    monkeypatch.setattr(threads, "_cpu_ticks", lambda cores: (ticks["busy"], ticks["own"]))
    assert threads.configure() == 2
    hz = threads._state["hz"]

    def after(seconds, busy_cores, own_cores):
        clock["t"] += seconds
        ticks["busy"] += int(busy_cores * hz * seconds)
        ticks["own"] += int(own_cores * hz * seconds)
        return threads.adapt()

    assert after(2, 2.0, 1.0) is None  # too soon to measure again
    assert after(10, 2.0, 1.0) == 1  # another process kept a core busy
    assert torch.get_num_threads() == 1
    assert after(10, 2.0, 1.0) is None  # still busy: unchanged
    assert after(10, 1.0, 1.0) == 2  # it stopped


def test_the_command_line_sets_threads_only_as_the_program(monkeypatch):
    from cyb import cli

    calls = []
    monkeypatch.setattr(threads, "configure", lambda: calls.append(1) or 1)
    # (the program also pins the CPU's numerics in os.environ, which would outlive this test)
    monkeypatch.setattr("cyb.cpu_numerics.pin", lambda: {})
    monkeypatch.setattr("sys.argv", ["cyb", "train", "--help-config"])
    assert cli.main() == 0 and calls == [1]
    assert cli.main(["train", "--help-config"]) == 0 and calls == [1]  # a caller's process is left alone
