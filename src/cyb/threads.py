"""How many CPU threads torch computes with: a fixed number, so that a command gives the same
numbers whatever else runs on the machine, and on any machine.

The number of threads decides how torch splits its sums between them, and so the last bits of
their results: 30 steps of ``configs/cpu-addition.yaml`` ended with weights up to 1.8e-7 apart
with 1 and 2 threads, and over hundreds of steps such differences grow into other models (other
perplexities and exact matches).  With the same number of threads the results are bit-identical,
however busy the machine.

The command line (``cyb ...`` and ``python -m cyb.integrations.lm_eval``) calls :func:`configure`
once.  By default torch computes with **one** thread: the same numbers on every machine (with the
instruction sets :mod:`cyb.cpu_numerics` pins), and the fastest choice where other work shares the CPU (every parallel region
waits for its slowest thread: on a 2-core machine with one other busy process, 2 threads gave
9,500 real tokens/s on the demo's model where 1 thread gave 30,700; docs/record/benchmarks/cpu.md, "CPU
threads").  ``CYB_NUM_THREADS=N`` (or ``OMP_NUM_THREADS``) fixes another number: faster on an idle
machine with several cores (1.6x with 2 on the README's text model), with numbers of their own.
``CYB_NUM_THREADS=auto`` follows the load instead: torch gets the cores that other work leaves
free (less the 1-minute load average), and while it trains :func:`adapt` measures every few
seconds how busy those cores are with other processes (``/proc/stat`` against this process's own
CPU time) and follows; its numbers then depend on the load.  Programs that import cyb as a library
keep torch's setting.
"""

from __future__ import annotations

import math
import os
import time

#: Environment variable: a number of threads, fixed for the whole run, or ``auto`` (follow the load).
ENV = "CYB_NUM_THREADS"
AUTO = "auto"
#: The threads of the command line unless the environment says otherwise.
DEFAULT = 1
#: Seconds between two measurements while training.
INTERVAL_S = 10.0

_state: dict = {"active": False}


def cpus() -> int:
    """The cores this process may run on: its CPU affinity, within its cgroup's CPU quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        n = os.cpu_count() or 1
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(n, 1)


def choose(cores: int, busy_elsewhere: float, ceiling: int) -> int:
    """Threads for ``cores`` of which other processes keep ``busy_elsewhere`` busy: the free
    ones, rounded, at least 1 and at most ``ceiling``."""
    return max(1, min(ceiling, int(math.floor(cores - busy_elsewhere + 0.5))))


def fixed_by_environment() -> int | None:
    """The threads ``CYB_NUM_THREADS`` or ``OMP_NUM_THREADS`` ask for (0: torch's own setting
    stands, as ``OMP_NUM_THREADS`` already set it), or None when neither does (or ``auto``)."""
    value = os.environ.get(ENV, "").strip().lower()
    if value and value != AUTO:
        try:
            n = int(value)
        except ValueError:
            raise ValueError(f"{ENV} must be a number of threads >= 1 or auto, got {value!r}") from None
        if n < 1:
            raise ValueError(f"{ENV} must be a number of threads >= 1 or auto, got {value!r}")
        return n
    if os.environ.get("OMP_NUM_THREADS", "").strip() and value != AUTO:
        return 0
    return None


def follows_load() -> bool:
    """Whether ``CYB_NUM_THREADS=auto`` asks to follow the load."""
    return os.environ.get(ENV, "").strip().lower() == AUTO


def _cpu_ticks(cores: set[int] | None) -> tuple[int, int] | None:
    """``(busy ticks of the given cores, ticks of this process)`` from ``/proc``, or None."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
        with open("/proc/self/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    busy = 0
    for line in lines:
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        if cores is not None and int(name[3:]) not in cores:
            continue
        v = [int(x) for x in fields[:8]]
        busy += v[0] + v[1] + v[2] + v[5] + v[6] + v[7]  # user nice system irq softirq steal
    return busy, int(own[11]) + int(own[12])  # utime + stime


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def configure() -> int:
    """Set torch's threads for a command (see the module docstring); returns the number set."""
    import torch

    fixed = fixed_by_environment()
    _state["active"] = False
    if fixed is not None:
        if fixed:
            torch.set_num_threads(fixed)
        return torch.get_num_threads()
    ceiling = torch.get_num_threads()
    if not follows_load():
        torch.set_num_threads(DEFAULT)
        return DEFAULT
    n = choose(cpus(), _load(), ceiling)
    torch.set_num_threads(n)
    try:
        cores = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = None
    _state.update(active=True, ceiling=ceiling, cores=cores, last=time.monotonic(),
                  ticks=_cpu_ticks(cores), hz=os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
    return n


def adapt() -> int | None:
    """Between training steps: every :data:`INTERVAL_S` seconds, measure how many of this
    process's cores other processes kept busy since the last time and set torch's threads to
    the free ones.  Returns the new number when it changed, else None.  Does nothing unless
    :func:`configure` chose the threads."""
    if not _state["active"]:
        return None
    now = time.monotonic()
    elapsed = now - _state["last"]
    if elapsed < INTERVAL_S:
        return None
    ticks = _cpu_ticks(_state["cores"])
    before, _state["ticks"], _state["last"] = _state["ticks"], ticks, now
    if ticks is None or before is None:
        return None
    import torch

    busy, own = ticks[0] - before[0], ticks[1] - before[1]
    elsewhere = max(busy - own, 0) / (_state["hz"] * elapsed)
    n = choose(cpus(), elsewhere, _state["ceiling"])
    if n == torch.get_num_threads():
        return None
    torch.set_num_threads(n)
    return n


__all__ = ["AUTO", "DEFAULT", "ENV", "INTERVAL_S", "adapt", "choose", "configure", "cpus", "fixed_by_environment",
           "follows_load"]
