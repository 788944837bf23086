"""Kernels: the fused readout, and attention of private and gated pause layouts.

* :func:`fused_readout`: ``(log_t, log_d, log_not_d)`` from hidden states and the output
  embedding, chunk by chunk (evaluation, analysis; any upstream gradient).
* :func:`fused_linear_loss`: the training path; per-block loss with gradients computed in the
  forward pass (three matmuls per chunk, no recompute).
* :func:`split_attention`: a Recipe 1 layout's attention under private or gated pauses as
  causal FlashAttention calls merged by log-sum-exp (:mod:`cyb.kernels.split_attention`).

Backends: ``"torch"`` (any device), ``"triton"`` (CUDA; CPU under ``TRITON_INTERPRET=1``) and
``"auto"``.  Triton is imported only when the triton backend runs.
"""

from .chunk_ops import BACKENDS, resolve_backend, triton_available
from .chunked import FusedLossStats, fused_linear_loss, fused_readout
from .split_attention import split_attention

__all__ = [
    "BACKENDS",
    "FusedLossStats",
    "fused_linear_loss",
    "fused_readout",
    "resolve_backend",
    "split_attention",
    "triton_available",
]
