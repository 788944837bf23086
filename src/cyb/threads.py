"""How many CPU threads torch computes with: a default that holds up when other work shares the CPU.

torch starts one intra-op thread per core.  When another process keeps some of those cores busy,
every parallel region waits for its slowest thread, and a small model trains several times slower
than on fewer threads (on a 2-core machine with one other busy process, 2 threads gave 9,500
real tokens/s on the demo's model where 1 thread gave 30,700; docs/training.md, "CPU threads").

The command line (``cyb ...`` and ``python -m cyb.integrations.lm_eval``) calls :func:`configure`
once: unless ``OMP_NUM_THREADS`` or ``CYB_NUM_THREADS`` says how many, torch gets the cores that
other work leaves free (the cores this process may run on, within any CPU quota of its cgroup,
less the 1-minute load average, at least 1, at most torch's own default).  While it trains,
:func:`adapt` measures again every few seconds how busy those cores are with other processes
(``/proc/stat`` against this process's own CPU time) and follows.  Programs that import cyb as
a library keep torch's setting.
"""

from __future__ import annotations

import math
import os
import time

#: Environment variable: a number of threads, fixed for the whole run (``auto``: cyb's default).
ENV = "CYB_NUM_THREADS"
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
    stands, as ``OMP_NUM_THREADS`` already set it), or None when neither does."""
    value = os.environ.get(ENV, "").strip().lower()
    if value and value != "auto":
        try:
            n = int(value)
        except ValueError:
            raise ValueError(f"{ENV} must be a number of threads >= 1 or auto, got {value!r}") from None
        if n < 1:
            raise ValueError(f"{ENV} must be a number of threads >= 1 or auto, got {value!r}")
        return n
    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return 0
    return None


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


def configure() -> int:
    """Set torch's threads for a command (see the module docstring); returns the number set."""
    import torch

    fixed = fixed_by_environment()
    if fixed is not None:
        if fixed:
            torch.set_num_threads(fixed)
        _state["active"] = False
        return torch.get_num_threads()
    ceiling = torch.get_num_threads()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    n = choose(cpus(), load, ceiling)
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


__all__ = ["ENV", "INTERVAL_S", "adapt", "choose", "configure", "cpus", "fixed_by_environment"]
