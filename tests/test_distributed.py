"""Data parallelism on CPU (gloo): 2-process DDP and FSDP2 equal one process; checkpoints move
between world sizes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from cyb.checkpoint import FAULT_ENV, list_checkpoints
from cyb.metrics_log import read_metrics

pytestmark = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available")

CONFIG = {
    "model": {"arch": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 2,
              "max_position_embeddings": 128},
    "method": {"name": "cyb", "num_steps": 3, "recipe": 2, "omega": [1.0, 1.0, 2.0]},
    "data": {"task": "addition", "task_kwargs": {"digits": 2}, "num_train_examples": 64,
             "num_valid_examples": 8},
    "optim": {"lr": 1e-2, "warmup_steps": 2},
    # one process: 4 micro-batches of 2; two processes: 2 micro-batches of 2 each
    "train": {"steps": 6, "batch_size": 8, "micro_batch_size": 2, "log_every": 1, "eval_every": 3,
              "eval_batches": 1, "save_every": 3, "keep_last": 10, "progress": False},
}
COMPARED = ("loss", "objective", "mean_steps", "grad_norm")


def _fsdp_available() -> bool:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard  # noqa: F401
        except ImportError:
            return False
    return True


def _run(cfg_path: Path, out: Path, procs: int, *overrides: str) -> None:
    train = ["-m", "cyb", "train", str(cfg_path), "--set", f"train.out_dir={out}"]
    for item in overrides:
        train += ["--set", item]
    if procs == 1:
        cmd = [sys.executable, *train]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}", *train]
    env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _rows(out: Path) -> dict:
    return {(r["split"], r["step"]): r for r in read_metrics(out)}


def _assert_same_losses(out: Path, ref: Path, tol: float = 1e-5) -> None:
    rows, expected = _rows(out), _rows(ref)
    assert rows.keys() == expected.keys()
    for key, row in rows.items():
        assert row["targets"] == expected[key]["targets"], key
        for name in COMPARED:
            if name in row and row[name] is not None:
                assert row[name] == pytest.approx(expected[key][name], abs=tol, rel=tol), (key, name)


def _resume_copy(src: Path, dst: Path, step: int) -> Path:
    """A copy of a finished run as it was right after checkpoint ``step``."""
    shutil.copytree(src, dst)
    for ckpt in list_checkpoints(dst):
        if ckpt.step > step:
            shutil.rmtree(ckpt.path)
    shutil.rmtree(dst / "final")
    return dst


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    cfg = root / "run.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    one = root / "one"
    _run(cfg, one, 1)
    return cfg, root, one


def test_ddp_equals_one_process_and_resumes_with_one(runs):
    cfg, root, one = runs
    ddp = root / "ddp"
    _run(cfg, ddp, 2)
    _assert_same_losses(ddp, one)
    meta = list_checkpoints(ddp)[-1].meta
    assert meta["world_size"] == 2
    # a checkpoint written by two processes, resumed by one
    resumed = _resume_copy(ddp, root / "ddp-then-one", 3)
    _run(cfg, resumed, 1)
    _assert_same_losses(resumed, one)


def test_fsdp_resumes_a_one_process_checkpoint_and_matches(runs):
    if not _fsdp_available():
        pytest.skip("this torch has no FSDP2 (fully_shard)")
    cfg, root, one = runs
    resumed = _resume_copy(one, root / "one-then-fsdp", 3)
    _run(cfg, resumed, 2, "train.distributed=fsdp")
    _assert_same_losses(resumed, one)
    from safetensors.torch import load_file

    a = load_file(str(resumed / "final" / "model.safetensors"))
    b = load_file(str(one / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


def test_fsdp_sharded_checkpoints_match_and_resume_in_one_process(runs):
    """Every FSDP process writes its own shards; the run equals one process, and one process
    resumes from the two-process shards."""
    if not _fsdp_available():
        pytest.skip("this torch has no FSDP2 (fully_shard)")
    cfg, root, one = runs
    sharded = root / "fsdp-sharded"
    _run(cfg, sharded, 2, "train.distributed=fsdp", "train.checkpoint_format=sharded")
    _assert_same_losses(sharded, one)
    ckpt = list_checkpoints(sharded)[-1]
    assert ckpt.meta["format"] == "sharded" and ckpt.meta["world_size"] == 2
    assert len(list((ckpt.path / "shards").glob("*.distcp"))) == 2
    resumed = _resume_copy(sharded, root / "sharded-then-one", 3)
    _run(cfg, resumed, 1, "train.checkpoint_format=sharded")
    _assert_same_losses(resumed, one)


def test_gated_pauses_train_alike_under_fsdp(runs):
    """The gates (parameters of the attention modules, in a group of their own) shard with their
    layer: FSDP2 on two processes gives one process's losses and gates."""
    if not _fsdp_available():
        pytest.skip("this torch has no FSDP2 (fully_shard)")
    cfg, root, _ = runs
    one, fsdp = root / "gated-one", root / "gated-fsdp"
    _run(cfg, one, 1, "method.pause_visibility=gated")
    _run(cfg, fsdp, 2, "method.pause_visibility=gated", "train.distributed=fsdp")
    _assert_same_losses(fsdp, one)
    gates = [[r["pause_gate_mean"] for r in read_metrics(out, "train")] for out in (one, fsdp)]
    assert gates[0] == pytest.approx(gates[1], abs=1e-5) and gates[0][-1] != gates[0][0]
