"""Test-session settings that must precede any import of triton (pulled in by transformers)."""

import os

import torch

# Without a GPU, run Triton kernels on CPU tensors (the fused-readout kernel tests). This only
# counts if set before triton is first imported, hence here.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402  (after the environment above)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: thread start-up costs more than the work (and much more on a busy CPU).
    Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def triton_interpreted():
    """Triton kernels on CPU tensors (the interpreter); skips without triton, or when triton was
    imported before ``TRITON_INTERPRET=1`` was set."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    import triton.language as tl

    if type(tl.max).__name__ != "InterpretedFunction":
        pytest.skip("triton was imported without TRITON_INTERPRET=1 earlier in this process")


@pytest.fixture(autouse=True)
def _the_pin_stays_in_its_test():
    """``cyb.cpu_numerics.pin()`` (the command line run as the program) writes the instruction-set
    variables into ``os.environ`` for the rest of the process; a test that leaves them there
    changes later tests in the same process (torch.compile's CPU kernels read them), and so
    their results depend on which tests ran before."""
    from cyb.cpu_numerics import PINNED

    before = {k: os.environ.get(k) for k in PINNED}
    yield
    after = {k: os.environ.get(k) for k in PINNED}
    assert after == before, f"this test left the CPU numerics pinned in os.environ: {after}"
