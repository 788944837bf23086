"""The CPU's numerics pinned: the same short training under every instruction set this machine
offers gives identical weights, where without the pin they differ; what the pin sets, and when
it does not."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cyb import cpu_numerics

REPO = Path(__file__).resolve().parent.parent
#: the user-mode emulator (Debian's qemu-user), which runs this machine's programs on another CPU model
QEMU = shutil.which("qemu-x86_64")
#: an Intel CPU with AVX2 and FMA, as ``qemu-x86_64 -cpu help`` names it (its emulated approximate
#: instructions, such as the reciprocal square root, compute otherwise than this machine's)
EMULATED_CPU = "Haswell-v4"
ISA_VARS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def test_pin_sets_the_three_libraries_before_torch_computes():
    env = {"ATEN_CPU_CAPABILITY": "avx512"}
    assert cpu_numerics.pin(env, flags={"avx2", "fma"}, threads_fixed=True) == cpu_numerics.PINNED
    assert env == {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def test_pin_leaves_the_machine_its_own_when_asked_or_when_it_cannot(capsys):
    native = {cpu_numerics.ENV: "native"}
    assert cpu_numerics.pin(native, flags={"avx2", "fma"}, threads_fixed=True) == {}
    assert native == {cpu_numerics.ENV: "native"}
    assert cpu_numerics.pin({}, flags={"avx2", "fma"}, threads_fixed=False) == {}  # CYB_NUM_THREADS=auto
    assert cpu_numerics.pin({"CYB_NUM_THREADS": "auto"}, flags={"avx2", "fma"}) == {}
    assert cpu_numerics.pin({"CYB_NUM_THREADS": "2"}, flags={"avx2", "fma"}) == cpu_numerics.PINNED
    old = {}
    assert cpu_numerics.pin(old, flags={"sse4_2", "avx"}, threads_fixed=True) == {} and old == {}
    assert "this CPU lacks AVX2 and FMA" in capsys.readouterr().err
    with pytest.raises(ValueError, match="CYB_CPU_NUMERICS must be one of pinned, native, got 'fast'"):
        cpu_numerics.pin({cpu_numerics.ENV: "fast"}, flags={"avx2", "fma"}, threads_fixed=True)


#: the pin acts only on x86-64 CPUs with AVX2 and FMA
PINNABLE = cpu_numerics.x86_64() and set(cpu_numerics.NEEDS) <= (cpu_numerics.cpu_flags() or set())
pinnable = pytest.mark.skipif(not PINNABLE, reason="pins x86-64 CPUs with AVX2")


def _child_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ISA_VARS and k not in ("OMP_NUM_THREADS", "CYB_NUM_THREADS")}
    env.update(TQDM_DISABLE="1", **extra)
    return env


def _run(code: str, **env) -> str:
    proc = subprocess.run([sys.executable, "-c", code], env=_child_env(**env), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout + proc.stderr


@pinnable
def test_the_pin_reaches_torch_and_mkl_and_a_late_pin_is_reported():
    out = _run("from cyb.cpu_numerics import pin, check; pin(); import torch; a = torch.ones(64, 64); a @ a;"
               "print(torch.backends.cpu.get_cpu_capability(), check())", MKL_VERBOSE="1")
    assert "AVX2 None" in out and "CNR:COMPATIBLE" in out
    out = _run("import torch; torch.ones(3).exp().sum(); from cyb.cpu_numerics import pin, check; pin(); print(check())",
               ATEN_CPU_CAPABILITY="default")
    assert "torch computes with DEFAULT, not the pinned AVX2" in out


_COMPILED_SMALL_OPS = """
import torch
from cyb.cpu_numerics import align_compiler, pin
pin()
align_compiler()
def rms(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
def mlp(x, a, b):
    return torch.nn.functional.silu(x @ a) * (x @ b)
g = torch.Generator().manual_seed(0)
x, w = torch.randn(2, 7, 64, generator=g), torch.randn(64, generator=g)
a, b = torch.randn(64, 128, generator=g), torch.randn(64, 128, generator=g)
torch.testing.assert_close(torch.compile(rms, dynamic=True)(x, w), rms(x, w))
torch.testing.assert_close(torch.compile(mlp, dynamic=True)(x, a, b), mlp(x, a, b), atol=1e-4, rtol=1e-4)
print("same", torch.backends.cpu.get_cpu_capability())
"""


@pinnable
def test_compiled_kernels_under_the_pin_give_the_eager_numbers():
    """torch.compile's C++ kernels in a pinned process (``cyb train --set train.compile=true`` on a
    CPU): without :func:`cyb.cpu_numerics.align_compiler`, torch 2.13 compiled wrong numbers on an
    AVX-512 CPU under ``ATEN_CPU_CAPABILITY=avx2``."""
    assert "same AVX2" in _run(_COMPILED_SMALL_OPS)


def _offered() -> list[str]:
    """torch's instruction sets this CPU offers (``default`` always)."""
    flags = cpu_numerics.cpu_flags() or set()
    sets = ["default"]
    if {"avx2", "fma"} <= flags:
        sets.append("avx2")
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        sets.append("avx512")
    return sets


#: A short training of the README's addition config at a small size (seconds).
SHORT = ["--set", "model.hidden_size=32", "--set", "model.num_layers=2", "--set", "model.num_heads=2",
         "--set", "train.steps=12", "--set", "train.batch_size=16", "--set", "train.eval_every=12",
         "--set", "train.save_every=12", "--set", "train.eval_batches=1", "--set", "train.log_every=12",
         "--set", "data.num_train_examples=512", "--set", "data.num_valid_examples=32"]


def _train(out: Path, isa: str | None, numerics: str, *, cpu: str | None = None) -> str:
    """The hash of the final weights of the short training, on a machine whose libraries are
    held to ``isa`` (what torch, MKL and oneDNN would take on a CPU that offers no more; None:
    no limit), or on the CPU model ``cpu`` emulated by ``qemu-x86_64``."""
    limits = {"default": ("default", "SSE4_2", "SSE41"), "avx2": ("avx2", "AVX2", "AVX2"),
              "avx512": ("avx512", "AVX512", "AVX512_CORE")}.get(isa)
    held = dict(zip(("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA"), limits or ()))
    env = _child_env(**held, CYB_CPU_NUMERICS=numerics, HF_HUB_OFFLINE="1")
    emulator = [QEMU, "-cpu", cpu] if cpu else []
    proc = subprocess.run([*emulator, sys.executable, "-m", "cyb", "train", str(REPO / "configs" / "cpu-addition.yaml"), *SHORT,
                           "--set", f"train.out_dir={out}"], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("pinned numerics" in proc.stderr) == (numerics == "pinned")
    return hashlib.sha256((out / "final" / "model.safetensors").read_bytes()).hexdigest()


@pytest.mark.skipif(len(_offered()) < 2 or not cpu_numerics.x86_64(), reason="one instruction set only")
def test_the_same_training_under_every_instruction_set_gives_identical_weights(tmp_path):
    offered = _offered()
    pinned = {isa: _train(tmp_path / f"pinned-{isa}", isa, "pinned") for isa in offered}
    assert len(set(pinned.values())) == 1, f"pinned runs differ between instruction sets: {pinned}"
    # without the pin the lowest and the highest set end in other weights: the pin is what holds them
    native = {isa: _train(tmp_path / f"native-{isa}", isa, "native") for isa in (offered[0], offered[-1])}
    assert len(set(native.values())) == 2, f"the instruction sets gave the same weights unpinned: {native}"


@pytest.mark.skipif(QEMU is None or not PINNABLE,
                    reason="needs qemu-x86_64 (Debian's qemu-user) on an x86-64 CPU with AVX2")
def test_another_cpu_model_trains_the_same_weights(tmp_path):
    """The promise itself: the short training gives the same weights on this CPU and on an
    emulated Intel one (about a minute under the emulator).  Before AdamW ran fused on the CPU
    they differed here: its square root came from MKL, and its last bits from the CPU's
    approximate reciprocal square root."""
    here = _train(tmp_path / "here", None, "pinned")
    there = _train(tmp_path / "there", None, "pinned", cpu=EMULATED_CPU)
    assert here == there, f"this CPU and an emulated {EMULATED_CPU} trained other weights"
