"""Test-session settings that must precede any import of triton (pulled in by transformers)."""

import os

import torch

# Without a GPU, run Triton kernels on CPU tensors (the fused-readout kernel tests). This only
# counts if set before triton is first imported, hence here.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
