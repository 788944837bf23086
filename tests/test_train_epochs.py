"""Training on a share of the text (data.fraction) for a number of passes (train.epochs)."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from cyb.metrics_log import read_metrics
from cyb.train import Trainer
from test_train import _marker_corpus, tiny_cfg

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def markers(tmp_path_factory):
    return _marker_corpus(tmp_path_factory.mktemp("markers"), n=40)  # about 150 blocks of 16


def _documents(trainer, ids) -> set[str]:
    return {w for row in ids.tolist() for w in re.findall(r"m\d{3}", trainer.tokenizer.decode(row))}


def _pass_rows(trainer) -> int:
    return trainer.train_data.source.blocks.epoch_blocks


def test_epochs_set_the_steps_of_that_many_passes_and_the_schedule_ends_with_them(tmp_path, markers):
    cfg = tiny_cfg(tmp_path / "run", text=markers, train={"epochs": 2.0, "steps": 5})
    trainer = Trainer(cfg)
    rows = _pass_rows(trainer)
    assert rows and trainer.cfg.train.steps == 2 * rows // 8 != 5
    counted = Trainer(tiny_cfg(tmp_path / "counted", text=markers, train={"epochs": 2.0}))
    plain = Trainer(tiny_cfg(tmp_path / "plain", text=markers))  # counting the pass draws nothing away
    assert torch.equal(next(iter(counted.train_data))["ids"], next(iter(plain.train_data))["ids"])
    trainer.run()
    logged = read_metrics(tmp_path / "run", "train")
    assert logged[-1]["step"] == trainer.cfg.train.steps and 2 - 8 / rows < logged[-1]["epoch"] <= 2
    assert logged[-1]["lr"] == pytest.approx(cfg.optim.lr * cfg.optim.min_lr_ratio, rel=0.2)


def test_a_share_trains_on_its_documents_only_and_keeps_the_held_out_rows(tmp_path, markers):
    whole = Trainer(tiny_cfg(tmp_path / "whole", text=markers, train={"epochs": 1.0}))
    third = Trainer(tiny_cfg(tmp_path / "third", text=markers, data={"fraction": 1 / 3}, train={"epochs": 1.0}))
    choice = third.train_data.source.texts_factory.choice
    assert 0.3 < choice.share < 0.37 and len(choice.kept) < 40
    kept = {f"m{i:03d}" for i in choice.kept}
    seen = set()
    for batch, _ in zip(third.train_data, range(third.cfg.train.steps)):
        seen |= _documents(third, batch["ids"])
    assert seen <= kept and len(seen) >= len(kept) - 1
    assert abs(third.cfg.train.steps * 3 - whole.cfg.train.steps) <= 3  # a pass over a third
    assert all(torch.equal(a["ids"], b["ids"]) for a, b in zip(whole.valid_batches, third.valid_batches))
    third.run()
    state = json.loads((tmp_path / "third" / "final" / "training_state.json").read_text())
    assert state["data_fraction"]["share"] == pytest.approx(choice.share)
    assert state["data_fraction"]["documents"] == len(choice.kept) and state["data_fraction"]["of"] == 40


def test_a_run_of_epochs_resumes_to_the_same_end(tmp_path, markers):
    """Counted again on resume from the checkpoint's position, the steps and the losses are the
    uninterrupted run's."""
    train = {"epochs": 1.5, "save_every": 4, "keep_last": 10}
    cfg = tiny_cfg(tmp_path / "run", text=markers, data={"fraction": 0.5, "fraction_seed": 3}, train=train)
    trainer = Trainer(cfg)
    steps = trainer.cfg.train.steps
    trainer.run()
    full = [r["loss"] for r in read_metrics(tmp_path / "run", "train")]
    for ckpt in sorted((tmp_path / "run").glob("ckpt-*"))[1:]:
        shutil.rmtree(ckpt)
    shutil.rmtree(tmp_path / "run" / "final")
    again = Trainer(tiny_cfg(tmp_path / "run", text=markers, data={"fraction": 0.5, "fraction_seed": 3}, train=train))
    assert again.step == 4 and again.cfg.train.steps == steps
    again.run()
    resumed = [r["loss"] for r in read_metrics(tmp_path / "run", "train")]
    assert resumed == pytest.approx(full, rel=1e-5)


def test_epochs_of_a_task_count_its_rows(tmp_path):
    cfg = tiny_cfg(tmp_path / "run", train={"epochs": 0.5})  # 256 addition rows, batches of 8
    assert Trainer(cfg).cfg.train.steps == 16


def test_epochs_over_text_in_corpus_order_are_counted(tmp_path, markers):
    cfg = tiny_cfg(tmp_path / "run", text=markers, data={"shuffle": "none"}, train={"epochs": 1.0})
    shuffled = Trainer(tiny_cfg(tmp_path / "shuffled", text=markers, train={"epochs": 1.0}))
    assert Trainer(cfg).cfg.train.steps == shuffled.cfg.train.steps
