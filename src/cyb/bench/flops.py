"""FLOPs of a training step and model FLOPs utilisation (MFU).

Per optimiser step over ``positions`` sequence positions (all rows, pauses included) of
sequences of ``seq`` positions each::

    flops = 6 * params * positions  +  12 * layers * hidden * positions * seq

with ``params`` every parameter of the model (tied matrices once).  The first term is the
forward and backward of the weights (as in the usual count, an untied input embedding -- a
lookup -- is counted too), the second the attention scores and their product with the values
(forward ``4 * seq * hidden`` per position and layer, backward twice that, causal masking not
discounted).  MFU divides the achieved FLOP/s by the dense bf16 peak of the GPU: 989.5 TFLOP/s
for H100 and H200 SXM.  (This formula gives MFU 0.385 for the reference Hugging Face step of
134 M parameters at 222k positions/s, 4 x 8192 positions.)
"""

from __future__ import annotations

#: Dense bf16 peak in TFLOP/s by a substring of the GPU name (first match wins).
PEAK_TFLOPS = (("H100", 989.5), ("H200", 989.5), ("GH200", 989.5))

FORMULA = ("6 * params * positions + 12 * layers * hidden * positions * seq per step (params: "
           "all parameters, tied ones once); "
           "MFU = FLOPs / step time / peak (989.5 TFLOP/s dense bf16, H100/H200 SXM)")


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU named ``device_name``, or None when unknown."""
    for key, value in PEAK_TFLOPS:
        if key in device_name:
            return value
    return None


def train_step_flops(*, params: int, layers: int, hidden: int, positions: int, seq: int) -> float:
    """FLOPs of one training step (see the module docstring)."""
    return 6.0 * params * positions + 12.0 * layers * hidden * positions * seq


def mfu(flops: float, seconds: float, peak: float | None) -> float | None:
    """``flops / seconds / (peak TFLOP/s)``, or None without a peak."""
    if peak is None or not seconds > 0:
        return None
    return flops / seconds / (peak * 1e12)
