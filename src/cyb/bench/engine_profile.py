"""Where an engine job's time goes: the job under ``torch.profiler``, with the engine's phases
labelled (``benchmarks/serve_sizes.py --profile``).

:func:`profiled` wraps a block in the profiler and, while it runs, each method of
:data:`PHASES` in a ``record_function`` range named after it (``Engine._prefill``,
``Runner.decode``...), so that the profile says how much host time each phase takes, how often
it runs and how much GPU time the kernels it launched took.  Nothing of the engine changes:
the methods are wrapped on their classes for the block's duration and restored after it.

The phases nest (``Engine._admit_and_prefill`` holds ``Engine._prefill``, which holds
``Runner.prefill``), so their times are not to be summed.  Kernels that a CUDA graph replays
are counted under the range that replayed it where the profiler sees them at all.
"""

from __future__ import annotations

import contextlib
import functools

import torch

#: ``(module, class, methods)`` labelled while a block is profiled
PHASES = (
    ("cyb.engine.engine", "Engine", ("submit", "step", "_admit_and_prefill", "_prefill", "_start", "_launch",
                                     "_collect", "_compact", "_grow", "_preempt")),
    ("cyb.engine.runner", "Runner", ("prefill", "decode", "mixed")),
    ("cyb.engine.paging", "Pager", ("place", "release")),
)


def _labelled(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)
    return wrapper


@contextlib.contextmanager
def _phases_labelled():
    import importlib

    saved = []
    try:
        for module_name, class_name, methods in PHASES:
            cls = getattr(importlib.import_module(module_name), class_name)
            for method in methods:
                fn = cls.__dict__.get(method)
                if fn is None:  # (an engine without this method: nothing to label)
                    continue
                saved.append((cls, method, fn))
                setattr(cls, method, _labelled(f"{class_name}.{method}", fn))
        yield
    finally:
        for cls, method, fn in reversed(saved):
            setattr(cls, method, fn)


def phase_table(averages) -> dict:
    """``{phase: {"calls", "cpu_ms", "device_ms"}}`` of the labelled phases in ``averages``
    (``profiler.key_averages()``): host time inside the range, and device time of the kernels
    launched inside it."""
    names = {f"{c}.{m}" for _, c, methods in PHASES for m in methods}
    out = {}
    for e in averages:
        if e.key in names:
            out[e.key] = {"calls": int(e.count), "cpu_ms": e.cpu_time_total / 1e3,
                          "device_ms": e.device_time_total / 1e3}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["cpu_ms"]))


class Profile:
    """What :func:`profiled` leaves: :attr:`phases` (:func:`phase_table`) and :attr:`text`
    (the phases, then the 30 operators and kernels of most device time, then of most host
    time), filled in when the block ends."""

    def __init__(self) -> None:
        self.phases: dict = {}
        self.text = ""


@contextlib.contextmanager
def profiled(device: torch.device):
    """Profile the block (CPU, and CUDA where ``device`` is a GPU) with the engine's phases
    labelled; yields a :class:`Profile` that holds the result once the block has ended."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    result = Profile()
    with _phases_labelled(), torch.profiler.profile(activities=activities) as prof:
        yield result
    averages = prof.key_averages()
    result.phases = phase_table(averages)
    lines = ["| phase | calls | host ms | device ms |", "|---|---:|---:|---:|"]
    lines += [f"| {k} | {v['calls']} | {v['cpu_ms']:.1f} | {v['device_ms']:.1f} |" for k, v in result.phases.items()]
    by_device = averages.table(sort_by="device_time_total" if device.type == "cuda" else "cpu_time_total",
                               row_limit=30)
    result.text = "\n".join(lines) + "\n\n" + by_device + "\n" + averages.table(sort_by="self_cpu_time_total",
                                                                                row_limit=30)


__all__ = ["PHASES", "Profile", "phase_table", "profiled"]
