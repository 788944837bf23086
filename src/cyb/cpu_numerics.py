"""The same digits on every x86-64 CPU: the instruction sets that torch's CPU arithmetic uses, pinned.

A fixed number of threads (:mod:`cyb.threads`) fixes how sums are split, but not how each piece is
computed.  Three libraries choose their code by the CPU they run on, and each choice ends in other
last bits:

* torch's vectorised kernels (ATen: random numbers, softmax, reductions, the CPU attention) take
  the widest instruction set the CPU offers: AVX-512 where it has it, else AVX2.  Even the
  initial weights (``torch.randn``) differ.  ``ATEN_CPU_CAPABILITY`` fixes the set.
* MKL's matrix products take a code path per CPU, and on a CPU not made by Intel it takes its own
  whatever it is asked for, except its *compatible* path (``MKL_CBWR=COMPATIBLE``: SSE2 code,
  which MKL documents as giving the same results on Intel and compatible processors).
* oneDNN (bf16 and some other paths) takes the widest set too: ``ONEDNN_MAX_CPU_ISA``.

:func:`pin` sets the three, so that a command computes alike on every x86-64 CPU with AVX2 (Intel
since 2013, AMD since 2015): AVX2 kernels for torch and oneDNN, MKL's compatible path.  On an
AMD EPYC with AVX-512, 30 steps of ``configs/cpu-addition.yaml`` ended with other weights under
each of torch's three settings, and with identical ones under the pin whatever the setting
around it (``tests/test_cpu_numerics.py`` holds a shorter run to it); MKL's compatible path costs
1.6x to 2.5x the CPU time there (docs/record/benchmarks/cpu.md, "CPU numerics").  The libraries read the variables once, at their first
computation, so :func:`pin` must run before torch computes anything: the command line calls it
first thing (``cyb ...`` and ``python -m cyb.integrations.lm_eval``), before torch is imported.

It pins whenever the thread count is fixed (the default, one thread, or ``CYB_NUM_THREADS=N``):
with ``CYB_NUM_THREADS=auto`` the numbers follow the load anyway, and the libraries keep their
fastest code.  ``CYB_CPU_NUMERICS=native`` leaves the libraries' own choice (faster, with numbers
of the machine).  A CPU without AVX2 and FMA keeps its own too, and the command says that its
numbers differ in the last bits from those of the pages.  Programs that import cyb as a library
keep torch's settings unless they call :func:`pin` before their first tensor.
"""

from __future__ import annotations

import os
import sys

#: Environment variable: ``pinned`` (the default) or ``native``.
ENV = "CYB_CPU_NUMERICS"
CHOICES = ("pinned", "native")
#: What :func:`pin` sets.
PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"}
#: The capability torch reports once pinned (``torch.backends.cpu.get_cpu_capability()``).
TORCH_CAPABILITY = "AVX2"
#: CPU flags (``/proc/cpuinfo``) that torch's AVX2 kernels need.
NEEDS = ("avx2", "fma")

_state: dict = {"pinned": None}


def choice(environ=None) -> str:
    """``CYB_CPU_NUMERICS`` (``pinned`` by default); ValueError naming the allowed values."""
    value = (os.environ if environ is None else environ).get(ENV, "").strip().lower() or "pinned"
    if value not in CHOICES:
        raise ValueError(f"{ENV} must be one of {', '.join(CHOICES)}, got {value!r}")
    return value


def cpu_flags() -> set[str] | None:
    """The CPU's flags from ``/proc/cpuinfo``, or None where it cannot be read (not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def x86_64() -> bool:
    import platform

    return platform.machine().lower() in ("x86_64", "amd64")


def pin(environ=None, *, flags: set[str] | None = None, threads_fixed: bool | None = None) -> dict:
    """Set :data:`PINNED` in ``environ`` (the process's environment by default) unless
    ``CYB_CPU_NUMERICS=native``, the threads follow the load, the machine is no x86-64 one or its
    CPU lacks AVX2 and FMA.  Call it before torch computes anything.  Returns what it set (``{}``
    when it set nothing); a note on stderr says why a CPU without AVX2 is not pinned."""
    env = os.environ if environ is None else environ
    if threads_fixed is None:
        from .threads import AUTO, ENV as THREADS_ENV

        threads_fixed = env.get(THREADS_ENV, "").strip().lower() != AUTO
    if choice(env) == "native" or not threads_fixed or not x86_64():
        return {}
    flags = cpu_flags() if flags is None else flags
    if flags is not None and not set(NEEDS) <= flags:
        print(f"note: this CPU lacks {' and '.join(n.upper() for n in NEEDS if n not in flags)}: torch computes with "
              "its own instruction set, and the last bits of its numbers (and after many steps the numbers) differ "
              "from those of the pages", file=sys.stderr, flush=True)
        return {}
    env.update(PINNED)
    if environ is None:
        _state["pinned"] = dict(PINNED)
    return dict(PINNED)


def check() -> str | None:
    """After :func:`pin`, once torch is imported: None when torch computes with the pinned
    instruction set, else what differs (torch computed before the pin, so it kept its own)."""
    if not _state["pinned"]:
        return None
    import torch

    got = torch.backends.cpu.get_cpu_capability()
    if got != TORCH_CAPABILITY:
        return (f"torch computes with {got}, not the pinned {TORCH_CAPABILITY}: it computed before "
                f"{ENV} could pin it (call cyb.cpu_numerics.pin() before the first tensor)")
    return None


#: Vector width in bits of each ``ATEN_CPU_CAPABILITY`` that Inductor's C++ kernels can take.
_CAPABILITY_BITS = {"avx2": 256, "avx512": 512}


def align_compiler() -> None:
    """Before ``torch.compile`` runs on a CPU: when ``ATEN_CPU_CAPABILITY`` names an instruction
    set (as :func:`pin` does), Inductor's C++ kernels are told its vector width too.  Left to
    read the variable itself (``cpp.simdlen`` unset), torch 2.13's Inductor compiled wrong
    numbers on an AVX-512 CPU under ``avx2``: an RMSNorm came out 1e34 to 4e37 off, a gated MLP
    464 off (``tests/test_cpu_numerics.py``).  With the width set, the compiled kernels match
    eager ones.  Imports Inductor's configuration only where the variable is set; leaves a width
    someone set."""
    bits = _CAPABILITY_BITS.get(os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower())
    if bits is None:
        return
    import torch._inductor.config as inductor

    if inductor.cpp.simdlen is None:
        inductor.cpp.simdlen = bits


def describe() -> str:
    """A few words for a run's header: whether the CPU's numerics are pinned."""
    return "pinned numerics" if _state["pinned"] else "this CPU's numerics"


__all__ = ["CHOICES", "ENV", "NEEDS", "PINNED", "TORCH_CAPABILITY", "check", "choice", "cpu_flags", "describe", "pin"]
