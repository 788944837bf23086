"""Synthetic tasks written as text for a pretrained model's tokenizer (cyb.data.synthetic.text_task):
the same examples as the character rows, the answer and end-of-sequence token scored, and a task
run of a pretrained model that cyb eval scores by exact match.  A tiny Llama with a byte-level BPE
the project trains stands in for the pretrained model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cyb.config import RunConfig
from cyb.data.synthetic import CharTokenizer, SyntheticDataset, make_task
from cyb.build import task_tokenizer
from cyb.data.synthetic.text_task import TextTaskDataset, is_char_tokenizer
from cyb.run_data import text_task_sets
from cyb.data.tokenizer import train_bpe_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

DOCS = [f"{a}+{b}={a + b} and {a}*{b}={a * b}." for a in range(40) for b in range(0, 40, 7)]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return train_bpe_tokenizer(DOCS, 320, tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, bpe):
    """A 'pretrained' model folder: a tiny random Llama saved with the BPE tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("pretrained")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(bpe), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=256, eos_token_id=bpe.eos_token_id,
                                         pad_token_id=bpe.pad_token_id, bos_token_id=bpe.bos_token_id))
    model.save_pretrained(folder)
    bpe.save_pretrained(folder)
    return folder


def test_text_rows_hold_the_character_examples(bpe):
    task = make_task("addition", digits=3)
    chars = SyntheticDataset(task, CharTokenizer(), 50, seed=3, split="test")
    text = TextTaskDataset(task, bpe, 50, seed=3, split="test")
    assert text.prompts == chars.prompts and text.answers == chars.answers
    assert text.ids.shape == (50, text.seq_len) and text.seq_len == int(text.lengths.max())
    for i in range(50):
        n = int(text.lengths[i])
        row = text.ids[i, :n].tolist()
        assert row[-1] == bpe.eos_token_id
        assert bpe.decode(row[:-1]) == text.prompts[i] + text.answers[i]
        scored = [t for t, m in zip(text.ids[i].tolist(), text.loss_mask[i].tolist()) if m]
        assert bpe.decode(scored[:-1]) == text.answers[i] and scored[-1] == bpe.eos_token_id
        assert text.ids[i, :int(text.answer_start[i])].tolist() == bpe(text.prompts[i])["input_ids"]
        assert text.attention_mask[i].sum() == n and not text.loss_mask[i, n:].any()
    train = TextTaskDataset(task, bpe, 200, seed=3, split="train")
    assert not set(train.prompts) & set(text.prompts)


def test_which_tokenizer_makes_text_rows(bpe, pretrained, tmp_path):
    char_hf = CharTokenizer().to_hf()
    assert is_char_tokenizer(None) and is_char_tokenizer(CharTokenizer()) and is_char_tokenizer(char_hf)
    char_hf.add_special_tokens({"additional_special_tokens": ["<pause_1>", "<dont_know>"]})
    assert is_char_tokenizer(char_hf) and not is_char_tokenizer(bpe)
    cfg = RunConfig.from_dict({"data": {"task": "addition", "task_kwargs": {"digits": 2}}})
    assert is_char_tokenizer(task_tokenizer(cfg))  # from scratch: characters
    cfg.model.name_or_path = str(pretrained)
    assert task_tokenizer(cfg).get_vocab() == bpe.get_vocab()
    (tmp_path / "config.json").write_text("{}")  # a model folder without a tokenizer: characters
    cfg.model.name_or_path = str(tmp_path)
    assert is_char_tokenizer(task_tokenizer(cfg))
    cfg.data.num_train_examples, cfg.data.num_valid_examples = 20, 10
    train, valid = text_task_sets(cfg, bpe)
    assert len(train) == 20 and len(valid) == 10 and isinstance(valid, TextTaskDataset)


def test_a_pretrained_model_trains_on_a_task_as_text_and_eval_scores_it(pretrained, tmp_path, capsys):
    from cyb.cli import main
    from cyb.train import train

    cfg = RunConfig.from_dict({
        "model": {"name_or_path": str(pretrained)},
        "method": {"name": "cyb", "num_steps": 2},
        "data": {"task": "addition", "task_kwargs": {"digits": 2}, "num_train_examples": 64,
                 "num_valid_examples": 16},
        "optim": {"lr": 1e-2, "warmup_steps": 1},
        "train": {"out_dir": str(tmp_path / "run"), "steps": 2, "batch_size": 8, "eval_every": 0, "eval_batches": 2,
                  "save_every": 0, "progress": False},
    }).validate()
    train(cfg)
    final = tmp_path / "run" / "final"
    saved = json.loads((final / "tokenizer_config.json").read_text())
    assert saved  # the pretrained tokenizer, with the pause tokens, was saved with the model
    assert main(["eval", str(tmp_path / "run"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "task: exact match" in out and "on 16 held-out examples" in out
    assert "generating" not in out  # the teacher-forced readout only, unless asked
    assert main(["eval", str(tmp_path / "run"), "--no-progress", "--generate", "4",
                 "--out", str(tmp_path / "generated")]) == 0
    out = capsys.readouterr().out
    assert "generating the first 4 answers in fixed mode: exact match" in out
    assert "generating the first 4 answers in adaptive mode" in out
    generated = json.loads((tmp_path / "generated" / "metrics.json").read_text())["task"]["generation"]
    assert generated["fixed"]["positions_per_token"] == 2.0 and generated["fixed"]["prompts"] == 4
    assert 1.0 <= generated["adaptive"]["positions_per_token"] <= 2.0
    assert main(["eval", str(tmp_path / "run"), "--no-progress", "--generate", "-1"]) != 0
    assert "--generate" in capsys.readouterr().err
    metrics = json.loads((tmp_path / "run" / "eval" / "metrics.json").read_text())
    task = metrics["task"]
    assert 0.0 <= task["exact_match"] <= 1.0 and task["num_examples"] == 16
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(final))
    _, valid = text_task_sets(cfg, tok)
    assert task["answer_tokens_scored"] == sum(len(tok(a, add_special_tokens=False)["input_ids"]) + 1
                                               for a in valid.answers)
    assert "synthetic task `addition`" in (final / "README.md").read_text()


def test_task_decoding_scores_a_private_run_three_ways(pretrained, tmp_path):
    """experiments/task_decoding.py: under private pauses, free-running adaptive generation
    answers exactly the examples the teacher-forced greedy readout gets right."""
    from cyb.train import train
    from experiments import task_decoding

    cfg = RunConfig.from_dict({
        "model": {"name_or_path": str(pretrained)},
        "method": {"name": "cyb", "num_steps": 2, "pause_visibility": "private"},
        "data": {"task": "addition", "task_kwargs": {"digits": 2}, "num_train_examples": 64,
                 "num_valid_examples": 12},
        "optim": {"lr": 1e-2, "warmup_steps": 1},
        "train": {"out_dir": str(tmp_path / "run"), "steps": 2, "batch_size": 8, "eval_every": 0,
                  "save_every": 0, "progress": False},
    }).validate()
    train(cfg)
    assert task_decoding.main([str(tmp_path / "run"), "--limit", "12"]) == 0
    scores = json.loads((tmp_path / "run" / "task.json").read_text())
    forced = scores["teacher_forced"]
    assert scores["num_examples"] == 12 and scores["pause_visibility"] == "private"
    assert scores["adaptive"]["exact_match"] == forced["exact_match"]
    assert scores["fixed"]["positions_per_token"] == 2.0
    assert 1.0 <= scores["adaptive"]["positions_per_token"] <= 2.0
    assert len(forced["per_position_steps"]) == 4  # three answer digits and the end of sequence


def test_the_held_out_split_alone_is_the_held_out_set_of_both(bpe):
    """Scoring draws only the held-out split (a reasoning-gym training split takes seconds): it
    must be the very rows that the train-and-held-out draw gives, for character and text rows."""
    from cyb.run_data import synthetic_sets, task_split

    cfg = RunConfig.from_dict({"model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2},
                               "data": {"task": "addition", "task_kwargs": {"digits": 2},
                                        "num_train_examples": 40, "num_valid_examples": 12}, "train": {"seed": 3}})
    for tokenizer in (None, bpe):
        train, valid = synthetic_sets(cfg, tokenizer)
        alone = task_split(cfg, tokenizer, "test")
        assert torch.equal(alone.ids, valid.ids) and torch.equal(alone.loss_mask, valid.loss_mask)
        assert not torch.equal(train.ids[:12, :alone.ids.shape[1]], alone.ids)
    with pytest.raises(ValueError, match="split must be"):
        task_split(cfg, bpe, "valid")
