"""cyb train with train.wandb, in W&B's offline mode (nothing leaves the machine): the offline
run folder holds every metrics row, the configuration and the final model card; a resumed run
continues the same W&B run; a missing package or a run W&B cannot start is one line."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

pytest.importorskip("wandb")

from cyb.config import RunConfig  # noqa: E402
from cyb.metrics_log import read_metrics  # noqa: E402
from cyb.train import train  # noqa: E402
from cyb.wandb_log import RUN_FILE  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def _cfg(out, steps=4):
    return RunConfig.from_dict({
        "model": {"arch": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "max_position_embeddings": 128},
        "method": {"name": "cyb", "num_steps": 3},
        "data": {"task": "addition", "task_kwargs": {"digits": 2}, "num_train_examples": 64, "num_valid_examples": 8},
        "optim": {"lr": 1e-2, "warmup_steps": 2},
        "train": {"out_dir": str(out), "steps": steps, "batch_size": 8, "log_every": 1, "eval_every": 2,
                  "eval_batches": 1, "save_every": 2, "keep_last": 5, "progress": False, "wandb": True,
                  "wandb_project": "cyb-tests"}}).validate()


def _records(path: Path) -> list:
    """The protobuf records of an offline run's ``.wandb`` file (W&B's log format: a 7-byte header,
    then 32 KiB blocks of records, each a crc32, a length, a type and the data)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    out, pos, block, part = [], 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0 and length == 0:  # zero padding to the end of a block
            pos += left - 7
            continue
        part += data[pos:pos + length]
        pos += length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(part)
            out.append(record)
            part = b""
    return out


def _offline_runs(out: Path) -> list[Path]:
    return sorted((out / "wandb").glob("offline-run-*"))


def _history(records) -> list[dict]:
    rows = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
    return rows


def _expected(row: dict) -> dict:
    """What a metrics.jsonl row becomes in W&B."""
    out = {"step": row["step"]}
    for k, v in row.items():
        if k in ("split", "time", "step") or v is None:
            continue
        if isinstance(v, list):
            out.update({f"{row['split']}/{k}/{i + 1}": x for i, x in enumerate(v)})
        else:
            out[f"{row['split']}/{k}"] = v
    return out


def test_offline_run_holds_every_metric_the_config_and_the_model_card(tmp_path):
    out = tmp_path / "run"
    train(_cfg(out))
    runs = _offline_runs(out)
    assert len(runs) == 1
    records = _records(next(runs[0].glob("run-*.wandb")))
    history = _history(records)
    rows = read_metrics(out)
    assert len(history) == len(rows) == 4 + 3  # train rows at 1-4, held-out rows at 0, 2 and 4
    for got, row in zip(history, rows):
        want = _expected(row)
        assert {k: got[k] for k in want} == pytest.approx(want, rel=1e-12), row
    assert {"train/mean_steps", "train/stop_dist/3", "valid/ppl"} <= {k for h in history for k in h}
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    config = {k: v.get("value", v) if isinstance(v, dict) else v for k, v in config.items()}
    assert config["method"]["name"] == "cyb" and config["train"]["steps"] == 4
    assert run.project == "cyb-tests" and run.display_name == "run"
    card = runs[0] / "files" / "model_card.md"
    assert card.read_text() == (out / "final" / "README.md").read_text()
    summary = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.summary.update})
    final = json.loads((out / "final_metrics.json").read_text())
    assert summary["final/ppl"] == pytest.approx(final["ppl"])
    assert json.loads((out / RUN_FILE).read_text())["id"] == run.run_id


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path):
    out = tmp_path / "run"
    train(_cfg(out, steps=2))
    train(_cfg(out, steps=4))  # resumes from the checkpoint at step 2
    runs = _offline_runs(out)
    assert len(runs) == 2
    ids = {next(r.run for r in _records(next(p.glob("run-*.wandb"))) if r.WhichOneof("record_type") == "run").run_id
           for p in runs}
    assert ids == {json.loads((out / RUN_FILE).read_text())["id"]}
    steps = [h["step"] for h in _history(_records(next(runs[1].glob("run-*.wandb")))) if "train/loss" in h]
    assert steps == [3, 4]


def test_without_the_package_or_a_login_the_error_is_one_line(tmp_path, monkeypatch, capsys):
    from cyb.cli import main

    cfg = tmp_path / "run.yaml"
    _cfg(tmp_path / "x").dump(cfg)
    monkeypatch.setitem(sys.modules, "wandb", None)
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert "train.wandb" in err and "pip install -e '.[wandb]'" in err and "\n" not in err
    monkeypatch.delitem(sys.modules, "wandb")
    import wandb
    from wandb.errors import UsageError

    def refused(**kwargs):  # what wandb.init raises online without a login
        raise UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", refused)
    assert main(["train", str(cfg), "--set", f"train.out_dir={tmp_path / 'y'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("cyb train: error: train.wandb: Weights & Biases could not start a run (No API key")
    assert "WANDB_MODE=offline" in err
