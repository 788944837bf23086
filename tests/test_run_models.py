"""Run folders and checkpoints wherever a model goes; messages about what a folder holds; a model
and data that do not fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cyb.cli import main
from cyb.model import PauseModel
from cyb.train import Trainer
from test_train import _docs, _write_jsonl, tiny_cfg  # tests/ is on the path, as for gguf_tiny


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A cache of its own for every test (checkpoints' models are written there)."""
    monkeypatch.setenv("CYB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    from cyb.data.tokenizer import train_bpe_tokenizer

    root = tmp_path_factory.mktemp("text")
    train_bpe_tokenizer(_docs(120, 0), 300, root / "bpe")
    return {"source": str(_write_jsonl(root / "train.jsonl", _docs(120, 0))),
            "valid_source": str(_write_jsonl(root / "valid.jsonl", _docs(20, 1)))}


@pytest.fixture(scope="module")
def text_run(tmp_path_factory, text):
    """A from-scratch text run of 4 steps with checkpoints at 2 and 4 (its own BPE)."""
    out = tmp_path_factory.mktemp("text_run") / "run"
    cfg = tiny_cfg(out, text={**text, "bpe_vocab_size": 300},
                   train={"steps": 4, "save_every": 2, "keep_last": 5, "eval_every": 2})
    trainer = Trainer(cfg)
    trainer.run()
    return out, trainer


@pytest.fixture(scope="module")
def task_run(tmp_path_factory):
    """A character-vocabulary run on 2-digit addition, 2 steps."""
    out = tmp_path_factory.mktemp("task_run") / "run"
    Trainer(tiny_cfg(out, train={"steps": 2, "save_every": 1, "keep_last": 5})).run()
    return out


def _logits(model, ids):
    model.eval()
    with torch.no_grad():
        return model(ids, return_logits=True).logits


def _ids():
    return torch.randint(3, 200, (2, 6), generator=torch.Generator().manual_seed(0))


# ------------------------------------------------------------------ run folders and checkpoints


def test_a_checkpoint_loads_as_the_model_it_holds(text_run, cache, capsys):
    from cyb.run_models import CHECKPOINT_SOURCE, checkpoint_of, prepare

    run, trainer = text_run
    last = run / "ckpt-00000004"  # the same weights as final/
    with pytest.raises(ValueError, match="is not in the cache yet: cyb.run_models.checkpoint_model"):
        PauseModel.from_pretrained(last)  # the model layer reads the cache, never builds
    prepare(last)
    model = PauseModel.from_pretrained(last)
    torch.testing.assert_close(_logits(model, _ids()), _logits(trainer.model, _ids()), rtol=0, atol=0)
    err = capsys.readouterr().err
    assert "is checkpoint step 4 of run" in err and "writing the model it holds once" in err
    folder = next(p for p in (cache / "checkpoints").iterdir() if not p.name.startswith("."))
    info = checkpoint_of(folder)
    assert info["step"] == 4 and Path(info["run"]) == run.resolve() and (folder / CHECKPOINT_SOURCE).is_file()
    card = (folder / "README.md").read_text()
    assert "checkpoint step 4" in card
    assert json.loads((folder / "training_state.json").read_text())["step"] == 4
    prepare(run / "ckpt-00000002")
    earlier = PauseModel.from_pretrained(run / "ckpt-00000002")  # another step: other weights
    assert not torch.equal(_logits(earlier, _ids()), _logits(model, _ids()))
    again = PauseModel.from_pretrained(last)  # built once: later uses read the cache
    assert "its model is" in capsys.readouterr().err
    torch.testing.assert_close(_logits(again, _ids()), _logits(model, _ids()), rtol=0, atol=0)
    assert len([p for p in (cache / "checkpoints").iterdir() if not p.name.startswith(".")]) == 2
    assert not any(p.name.startswith("README") for p in last.iterdir())  # the checkpoint is only read


def test_cyb_eval_of_a_checkpoint_gives_the_perplexity_training_measured(text_run, tmp_path, capsys):
    from cyb.metrics_log import read_metrics

    run, _ = text_run
    assert main(["eval", str(run / "ckpt-00000002"), "--no-progress", "--device", "cpu"]) == 0
    out = run / "eval-ckpt-00000002"  # beside the checkpoint, not inside it
    metrics = json.loads((out / "metrics.json").read_text())
    at_2 = next(r for r in read_metrics(run, "valid") if r["step"] == 2)
    assert metrics["perplexity"]["loss"] == pytest.approx(at_2["loss"], abs=1e-5)
    assert metrics["target"]["name"].endswith("(checkpoint step 2)") and metrics["target"]["step"] == 2
    assert "(checkpoint step 2)" in capsys.readouterr().out


def test_a_run_folder_is_a_model_name_for_fine_tuning(text_run, tmp_path, text):
    """model.name_or_path = a run folder (its final/) or a checkpoint; the tokenizer comes with it."""
    run, trainer = text_run
    for name in (run, run / "ckpt-00000002"):
        cfg = tiny_cfg(tmp_path / f"again-{Path(name).name}", text=text,
                       model={"name_or_path": str(name)}, train={"steps": 1})
        again = Trainer(cfg)
        assert again.model.settings == trainer.model.settings
        assert len(again.tokenizer) == len(trainer.tokenizer)
        again.run()


def test_generate_takes_checkpoints_and_names_an_unfinished_runs_newest(text_run, tmp_path, capsys):
    from cyb.commands.generate import _check_model_dir

    run, _ = text_run
    folder = _check_model_dir(str(run / "ckpt-00000002"))
    assert (folder / "cyb_pause.json").is_file() and "checkpoints" in str(folder)
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    for name in ("config.yaml", "run.json"):
        (unfinished / name).write_text((run / name).read_text())
    (unfinished / "ckpt-00000007").mkdir()
    (unfinished / "ckpt-00000007" / "meta.json").write_text("{}")
    capsys.readouterr()
    assert main(["generate", str(unfinished), "--prompt", "a"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "training has not finished" in err and "ckpt-00000007" in err


def test_merge_takes_a_lora_runs_checkpoint(tmp_path):
    pytest.importorskip("peft")
    from cyb.model import lora

    first = tmp_path / "base"
    Trainer(tiny_cfg(first, "baseline", train={"steps": 1})).run()
    run = tmp_path / "lora"
    cfg = tiny_cfg(run, model={"name_or_path": str(first / "final")}, lora={"rank": 2},
                   train={"steps": 2, "save_every": 2})
    trainer = Trainer(cfg)
    trainer.run()
    ids = torch.randint(3, 20, (2, 5))
    assert main(["merge", str(run / "ckpt-00000002"), str(tmp_path / "merged")]) == 0  # writes its model first
    from_ckpt = PauseModel.from_pretrained(run / "ckpt-00000002")
    assert lora.is_lora(from_ckpt)
    torch.testing.assert_close(_logits(from_ckpt, ids), _logits(trainer.model, ids))
    merged = PauseModel.from_pretrained(tmp_path / "merged")
    assert not lora.is_lora(merged)
    torch.testing.assert_close(_logits(merged, ids), _logits(trainer.model, ids), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ what a folder holds, said in one line


def test_a_folder_without_a_tokenizer_is_named_not_called_damaged(text_run, tmp_path):
    from cyb.data.tokenizer import load_tokenizer

    run, _ = text_run
    assert len(load_tokenizer(run)) == len(load_tokenizer(run / "final"))  # a run folder: its model's
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no tokenizer") as e:
        load_tokenizer(tmp_path / "empty")
    assert "delete" not in str(e.value)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="restore it from a copy") as e:
        load_tokenizer(broken)
    assert "delete" not in str(e.value)


def test_a_character_vocabulary_model_given_text_fails_in_one_line(task_run, tmp_path, text, capsys):
    import yaml

    config = tmp_path / "text.yaml"
    prose = {"source": str(_write_jsonl(tmp_path / "prose.jsonl", [d.capitalize() + ' "Quoted!"' for d in _docs(40, 2)])),
             "valid_source": None}
    cfg = tiny_cfg(tmp_path / "ft", text=prose, model={"name_or_path": str(task_run)}).to_dict()
    cfg["data"].pop("tokenizer", None)
    config.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "model.name_or_path" in err and "character vocabulary" in err and "cannot encode" in err
    assert not (tmp_path / "ft").exists()


def test_a_tokenizer_of_another_model_is_named(task_run, text_run, tmp_path, text):
    run, _ = text_run
    cfg = tiny_cfg(tmp_path / "ft", text={**text, "tokenizer": str(run / "final")},
                   model={"name_or_path": str(task_run / "final")})
    with pytest.raises(ValueError, match="data.tokenizer .* does not fit model.name_or_path"):
        Trainer(cfg)


def _plain_folder(root: Path, tokenizer_from: Path) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = root / "plain"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, max_position_embeddings=1024)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(tokenizer_from)).save_pretrained(folder)
    return folder


def test_a_plain_model_is_said_to_run_without_pauses(text_run, tmp_path, capsys):
    from cyb.model.sources import plain_model_kwargs

    run, _ = text_run
    plain = _plain_folder(tmp_path, Path(run) / "tokenizer")
    assert plain_model_kwargs(plain) == {"num_steps": 1}
    from cyb.config import RunConfig

    args = ["eval", str(plain), "--no-progress", "--device", "cpu", "--tokens", "64", "--out", str(tmp_path / "ev"),
            "--data", RunConfig.load_run(run).data.valid_source]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "has no cyb_pause.json" in err and "plain model without pauses" in err


def test_a_pause_model_without_its_settings_is_refused(text_run, tmp_path, capsys):
    import shutil

    from cyb.model.sources import plain_model_kwargs

    run, _ = text_run
    copy = tmp_path / "copy"
    shutil.copytree(Path(run) / "final", copy)
    (copy / "cyb_pause.json").unlink()
    with pytest.raises(ValueError, match="restore cyb_pause.json"):
        plain_model_kwargs(copy)
    assert main(["generate", str(copy), "--prompt", "the"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "its pause settings are missing" in err
    (copy / "training_state.json").unlink()  # still its tokenizer's pause tokens
    with pytest.raises(ValueError, match="its tokenizer has <dont_know>, <pause_1>"):
        plain_model_kwargs(copy)


def test_an_empty_prompts_file_is_named(text_run, tmp_path, capsys):
    run, _ = text_run
    (tmp_path / "empty.txt").write_text("\n  \n")
    assert main(["generate", str(run), "--file", str(tmp_path / "empty.txt")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"cyb generate: error: --file {tmp_path / 'empty.txt'} holds no prompt: it is empty or has only blank lines"


def test_the_lm_eval_model_takes_a_run_folder_and_a_checkpoint(text_run):
    pytest.importorskip("lm_eval")
    from cyb.integrations.lm_eval import CybLM

    run, trainer = text_run
    for name in (run, run / "ckpt-00000004"):
        lm = CybLM(str(name), device="cpu", batch_size=2)
        torch.testing.assert_close(_logits(lm._model, _ids()), _logits(trainer.model, _ids()), rtol=0, atol=0)
