"""Timing, memory and bookkeeping shared by the benchmarks.

* :func:`time_calls`: warm-up calls, then ``repeats`` timed calls (CUDA events on CUDA, the host
  clock elsewhere); the median, every time, and the peak of ``torch.cuda.max_memory_allocated``
  over the timed calls (its statistics are reset after the warm-up).
* :func:`guarded`: runs one benchmark row; an out-of-memory error becomes ``status="oom"`` and
  any other error ``status="error"`` with its message, so one failure never loses the rest.
* :class:`Budget`: a wall-clock budget; rows that would start after it are skipped.
* :func:`environment`, :func:`write_json`: what ran where, and atomic JSON output.
"""

from __future__ import annotations

import gc
import math
import os
import platform
import sys
import time
import traceback
from typing import Callable

import torch

from ..files import write_json_atomic

GIB = float(2**30)


def sync(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (no-op off CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def is_oom(err: BaseException) -> bool:
    """Whether ``err`` is an out-of-memory error (CUDA or host allocator)."""
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return True
    text = str(err).lower()
    return "out of memory" in text or "can't allocate memory" in text


def free_memory(device: torch.device) -> None:
    """On CUDA, collect garbage and return cached blocks to the driver (nothing elsewhere:
    a full collection costs more than tiny CPU rows)."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def median(values: list[float]) -> float:
    """The median (mean of the two middle values for an even count); NaN when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float | None:
    """Peak allocated memory since the last :func:`reset_peak`, in GiB (None off CUDA)."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / GIB


def time_calls(fn: Callable[[], object], *, device: torch.device, warmup: int, repeats: int) -> dict:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeats`` timed ones.

    Returns ``{"ms": median ms, "ms_all": [ms, ...], "peak_gib": GiB or None,
    "warmup_ms": [ms, ...]}``.  The peak covers the timed calls only, and everything alive
    during them (parameters, optimiser state, activations): ``torch.cuda.max_memory_allocated``
    after ``torch.cuda.reset_peak_memory_stats``.  Warm-up times are host-clock times (they
    include compilation).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    warm = []
    for _ in range(max(warmup, 0)):
        t0 = time.perf_counter()
        fn()
        sync(device)
        warm.append((time.perf_counter() - t0) * 1e3)
    reset_peak(device)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(float(start.elapsed_time(end)))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return {"ms": median(times), "ms_all": times, "peak_gib": peak_gib(device), "warmup_ms": warm}


def kernel_ms(fn: Callable[[], object], *, device: torch.device, calls: int = 2) -> float | None:
    """The GPU's kernel time per call of ``fn`` in ms (``calls`` calls under the torch profiler:
    the sum of every kernel's own time), or None off CUDA or where the profiler cannot say.

    Unlike the wall time of a call, this does not move with the speed of the host: two machines
    with the same GPU give the same figure, where a slower host leaves the GPU idle for longer."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            sync(device)
        total_us = sum(getattr(e, "self_device_time_total", 0) for e in prof.key_averages()
                       if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception:  # noqa: BLE001 (a profiler already running, or none here: the row keeps its other figures)
        return None
    return total_us / calls / 1e3 if total_us else None


def graphed(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` (CUDA work on the current device) run once on a side stream as a warm-up, then
    captured as a CUDA graph: returns the graph's replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def guarded(fn: Callable[[], dict], device: torch.device) -> dict:
    """``{"status": "ok", **fn()}``, or ``{"status": "oom"}`` / ``{"status": "error", ...}``.

    The exception (and the frames holding its tensors) is dropped before memory is freed.
    """
    try:
        row = {"status": "ok", **fn()}
    except Exception as err:  # noqa: BLE001 (a benchmark row records its failure and goes on)
        if is_oom(err):
            row = {"status": "oom"}
        else:
            row = {"status": "error", "reason": f"{type(err).__name__}: {err}"[:500],
                   "where": "".join(traceback.format_tb(err.__traceback__)[-3:])[-1500:]}
    # the exception and its frames are gone here, so their tensors can be freed
    free_memory(device)
    return row


class Budget:
    """A wall-clock budget in seconds (None: unlimited), counted from construction."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def remaining(self) -> float:
        return math.inf if self.seconds is None else self.seconds - self.elapsed()

    def allows(self, needed_s: float = 0.0) -> bool:
        """Whether ``needed_s`` more seconds still fit."""
        return self.remaining() >= needed_s


def _version(dist: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001
        return None


def device_name(device: torch.device) -> str:
    """The GPU's name on CUDA, else ``"cpu"`` (or the device type)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def environment(device: torch.device) -> dict:
    """Versions and device of this run, and the command line that started it."""
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "triton": _version("triton"),
        "liger_kernel": _version("liger-kernel") or _version("liger_kernel"),
        "device": str(device),
        "device_name": device_name(device),
        "argv": list(sys.argv),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda
        props = torch.cuda.get_device_properties(device)
        env["gpu_memory_gib"] = round(props.total_memory / GIB, 1)
    return env


def write_json(path: str | os.PathLike | None, data: dict) -> None:
    """Write ``data`` as strict JSON to ``path`` atomically (nothing when ``path`` is None)."""
    if path is not None:
        write_json_atomic(path, data)
