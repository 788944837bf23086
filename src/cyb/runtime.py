"""Where and in which precision a model runs: the device a name asks for, and the autocast
that a precision setting means. One home for both, for training, evaluation, generation and
the benchmarks."""

from __future__ import annotations

from contextlib import nullcontext

import torch

PRECISIONS = ("auto", "bf16", "fp32")


def resolve_device(spec: str | torch.device | None = "auto", *, local_rank: int | None = None,
                   what: str = "device") -> torch.device:
    """``None``/``"auto"``: this process's GPU when CUDA is available, else the CPU; ``"cuda"``
    with ``local_rank`` (under torchrun): that process's GPU; anything else as torch reads it.

    Raises ValueError naming ``what`` (e.g. ``"train.device"``) for a name torch does not know
    or for CUDA on a machine without it.
    """
    if spec is None or spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cuda" and local_rank is not None:
        spec = f"cuda:{local_rank}"
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"{what}: {spec!r} is not a torch device ({e})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{what}: CUDA was asked for but no GPU is available (use cpu or auto)")
    return device


def autocast(device: torch.device, precision: str):
    """bf16 autocast for ``"bf16"``, and for ``"auto"`` on CUDA (the training default); else a
    context that does nothing (``"fp32"``, or ``"auto"`` on the CPU)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()


def growing_attention(device: torch.device):
    """Attention kernels for a query against a key length that changes every call (eager
    decoding): on CUDA, scaled-dot-product attention without the cuDNN backend, which builds
    a new execution plan for every new key length (measured on an H100, torch 2.11: 6.5 ms of
    host time per call, 107.6 ms against 32.4 ms per M = 4 decode step of a 134 M model);
    flash, memory-efficient and math kernels stay allowed.  Elsewhere a context that does
    nothing."""
    if device.type != "cuda":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


__all__ = ["PRECISIONS", "autocast", "growing_attention", "resolve_device"]
