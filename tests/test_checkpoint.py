"""Checkpoints: atomic writes, exact resume after ``kill -9``, interrupted writes are harmless."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile
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

    assert (out / "train.lock").is_file()  # left by the killed run
    done = _run(cfg_path, out)
    assert done.returncode == 0, done.stderr
    assert f"note: {out / 'train.lock'} was left by pid {proc.pid} on host " in done.stderr
    assert "which no longer runs (killed?); taking it over" in done.stderr
    rows, ref = _by_step(out), _by_step(reference)
    assert rows.keys() == ref.keys()
    assert rows == ref  # bit-for-bit on CPU
    for name in ("ckpt-00000010/model.safetensors", "final/model.safetensors"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    assert not (out / "train.lock").exists()  # a finished run lets its folder go


def test_a_second_run_stops_and_ctrl_c_says_what_is_lost_and_how_to_resume(cfg_path, reference, tmp_path):
    import socket

    out = tmp_path / "run"
    # (Ctrl-C's default action restored in the child: a test run started in the background of a
    # shell without job control inherits SIGINT ignored, and so would the training run)
    first = subprocess.Popen(_command(cfg_path, out), env=_env(**{FAULT_ENV: "step_delay=2"}),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while first.poll() is None and latest_checkpoint(out) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    second = _run(cfg_path, out)  # seconds later, into the same folder
    assert first.poll() is None, "the first run ended before the second started"
    assert second.returncode == 2
    err = second.stderr.strip()
    assert err.startswith(f"cyb train: error: train.out_dir ({out}) is in use by another cyb train: pid "
                          f"{first.pid} on host {socket.gethostname()}, started ") and "\n" not in err, err
    assert "wait for it to finish or stop it, or give another train.out_dir" in err
    first.send_signal(signal.SIGINT)
    _, first_err = first.communicate(timeout=120)
    assert first.returncode == 130, first_err
    saved = latest_checkpoint(out).step
    last = first_err.strip().splitlines()[-1]
    assert last.startswith("interrupted at step "), first_err
    stopped = int(last.split()[3].rstrip(":"))
    assert stopped >= saved
    lost = (f"the {stopped - saved} step(s) since the last checkpoint (step {saved}) in {out} are lost"
            if stopped > saved else f"nothing is lost, the last checkpoint (step {saved}) in {out} holds it")
    assert f"{lost}; running the same command again resumes from step {saved}" in last
    assert not (out / "train.lock").exists()
    again = _run(cfg_path, out)  # the same command resumes and ends as the uninterrupted run
    assert again.returncode == 0, again.stderr
    assert f"resumed at step {saved}" in again.stderr
    assert _by_step(out) == _by_step(reference)


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


# --------------------------------------------------------------------------- damaged files


from cyb.checkpoint import (MANIFEST, DamagedFileError, newest_good_checkpoint,  # noqa: E402
                            verify_checkpoint)


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _flip(path: Path, at: float = 0.5) -> None:
    """Change one byte in the middle, keeping the size."""
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0xFF
    path.write_bytes(bytes(data))


def test_manifest_lists_every_file_and_verifies(tmp_path):
    ckpt = _save(tmp_path, 3)
    listed = json.loads((ckpt / MANIFEST).read_text())["files"]
    assert sorted(listed) == ["data.json", "meta.json", "model.safetensors", "trainer.pt"]
    assert listed["trainer.pt"]["size"] == (ckpt / "trainer.pt").stat().st_size
    assert len(listed["trainer.pt"]["sha256"]) == 64
    assert verify_checkpoint(ckpt) is True
    _flip(ckpt / "model.safetensors", 0.9)  # in the data, not the header: loads, but differs
    assert verify_checkpoint(ckpt, full=False) is True  # sizes only
    with pytest.raises(DamagedFileError, match=r"model\.safetensors is damaged \(its sha256 differs"):
        verify_checkpoint(ckpt)


@pytest.mark.parametrize("damage", ["model_truncated", "trainer_truncated", "manifest_sizes",
                                    "meta_garbled", "file_missing"])
def test_load_checkpoint_names_the_damaged_file(tmp_path, damage):
    ckpt = _save(tmp_path, 3)
    if damage == "model_truncated":
        _truncate(ckpt / "model.safetensors")
        name, what = "model.safetensors", "truncated"
    elif damage == "trainer_truncated":
        _truncate(ckpt / "trainer.pt")
        name, what = "trainer.pt", "truncated"
    elif damage == "manifest_sizes":
        manifest = json.loads((ckpt / MANIFEST).read_text())
        manifest["files"]["data.json"]["size"] += 7
        (ckpt / MANIFEST).write_text(json.dumps(manifest))
        name, what = "data.json", "where the manifest says"
    elif damage == "meta_garbled":
        (ckpt / "meta.json").write_text('{"step": 3, "form')
        name, what = "meta.json", "damaged"
    else:
        os.remove(ckpt / "data.json")
        name, what = "data.json", "lacks data.json"
    with pytest.raises(ValueError) as info:
        load_checkpoint(list_checkpoints(tmp_path)[-1])
    assert isinstance(info.value, DamagedFileError)
    assert name in str(info.value) and what in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_checkpoints_without_a_manifest_are_checked_structurally(tmp_path, damage):
    """Checkpoints written before manifests existed: the files must read back."""
    ckpt = _save(tmp_path, 3)
    os.remove(ckpt / MANIFEST)
    assert verify_checkpoint(ckpt) is False  # intact, unverified
    if damage == "truncated":
        _truncate(ckpt / "trainer.pt")
    else:  # one byte of the pickled record, the size unchanged: its CRC-32 no longer matches
        with zipfile.ZipFile(ckpt / "trainer.pt") as z:
            info = next(i for i in z.infolist() if i.filename.endswith("data.pkl"))
        data = bytearray((ckpt / "trainer.pt").read_bytes())
        name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26: info.header_offset + 30])
        data[info.header_offset + 30 + name_len + extra_len + 5] ^= 0xFF
        (ckpt / "trainer.pt").write_bytes(bytes(data))
    with pytest.raises(DamagedFileError, match=r"trainer\.pt is damaged"):
        verify_checkpoint(ckpt)
    if damage == "truncated":
        with pytest.raises(DamagedFileError, match=r"trainer\.pt is damaged \(not a readable"):
            load_checkpoint(list_checkpoints(tmp_path)[-1])
    _save(tmp_path, 1, keep_last=5)
    _truncate(list_checkpoints(tmp_path)[0].path / "model.safetensors")  # the older one, no manifest
    os.remove(list_checkpoints(tmp_path)[0].path / MANIFEST)
    with pytest.raises(DamagedFileError, match=r"model\.safetensors is damaged \("):
        verify_checkpoint(list_checkpoints(tmp_path)[0])


def test_newest_good_checkpoint_skips_damaged_ones(tmp_path):
    for step in (2, 4, 6):
        _save(tmp_path, step, keep_last=5)
    assert newest_good_checkpoint(tmp_path) == (list_checkpoints(tmp_path)[-1], [])
    _truncate(tmp_path / "ckpt-00000006" / "trainer.pt")
    _flip(tmp_path / "ckpt-00000004" / "model.safetensors", 0.9)
    ckpt, skipped = newest_good_checkpoint(tmp_path)
    assert ckpt.step == 2
    assert [p.name for p, _ in skipped] == ["ckpt-00000006", "ckpt-00000004"]
    assert skipped[0][1].startswith("trainer.pt is damaged (truncated")
    assert "sha256" in skipped[1][1]
    os.remove(tmp_path / "ckpt-00000002" / "model.safetensors")
    ckpt, skipped = newest_good_checkpoint(tmp_path)
    assert ckpt is None and len(skipped) == 3 and "model.safetensors is missing" in skipped[2][1]
    assert newest_good_checkpoint(tmp_path / "nothing") == (None, [])


def test_keep_last_never_removes_the_last_good_checkpoint(tmp_path):
    _save(tmp_path, 5)
    _save(tmp_path, 10)
    _truncate(tmp_path / "ckpt-00000010" / "model.safetensors")
    _save(tmp_path, 15, keep_last=2)  # the damaged one neither counts as kept nor stays
    assert [c.step for c in list_checkpoints(tmp_path)] == [5, 15]
    # resumed from 5 past a damaged 10, writing 7: the good 5 stays beside it
    _save(tmp_path, 10, keep_last=5)
    _truncate(tmp_path / "ckpt-00000010" / "trainer.pt")
    shutil.rmtree(tmp_path / "ckpt-00000015")
    _save(tmp_path, 7, keep_last=2)
    assert [c.step for c in list_checkpoints(tmp_path)] == [5, 7]
    _save(tmp_path, 9, keep_last=1)
    assert [c.step for c in list_checkpoints(tmp_path)] == [9]


def test_a_damaged_shard_is_found(tmp_path):
    """Sharded checkpoints list every shard in the manifest (written by rank 0 once all are in)."""
    from cyb.checkpoint import begin_checkpoint

    tmp = begin_checkpoint(tmp_path, 4)
    (tmp / "shards").mkdir()
    (tmp / "shards" / ".metadata").write_bytes(b"m" * 100)
    (tmp / "shards" / "__0_0.distcp").write_bytes(b"s" * 1000)
    ckpt = save_checkpoint(tmp_path, 4, model_state=None, tmp=tmp, trainer_state={}, data_state={}, meta={})
    assert "shards/__0_0.distcp" in json.loads((ckpt / MANIFEST).read_text())["files"]
    assert verify_checkpoint(ckpt)
    _truncate(ckpt / "shards" / "__0_0.distcp")
    with pytest.raises(DamagedFileError, match=r"__0_0\.distcp is damaged \(truncated: 500 bytes"):
        verify_checkpoint(ckpt)


# ------------------------------------------------ resuming and loading models past damaged files

TINY = {
    "model": {"arch": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 2,
              "max_position_embeddings": 128},
    "method": {"name": "cyb", "num_steps": 3},
    "data": {"task": "addition", "task_kwargs": {"digits": 2}, "num_train_examples": 64,
             "num_valid_examples": 8},
    "optim": {"lr": 1e-2, "warmup_steps": 2},
    "train": {"steps": 4, "batch_size": 8, "log_every": 1, "eval_every": 0, "save_every": 2,
              "keep_last": 5, "eval_batches": 1, "progress": False},
}


def _tiny_cfg(out_dir):
    from cyb.config import RunConfig

    cfg = json.loads(json.dumps(TINY))
    cfg["train"]["out_dir"] = str(out_dir)
    return RunConfig.from_dict(cfg).validate()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, one_thread):
    """A finished 4-step run with checkpoints at steps 2 and 4 and its final/ model."""
    from cyb.train import train

    out = tmp_path_factory.mktemp("tiny") / "run"
    train(_tiny_cfg(out))
    return out


DAMAGES = {
    "model_truncated": lambda c: _truncate(c / "model.safetensors"),
    "trainer_truncated": lambda c: _truncate(c / "trainer.pt"),
    "trainer_flipped": lambda c: _flip(c / "trainer.pt"),
    "manifest_sizes": lambda c: (c / MANIFEST).write_text(json.dumps({"version": 1, "files": {
        k: {**v, "size": v["size"] + 1} for k, v in json.loads((c / MANIFEST).read_text())["files"].items()}})),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_resume_falls_back_to_the_previous_checkpoint(tiny_run, tmp_path, capsys, damage):
    from cyb.train import Trainer

    out = tmp_path / "run"
    shutil.copytree(tiny_run, out)
    shutil.rmtree(out / "final")
    DAMAGES[damage](out / "ckpt-00000004")
    capsys.readouterr()
    trainer = Trainer(_tiny_cfg(out))
    assert trainer.step == 2
    err = capsys.readouterr().err
    assert f"warning: not resuming from {out / 'ckpt-00000004'}: " in err
    assert ("trainer.pt" if "trainer" in damage else "data.json" if damage == "manifest_sizes"
            else "model.safetensors") in err
    assert f"resuming from the newest intact checkpoint, {out / 'ckpt-00000002'}" in err
    if damage == "model_truncated":  # the run ends as the undamaged one did
        trainer.run()
        assert (out / "final" / "model.safetensors").read_bytes() == \
            (tiny_run / "final" / "model.safetensors").read_bytes()
        assert verify_checkpoint(list_checkpoints(out)[-1])


def test_resume_refuses_when_every_checkpoint_is_damaged(tiny_run, tmp_path):
    from cyb.train import Trainer

    out = tmp_path / "run"
    shutil.copytree(tiny_run, out)
    for ckpt in list_checkpoints(out):
        _truncate(ckpt.path / "trainer.pt")
    with pytest.raises(ValueError, match=r"no checkpoint in .* can be resumed from .*ckpt-00000002: "
                                         r"trainer\.pt is damaged"):
        Trainer(_tiny_cfg(out))
    assert all((c.path / "trainer.pt").exists() for c in list_checkpoints(out))  # nothing removed


@pytest.mark.parametrize("damage", ["truncated", "header", "missing", "config_json"])
def test_a_damaged_saved_model_gives_one_error_naming_the_file(tiny_run, tmp_path, capsys, damage):
    from cyb.cli import main
    from cyb.model import PauseModel

    final = tmp_path / "run" / "final"
    shutil.copytree(tiny_run / "final", final)
    shutil.copy(tiny_run / "config.yaml", final.parent / "config.yaml")
    weights = final / "model.safetensors"
    if damage == "truncated":
        _truncate(weights, 0.9)
        name, reason = weights, "incomplete metadata"
    elif damage == "header":
        weights.write_bytes((10**12).to_bytes(8, "little") + weights.read_bytes()[8:])
        name, reason = weights, "header too large"
    elif damage == "missing":
        weights.unlink()
        name, reason = final, "holds no weights"
    else:
        _truncate(final / "config.json")
        name, reason = final / "config.json", "not valid JSON"
    with pytest.raises(DamagedFileError) as info:
        PauseModel.from_pretrained(final)
    message = str(info.value)
    assert str(name) in message and reason in message and "\n" not in message
    if damage != "missing":
        assert f"cyb train {final.parent / 'config.yaml'} --set train.out_dir={final.parent}" in message
    capsys.readouterr()
    assert main(["generate", str(final), "--prompt", "12+"]) == 2
    assert capsys.readouterr().err.strip() == f"cyb generate: error: {message}"
