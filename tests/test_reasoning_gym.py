"""reasoning-gym tasks as training data and as a scorer (cyb.data.reasoning_gym,
cyb.eval.reasoning_scores): the rows of a split (seeded, disjoint, the loss on the completion),
one-line errors for an unknown task, a setting the generator does not take and a missing
package, and a run on a task that cyb eval scores with the task's own verifier.  A tiny Llama
with a byte-level BPE trained on the task's text stands in for the pretrained model."""

from __future__ import annotations

import json
import sys

import pytest
import torch

pytest.importorskip("reasoning_gym")

from cyb.config import ConfigError, RunConfig  # noqa: E402
from cyb.data import reasoning_gym as R  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TASK = "reasoning-gym:chain_sum"
SETTINGS = {"max_terms": 3, "max_digits": 2}


def tiny_pretrained(folder, docs: list[str]):
    """A 'pretrained' model folder: a tiny random Llama saved with a BPE trained on ``docs``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from cyb.data.tokenizer import train_bpe_tokenizer

    tok = train_bpe_tokenizer(docs, 320, folder / "tokenizer")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=512, eos_token_id=tok.eos_token_id,
                                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id))
    model.save_pretrained(folder / "model")
    tok.save_pretrained(folder / "model")
    return folder / "model", tok


def task_docs(n: int = 300) -> list[str]:
    return [R.prompt_of(e) + R.completion_of(e) for e in R.draw_entries(TASK, SETTINGS, n, 0, "train")]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    return tiny_pretrained(tmp_path_factory.mktemp("rgym"), task_docs())


def run_config(model, out_dir, **method) -> RunConfig:
    return RunConfig.from_dict({
        "model": {"name_or_path": str(model)},
        "method": {"name": "cyb", "num_steps": 2, "pause_visibility": "private", **method},
        "data": {"task": TASK, "task_kwargs": dict(SETTINGS), "num_train_examples": 64, "num_valid_examples": 12},
        "optim": {"lr": 1e-2, "warmup_steps": 1},
        "train": {"out_dir": str(out_dir), "steps": 3, "batch_size": 8, "eval_every": 0, "eval_batches": 2,
                  "save_every": 0, "progress": False},
    }).validate()


def test_splits_are_seeded_disjoint_and_prefixes(pretrained):
    _, tok = pretrained
    train = R.ReasoningGymDataset(TASK, tok, 200, seed=3, split="train", settings=SETTINGS)
    test = R.ReasoningGymDataset(TASK, tok, 50, seed=4, split="test", settings=SETTINGS)
    again = R.ReasoningGymDataset(TASK, tok, 20, seed=4, split="test", settings=SETTINGS)
    assert again.prompts == test.prompts[:20] and again.answers == test.answers[:20]
    assert not {e["question"] for e in train.entries} & {e["question"] for e in test.entries}
    other = R.ReasoningGymDataset(TASK, tok, 50, seed=5, split="test", settings=SETTINGS)
    assert other.prompts != test.prompts  # another run seed, other questions
    for i in range(50):  # prompt, then the answer and end-of-sequence: the loss on the completion only
        e, n = test.entries[i], int(test.lengths[i])
        assert test.prompts[i] == e["question"] + "\nAnswer:" and test.answers[i] == " " + e["answer"]
        assert test.prompt_ids(i) == tok(test.prompts[i])["input_ids"]
        scored = [t for t, m in zip(test.ids[i].tolist(), test.loss_mask[i].tolist()) if m]
        assert scored[-1] == tok.eos_token_id and tok.decode(scored[:-1]).strip() == e["answer"]
        assert test.ids[i, n - 1] == tok.eos_token_id and not test.loss_mask[i, n:].any()
        assert test.score(i, e["answer"]) == 1.0
    assert test.score(0, "no idea") == 0.0


def test_one_line_errors():
    with pytest.raises(ValueError, match=r"unknown reasoning-gym task 'chain_sums'; did you mean "
                                         r"reasoning-gym:chain_sum"):
        R.check_task("reasoning-gym:chain_sums")
    with pytest.raises(ValueError, match=r"takes settings min_terms, max_terms.*got unknown digits"):
        R.check_task(TASK, {"digits": 3})
    with pytest.raises(ValueError, match="seed cannot be set"):
        R.check_task(TASK, {"seed": 3})
    with pytest.raises(ValueError, match="refuses the settings .*max_terms must be >= min_terms"):
        R.check_task(TASK, {"min_terms": 4, "max_terms": 2})
    base = {"model": {"name_or_path": "some/model"}, "data": {"task": "reasoning-gym:leg_countin"}}
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict(base).validate()
    assert str(e.value).count("\n") == 0 and "reasoning-gym:leg_counting" in str(e.value)
    RunConfig.from_dict({"data": {"task": TASK}}).validate()  # from scratch: a BPE of its own questions


def test_a_missing_package_is_one_line(monkeypatch, tmp_path, capsys):
    from cyb.cli import main

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # as if not installed
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict({"model": {"name_or_path": "x"}, "data": {"task": TASK}}).validate()
    assert str(e.value).count("\n") == 0
    assert "needs the reasoning_gym package" in str(e.value) and ".[reasoning]" in str(e.value)
    (tmp_path / "c.yaml").write_text(f"model: {{name_or_path: x}}\ndata: {{task: '{TASK}'}}\n")
    assert main(["train", str(tmp_path / "c.yaml"), "--check"]) != 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and ".[reasoning]" in err


def test_a_character_vocabulary_cannot_write_the_questions(pretrained):
    from cyb.data.synthetic import CharTokenizer
    from cyb.run_data import synthetic_sets

    model, _ = pretrained
    cfg = run_config(model, "/tmp/unused")
    with pytest.raises(ValueError, match="needs a pretrained model's tokenizer"):
        synthetic_sets(cfg, CharTokenizer().to_hf())


def test_a_run_on_a_task_is_scored_by_its_verifier(pretrained, tmp_path, capsys):
    """The CPU smoke test of the extra: a few steps of training, then cyb eval generates the
    held-out answers and scores them with the task's own score_answer."""
    from cyb.cli import main
    from cyb.train import train

    model, _ = pretrained
    train(run_config(model, tmp_path / "run"))
    assert main(["eval", str(tmp_path / "run"), "--no-progress", "--passages", "0"]) == 0
    out = capsys.readouterr().out
    assert "reasoning-gym:chain_sum: mean score" in out and "on 12 held-out questions (adaptive decoding" in out
    metrics = json.loads((tmp_path / "run" / "eval" / "metrics.json").read_text())
    judged = metrics["reasoning_gym"]
    assert judged["num_examples"] == 12 and judged["mode"] == "adaptive" and "rows" not in judged
    assert 1.0 <= judged["mean_steps"] <= 2.0 and judged["seconds"] > 0
    assert metrics["files"]["reasoning_gym"] == "reasoning_gym.jsonl"
    rows = [json.loads(x) for x in (tmp_path / "run" / "eval" / "reasoning_gym.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(12))
    entries = R.draw_entries(TASK, SETTINGS, 12, 1, "test")  # the held-out set: seed train.seed + 1
    for row, entry in zip(rows, entries):
        assert row["question"] == entry["question"] and row["answer"] == entry["answer"]
        assert row["score"] == R.score_answer(TASK, SETTINGS, row["generated"], entry)
        assert row["exact"] == (row["score"] == 1.0) and len(row["steps"]) == row["tokens"]
    assert judged["mean_score"] == pytest.approx(sum(r["score"] for r in rows) / 12)
    from cyb.generation import generate
    from cyb.model import PauseModel
    from cyb.run_data import synthetic_sets

    model = PauseModel.from_pretrained(tmp_path / "run" / "final")  # the answers are generate()'s
    _, valid = synthetic_sets(RunConfig.load_run(tmp_path / "run"), model.tokenizer)
    want = generate(model, [valid.prompt_ids(i) for i in range(12)], mode="adaptive",
                    max_new_tokens=judged["max_new_tokens"])
    assert [r["generated"] for r in rows] == [w.text.strip() for w in want]
    assert [r["steps"] for r in rows] == [w.steps for w in want]
    assert metrics["task"]["num_examples"] == 12  # the teacher-forced readout too
    assert main(["eval", str(tmp_path / "run"), "--no-progress", "--passages", "0", "--answer-mode", "fixed",
                 "--out", str(tmp_path / "fixed")]) == 0
    fixed = json.loads((tmp_path / "fixed" / "metrics.json").read_text())["reasoning_gym"]
    assert fixed["mode"] == "fixed" and fixed["positions_per_token"] == 2.0
    assert "fixed decoding" in capsys.readouterr().out
    # the ablations: every answer token read out at step 1 (no pause), or at step M (every pause)
    for step in (1, 2):
        assert main(["eval", str(tmp_path / "run"), "--no-progress", "--passages", "0", "--read-at", str(step),
                     "--out", str(tmp_path / f"read-at-{step}")]) == 0
        forced = json.loads((tmp_path / f"read-at-{step}" / "metrics.json").read_text())["reasoning_gym"]
        assert forced["read_at"] == step and forced["mean_steps"] == step
        assert f"read out at step {step}" in capsys.readouterr().out


def test_the_small_config_trains_from_scratch_with_a_bpe_of_the_tasks_own_questions(tmp_path, capsys):
    """configs/cpu-reasoning.yaml (here 6 steps): no pretrained model, no data.tokenizer: the run
    trains a BPE on its training questions, saves it with the model, and cyb eval scores it."""
    from pathlib import Path

    from cyb.cli import main
    from cyb.data.tokenizer import load_tokenizer

    config = Path(__file__).resolve().parent.parent / "configs" / "cpu-reasoning.yaml"
    out = tmp_path / "run"
    assert main(["train", str(config), "--set", f"train.out_dir={out}", "--set", "train.steps=6",
                 "--set", "train.eval_every=6", "--set", "data.num_train_examples=64",
                 "--set", "data.num_valid_examples=8", "--set", "data.bpe_train_docs=64"]) == 0
    tok = load_tokenizer(out / "tokenizer")
    assert len(tok) == 320 and "Answer" in tok.decode(tok("Answer: 5")["input_ids"])
    assert len(load_tokenizer(out / "final")) == len(tok) + 2  # with the pause and dk tokens
    assert main(["eval", str(out), "--no-progress", "--passages", "0"]) == 0
    assert "reasoning-gym:chain_sum: mean score" in capsys.readouterr().out


def test_read_at_is_for_reasoning_runs_only(tmp_path):
    from cyb.eval import evaluate
    from cyb.train import train

    cfg = RunConfig.from_dict({"model": {"arch": "llama", "hidden_size": 32, "num_layers": 1, "num_heads": 2},
                               "method": {"name": "cyb", "num_steps": 2},
                               "data": {"task": "addition", "task_kwargs": {"digits": 2}, "num_train_examples": 32,
                                        "num_valid_examples": 4},
                               "train": {"out_dir": str(tmp_path / "run"), "steps": 1, "batch_size": 4,
                                         "eval_every": 0, "save_every": 0, "progress": False}}).validate()
    train(cfg)
    with pytest.raises(ValueError, match="reasoning-gym task run"):
        evaluate(tmp_path / "run", answer_read_at=1, progress=False, num_passages=0)
    with pytest.raises(ValueError, match="step >= 1"):
        evaluate(tmp_path / "run", answer_read_at=0, progress=False, num_passages=0)
