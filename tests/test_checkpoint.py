"""Checkpoints: atomic writes, exact resume after ``kill -9``, interrupted writes are harmless."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from cyb.checkpoint import (FAULT_ENV, fault, latest_checkpoint, list_checkpoints, load_checkpoint,
                            save_checkpoint)
from cyb.metrics_log import MetricsLogger, read_metrics

STEPS = 10
CONFIG = {
    "model": {"arch": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 2,
              "max_position_embeddings": 128},
    # Recipe 2 samples pauses: resuming must also restore the random layouts
    "method": {"name": "cyb", "num_steps": 3, "recipe": 2, "omega": [1.0, 1.0, 1.0]},
    "data": {"task": "addition", "task_kwargs": {"digits": 2}, "num_train_examples": 64,
             "num_valid_examples": 8},
    "optim": {"lr": 1e-2, "warmup_steps": 2},
    "train": {"steps": STEPS, "batch_size": 8, "micro_batch_size": 4, "log_every": 1, "eval_every": 5,
              "eval_batches": 1, "save_every": 2, "keep_last": 10, "progress": False},
}
COMPARED = ("loss", "objective", "mean_steps", "targets", "lr", "grad_norm")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def _command(cfg_path: Path, out_dir: Path) -> list[str]:
    return [sys.executable, "-m", "cyb", "train", str(cfg_path), "--set", f"train.out_dir={out_dir}"]


def _run(cfg_path, out_dir, **env) -> subprocess.CompletedProcess:
    return subprocess.run(_command(cfg_path, out_dir), env=_env(**env), capture_output=True, text=True,
                          timeout=300)


def _by_step(out_dir: Path) -> dict:
    rows = {}
    for r in read_metrics(out_dir):
        key = (r["split"], r["step"])
        assert key not in rows, f"step {key} logged twice"
        rows[key] = {k: r.get(k) for k in COMPARED}
    return rows


@pytest.fixture(scope="module")
def cfg_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "run.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


@pytest.fixture(scope="module")
def reference(cfg_path, tmp_path_factory) -> Path:
    """An uninterrupted run."""
    out = tmp_path_factory.mktemp("reference") / "run"
    done = _run(cfg_path, out)
    assert done.returncode == 0, done.stderr
    return out


def test_kill_9_then_resume_reproduces_the_run(cfg_path, reference, tmp_path):
    out = tmp_path / "run"
    log = (tmp_path / "log.txt").open("w")
    # a pause after each step leaves ample time to strike between the first checkpoint and the end
    proc = subprocess.Popen(_command(cfg_path, out), env=_env(**{FAULT_ENV: "step_delay=0.2"}),
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while proc.poll() is None and not list_checkpoints(out) and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    log.close()
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "log.txt").read_text()
    killed_at = latest_checkpoint(out).step
    assert 2 <= killed_at < STEPS and not (out / "final").exists()

    done = _run(cfg_path, out)
    assert done.returncode == 0, done.stderr
    rows, ref = _by_step(out), _by_step(reference)
    assert rows.keys() == ref.keys()
    assert rows == ref  # bit-for-bit on CPU
    for name in ("ckpt-00000010/model.safetensors", "final/model.safetensors"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name


def test_interrupted_checkpoint_write_keeps_the_last_good_one(cfg_path, reference, tmp_path):
    out = tmp_path / "run"
    died = _run(cfg_path, out, **{FAULT_ENV: "checkpoint_write@4"})
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert [c.step for c in list_checkpoints(out)] == [2]
    partial = list(out.glob("ckpt-00000004.tmp-*"))
    assert len(partial) == 1 and not (partial[0] / "meta.json").exists()
    good = latest_checkpoint(out)
    model_state, trainer_state, data_state, meta = load_checkpoint(good)
    assert meta["step"] == 2 and trainer_state["optimizer"]["state"] and data_state
    assert (good.path / "model.safetensors").read_bytes() == \
        (reference / "ckpt-00000002" / "model.safetensors").read_bytes()

    done = _run(cfg_path, out)
    assert done.returncode == 0, done.stderr
    assert not list(out.glob("*.tmp-*"))
    assert _by_step(out) == _by_step(reference)
    assert [c.step for c in list_checkpoints(out)] == [2, 4, 6, 8, 10]


def test_sharded_checkpoints_resume_the_run(cfg_path, reference, tmp_path):
    """train.checkpoint_format=sharded (torch.distributed.checkpoint) in one process: the run is
    unchanged, and resuming from a checkpoint of the middle reproduces it."""
    out = tmp_path / "run"
    cmd = _command(cfg_path, out) + ["--set", "train.checkpoint_format=sharded"]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "single process" not in done.stderr  # no notice about the missing process group
    assert _by_step(out) == _by_step(reference)
    ckpt = next(c for c in list_checkpoints(out) if c.step == 4)
    assert ckpt.meta["format"] == "sharded"
    assert (ckpt.path / "shards" / ".metadata").is_file() and not (ckpt.path / "model.safetensors").exists()
    model_state, trainer_state, _, _ = load_checkpoint(ckpt)
    assert model_state is None and "optimizer" not in trainer_state
    for later in list_checkpoints(out):
        if later.step > 4:
            shutil.rmtree(later.path)
    shutil.rmtree(out / "final")
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _by_step(out) == _by_step(reference)  # bit-for-bit on CPU


# --------------------------------------------------------------------------- unit level


def _save(run, step, keep_last=2, value=0.0):
    return save_checkpoint(run, step, model_state={"w": torch.full((2, 2), value)},
                           trainer_state={"step": torch.tensor(step), "lrs": [0.1]},
                           data_state={"pos": step}, meta={"note": "x"}, keep_last=keep_last)


def test_save_list_keep_last_and_load(tmp_path):
    for step in (5, 10, 15):
        _save(tmp_path, step, value=float(step))
    assert [c.step for c in list_checkpoints(tmp_path)] == [10, 15]
    model_state, trainer_state, data_state, meta = load_checkpoint(latest_checkpoint(tmp_path))
    assert torch.equal(model_state["w"], torch.full((2, 2), 15.0))
    assert int(trainer_state["step"]) == 15 and data_state == {"pos": 15}
    assert meta == {"note": "x", "step": 15, "format": "full"}


def test_stale_and_incomplete_folders_are_ignored_then_cleaned(tmp_path):
    _save(tmp_path, 1)
    (tmp_path / "ckpt-00000002.tmp-999").mkdir()
    (tmp_path / "ckpt-00000003").mkdir()  # no meta.json: not complete
    assert latest_checkpoint(tmp_path).step == 1
    _save(tmp_path, 4, keep_last=5)
    assert not (tmp_path / "ckpt-00000002.tmp-999").exists()
    assert [c.step for c in list_checkpoints(tmp_path)] == [1, 4]
    os.remove(tmp_path / "ckpt-00000004" / "trainer.pt")
    with pytest.raises(ValueError, match="lacks trainer.pt"):
        load_checkpoint(latest_checkpoint(tmp_path))


def test_tied_weights_are_saved(tmp_path):
    w = torch.randn(3, 2)
    save_checkpoint(tmp_path, 1, model_state={"a": w, "b": w}, trainer_state={}, data_state={}, meta={})
    state, *_ = load_checkpoint(latest_checkpoint(tmp_path))
    assert torch.equal(state["a"], w) and torch.equal(state["b"], w)


def test_fault_setting_parsing(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "step_delay=0.5, checkpoint_write@4")
    assert fault("step_delay") == "0.5" and fault("checkpoint_write") == "4" and fault("other") is None
    monkeypatch.setenv(FAULT_ENV, "checkpoint_write")
    assert fault("checkpoint_write") == ""
    monkeypatch.delenv(FAULT_ENV)
    assert fault("checkpoint_write") is None


def test_metrics_truncation_drops_later_rows_and_a_partial_line(tmp_path):
    log = MetricsLogger(tmp_path)
    for step in (1, 2, 3):
        log.log("train", {"step": step, "loss": 1.0 / step})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"split": "train", "step": 4, "lo')  # a process killed mid-line
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    log.truncate_after(2)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    log.log("train", {"step": 3, "loss": 0.5})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
