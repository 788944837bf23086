"""Paths that travel: a run made in one folder is evaluated, generated from and fine-tuned
from another; what a run or model folder writes down is absolute, or relative to that folder."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import yaml

from cyb import paths
from cyb.cli import main
from cyb.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--set", "model.hidden_size=32", "--set", "model.num_layers=1", "--set", "model.num_heads=2",
        "--set", "train.steps=2", "--set", "train.batch_size=4", "--set", "train.eval_every=0",
        "--set", "train.save_every=0", "--set", "train.eval_batches=1", "--set", "train.progress=false",
        "--set", "optim.warmup_steps=1", "--set", "data.block_len=16", "--set", "data.bpe_vocab_size=300",
        "--set", "data.bpe_train_docs=40"]


@pytest.fixture(scope="module")
def made_here(tmp_path_factory):
    """A text run and a LoRA run on it, trained in ``work/`` with relative paths throughout."""
    root = tmp_path_factory.mktemp("paths")
    work = root / "work"
    work.mkdir()
    words = "the quick brown fox jumps over a lazy dog and then runs far away".split()
    with open(work / "texts.jsonl", "w") as f:
        for i in range(60):
            f.write(json.dumps({"text": " ".join(words[(i + k) % len(words)] for k in range(40))}) + "\n")
    (work / "run.yaml").write_text(yaml.safe_dump({"model": {"arch": "llama"}, "method": {"name": "cyb", "num_steps": 2}}))
    before = os.getcwd()
    os.chdir(work)
    try:
        assert main(["train", "run.yaml", *TINY, "--set", "data.source=texts.jsonl",
                     "--set", "data.valid_source=null", "--set", "data.valid_fraction=0.2",
                     "--set", "train.out_dir=runs/base"]) == 0
        lora = None
        try:
            import peft  # noqa: F401

            assert main(["train", "run.yaml", *TINY, "--set", "data.source=texts.jsonl",
                         "--set", "data.valid_source=null", "--set", "data.valid_fraction=0.2",
                         "--set", "model.name_or_path=runs/base/final", "--set", "lora.rank=2",
                         "--set", "train.out_dir=runs/lora"]) == 0
            lora = work / "runs" / "lora"
        except ImportError:
            pass
    finally:
        os.chdir(before)
    return {"root": root, "work": work, "base": work / "runs" / "base", "lora": lora}


def test_a_run_folder_writes_its_paths_absolute(made_here):
    work = made_here["work"]
    saved = yaml.safe_load((made_here["base"] / "config.yaml").read_text())
    assert saved["data"]["source"] == str(work / "texts.jsonl")
    assert saved["train"]["out_dir"] == str(work / "runs" / "base")
    assert saved["data"]["valid_source"] is None and saved["model"]["name_or_path"] is None
    run = json.loads((made_here["base"] / "run.json").read_text())
    assert run["config"]["data"]["source"] == str(work / "texts.jsonl")


def test_eval_and_generate_from_another_folder(made_here, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    base = made_here["base"]
    assert main(["eval", str(base), "--no-progress", "--passages", "1", "--passage-tokens", "8"]) == 0
    assert main(["generate", str(base), "--prompt", "the", "--max-new-tokens", "3"]) == 0
    capsys.readouterr()


def test_a_lora_folder_names_its_base_absolute_and_loads_from_anywhere(made_here, tmp_path, monkeypatch, capsys):
    if made_here["lora"] is None:
        pytest.skip("needs peft")
    final, base = made_here["lora"] / "final", str(made_here["base"] / "final")
    assert json.loads((final / "cyb_lora.json").read_text())["base_model"] == base
    assert json.loads((final / "adapter_config.json").read_text())["base_model_name_or_path"] == base
    saved = yaml.safe_load((made_here["lora"] / "config.yaml").read_text())
    assert saved["model"]["name_or_path"] == base
    monkeypatch.chdir(tmp_path)
    assert main(["generate", str(made_here["lora"]), "--prompt", "the", "--max-new-tokens", "2"]) == 0
    # a base written relative to the LoRA folder (a tree moved by hand) is read relative to it
    moved = tmp_path / "moved"
    shutil.copytree(made_here["work"] / "runs", moved / "runs")
    lora_file = moved / "runs" / "lora" / "final" / "cyb_lora.json"
    info = json.loads(lora_file.read_text())
    lora_file.write_text(json.dumps({**info, "base_model": "../../base/final"}))
    assert main(["generate", str(moved / "runs" / "lora"), "--prompt", "the", "--max-new-tokens", "2"]) == 0
    capsys.readouterr()


def test_a_run_config_reads_relative_paths_against_its_folder(made_here, tmp_path, monkeypatch):
    run = tmp_path / "copied"
    shutil.copytree(made_here["base"], run)
    shutil.copy(made_here["work"] / "texts.jsonl", run / "texts.jsonl")
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved["data"]["source"] = "texts.jsonl"
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    monkeypatch.chdir(tmp_path)
    assert RunConfig.load_run(run).data.source == str(run / "texts.jsonl")
    assert main(["eval", str(run), "--no-progress", "--passages", "1", "--passage-tokens", "8"]) == 0


def test_the_recovery_command_for_a_damaged_final_works_from_anywhere(made_here, tmp_path, monkeypatch):
    from cyb.model.loading import model_advice

    monkeypatch.chdir(made_here["work"])
    advice = model_advice("runs/base/final")
    run = made_here["base"]
    assert f"`cyb train {run / 'config.yaml'} --set train.out_dir={run}`" in advice


def test_local_turns_only_local_things_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text("{}\n")
    assert paths.local("data/a.jsonl") == str(tmp_path / "data" / "a.jsonl")
    assert paths.local("data/*.jsonl") == str(tmp_path / "data" / "*.jsonl")
    assert paths.local("./data") == str(tmp_path / "data")
    for kept in ("HuggingFaceTB/SmolLM2-135M", "gpt2", "hf:allenai/c4:en@train", "builtin:python-docs@train",
                 "data/none-*.jsonl", "missing.jsonl"):
        assert paths.local(kept) == kept
    assert paths.in_folder("a.jsonl", tmp_path / "data") == str(tmp_path / "data" / "a.jsonl")
    assert paths.in_folder("b.jsonl", tmp_path / "data") == "b.jsonl"
    assert paths.looks_like_path("runs/x/final") and paths.looks_like_path("./x") and not paths.looks_like_path("org/name")
