"""The training loop: every method learns, accumulation is exact, schedule, outputs, errors."""

from __future__ import annotations

import copy
import json
import math
import random

import pytest
import torch

from cyb.config import RunConfig
from cyb.metrics_log import read_metrics
from cyb.optim import lr_factor, peak_lr
from cyb.train import Trainer

WORDS = ("the cat dog sat ran on under a big small red blue mat log tree house and then "
         "it was very quick slow happy").split()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run fastest on one thread (and do not fight over a busy machine's cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _write_jsonl(path, docs):
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def _docs(n, seed):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) + "." for _ in range(n)]


@pytest.fixture(scope="module")
def text_data(tmp_path_factory):
    """A tiny corpus (train/valid JSON lines) and a BPE of 300 ids trained on it once."""
    from cyb.data.tokenizer import train_bpe_tokenizer

    root = tmp_path_factory.mktemp("text")
    train = _write_jsonl(root / "train.jsonl", _docs(120, 0))
    valid = _write_jsonl(root / "valid.jsonl", _docs(20, 1))
    train_bpe_tokenizer(_docs(120, 0), 300, root / "bpe")
    return {"source": str(train), "valid_source": str(valid), "tokenizer": str(root / "bpe")}


def tiny_cfg(out_dir, name="cyb", *, text=None, **sections) -> RunConfig:
    """A model small enough to train for a few steps in well under a second."""
    data = ({"task": "addition", "task_kwargs": {"digits": 2}, "num_train_examples": 256,
             "num_valid_examples": 16} if text is None else {**text, "block_len": 16})
    cfg = {
        "model": {"arch": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 2,
                  "max_position_embeddings": 256},
        "method": {"name": name, "num_steps": 3},
        "data": data,
        "optim": {"lr": 1e-2, "warmup_steps": 2},
        "train": {"out_dir": str(out_dir), "steps": 12, "batch_size": 8, "log_every": 1,
                  "eval_every": 0, "save_every": 0, "eval_batches": 1, "progress": False},
    }
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    return RunConfig.from_dict(cfg).validate()


METHODS = [
    ("baseline", {}),
    ("tbys", {}),
    ("tbys_original", {}),
    ("cyb", {}),
    ("cyb_va", {"rho": [1.0, 1.0, 2.0]}),
    ("cyb_dp", {"rho": [0.0, 1.0, 1.0], "alpha": 0.1}),
    ("cyb", {"recipe": 2, "omega": [1.0, 1.0, 1.0]}),
    ("cyb_anytime", {"aux_weight": 0.2}),
    ("cyb_decoupled", {}),
    ("cyb_ponder", {"ponder_cost": -0.02}),
]
#: private pauses with every layout: Recipe 1, Recipe 2 and inserted pauses
PRIVATE = [
    ("cyb", {"pause_visibility": "private"}),
    ("cyb", {"pause_visibility": "private", "recipe": 2, "omega": [1.0, 1.0, 1.0]}),
    ("tbys_original", {"pause_visibility": "private"}),
    ("cyb_decoupled", {"pause_visibility": "private"}),
    ("cyb", {"pause_visibility": "gated"}),
    ("tbys", {"pause_visibility": "gated", "recipe": 2, "omega": [1.0, 1.0, 1.0]}),
]


def _learns(cfg):
    trainer = Trainer(cfg)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    final = trainer.run()
    rows = read_metrics(cfg.train.out_dir, "train")
    losses = [r["objective"] for r in rows]
    assert len(losses) == cfg.train.steps and all(math.isfinite(x) for x in losses)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.1, losses
    unchanged = [n for n, p in trainer.model.named_parameters() if torch.equal(p.detach(), before[n])]
    assert not unchanged, f"parameters that did not move: {unchanged}"
    assert math.isfinite(final["loss"]) and final["step"] == cfg.train.steps
    return trainer, rows


@pytest.mark.parametrize("method,extra", METHODS, ids=[m + ("-recipe2" if e.get("recipe") else "") for m, e in METHODS])
def test_every_method_learns_synthetic(tmp_path, method, extra):
    _, rows = _learns(tiny_cfg(tmp_path / "run", method=dict(name=method, **extra)))
    if method.startswith("cyb"):
        assert 1.0 <= rows[-1]["mean_steps"] <= 3.0 and abs(sum(rows[-1]["stop_dist"]) - 1) < 1e-4


@pytest.mark.parametrize("method,extra", PRIVATE, ids=["private", "private-recipe2", "private-inserted", "private-decoupled",
                                                     "gated", "gated-recipe2"])
def test_non_shared_pauses_learn_synthetic(tmp_path, method, extra):
    """Non-shared pauses train end to end (with gradient checkpointing on the Recipe 2 runs) and
    their model folder keeps the visibility (gated ones: the gates moved, at their own
    learning rate, and read back)."""
    cfg = tiny_cfg(tmp_path / "run", method=dict(name=method, **extra))
    cfg.model.gradient_checkpointing = extra.get("recipe") == 2
    trainer, _ = _learns(cfg)
    saved = json.loads((tmp_path / "run" / "final" / "cyb_pause.json").read_text())
    assert saved["pause_visibility"] == extra["pause_visibility"]
    if extra["pause_visibility"] == "gated":
        from cyb.model import PauseModel, gates

        assert [g["lr"] for g in trainer.optimizer.param_groups][-1] < cfg.method.pause_gate_lr  # (decayed)
        trained = gates.gate_values(trainer.model.hf_model)
        assert not torch.equal(trained, torch.full_like(trained, gates.GATE_INIT))
        loaded = PauseModel.from_pretrained(tmp_path / "run" / "final")
        assert torch.equal(gates.gate_values(loaded.hf_model), trained)


@pytest.mark.parametrize("method,extra", METHODS + [("baseline_nx", {"seq_multiplier": 2})],
                         ids=[m + ("-recipe2" if e.get("recipe") else "") for m, e in METHODS] + ["baseline_nx"])
def test_every_method_learns_text(tmp_path, text_data, method, extra):
    cfg = tiny_cfg(tmp_path / "run", text=text_data, method=dict(name=method, **extra))
    trainer, _ = _learns(cfg)
    if method == "baseline_nx":  # compute-matched: a context seq_multiplier times longer
        assert next(iter(trainer.train_data))["ids"].shape[1] == 2 * cfg.data.block_len
        # ... but scored on the same held-out rows as every other method
        assert trainer.valid_batches[0]["ids"].shape[1] == cfg.data.block_len


# ------------------------------------------------------------------ gradient accumulation


def _padded_batch(vocab_size: int, rows: int = 8, length: int = 12, seed: int = 0) -> dict:
    """Rows of different lengths (right padding) and a loss mask on a suffix: token counts
    differ between micro-batches."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size, (rows, length), generator=g)
    lengths = torch.tensor([12, 3, 7, 12, 5, 9, 2, 11])[:rows]
    pos = torch.arange(length)
    attention = (pos < lengths[:, None]).long()
    loss_mask = (pos >= (lengths[:, None] // 3)) & attention.bool()
    return {"ids": ids * attention, "attention_mask": attention, "loss_mask": loss_mask,
            "row": torch.arange(rows)}


def _micro(batch, size):
    n = batch["ids"].shape[0]
    return [{k: v[s:s + size] for k, v in batch.items()} for s in range(0, n, size)]


@pytest.mark.parametrize("method", [{"name": "cyb"}, {"name": "tbys_original"},
                                    {"name": "cyb", "recipe": 2, "omega": [1.0, 2.0, 1.0]}],
                         ids=["cyb", "tbys_original", "cyb-recipe2"])
def test_accumulation_matches_one_big_batch(tmp_path, method):
    trainers = {}
    for micro in (2, 8):
        cfg = tiny_cfg(tmp_path / f"m{micro}", method=dict(method),
                       train={"micro_batch_size": micro}, optim={"grad_clip": 0.0, "lr": 1e-3})
        trainers[micro] = Trainer(cfg)
    small, big = trainers[2], trainers[8]
    assert small.accum == 4 and big.accum == 1
    batch = _padded_batch(len(small.tokenizer) - 3)
    counts = [int(small.objective.prepare(_micro(batch, 2)[i], seeds=[0, 1]).num_targets) for i in range(4)]
    assert len(set(counts)) > 1, "micro-batches should hold different numbers of target tokens"

    # reference: the mean loss over all target tokens of the step, straight from the objective
    ref = copy.deepcopy(big.model)
    plain = {k: v for k, v in batch.items() if k != "row"}
    prep = big.objective.prepare(plain, seeds=big._seeds(list(range(8)), 0))
    out = big.objective.loss(ref, prep)
    (out.loss_sum / out.num_targets).backward()

    small.accumulate(_micro(batch, 2))
    big.accumulate(_micro(batch, 8))
    for (name, p_small), p_big, p_ref in zip(small.model.named_parameters(), big.model.parameters(), ref.parameters()):
        torch.testing.assert_close(p_small.grad, p_big.grad, rtol=1e-5, atol=1e-7, msg=name)
        torch.testing.assert_close(p_big.grad, p_ref.grad, rtol=1e-5, atol=1e-7, msg=name)
    small.optimizer_step()
    big.optimizer_step()
    for p_small, p_big in zip(small.model.parameters(), big.model.parameters()):
        assert (p_small - p_big).abs().max() < 1e-6


# ------------------------------------------------------------------------- LR schedule


def test_lr_schedule_warmup_then_cosine_to_min():
    warmup, total, ratio = 10, 110, 0.01
    f = [lr_factor(s, warmup=warmup, total=total, min_ratio=ratio) for s in range(total + 1)]
    assert f[:warmup] == pytest.approx([(s + 1) / warmup for s in range(warmup)])
    assert f[warmup] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[warmup:], f[warmup + 1:]))
    assert f[warmup + 50] == pytest.approx(ratio + (1 - ratio) * 0.5)  # half-way: cos = 0
    assert f[total] == pytest.approx(ratio)
    assert lr_factor(10_000, warmup=warmup, total=total, min_ratio=ratio) == pytest.approx(ratio)
    assert lr_factor(0, warmup=0, total=5, min_ratio=0.5) == pytest.approx(1.0)


def test_peak_lr_is_alpha_over_sqrt_d_model_when_lr_unset(tmp_path):
    cfg = tiny_cfg(tmp_path / "run", optim={"lr": None, "lr_alpha": 2e-3, "warmup_steps": 2,
                                              "min_lr_ratio": 0.1}, train={"steps": 6})
    assert peak_lr(cfg, 64) == pytest.approx(2e-3 / 8)
    Trainer(cfg).run()
    lrs = [r["lr"] for r in read_metrics(cfg.train.out_dir, "train")]
    peak = 2e-3 / math.sqrt(32)
    # the logged lr is the one of the next step: warmup 2/2, then cosine over 4 steps
    expected = [peak * lr_factor(s, warmup=2, total=6, min_ratio=0.1) for s in range(1, 7)]
    assert lrs == pytest.approx(expected)
    assert lrs[-1] == pytest.approx(0.1 * peak)


# ------------------------------------------------------------------------- outputs


def test_final_model_round_trip(tmp_path):
    from transformers import AutoModelForCausalLM

    from cyb.model import PauseModel

    cfg = tiny_cfg(tmp_path / "run", train={"steps": 3})
    stale = tmp_path / "run" / "final.tmp-999999"  # what a save killed half-way leaves
    stale.mkdir(parents=True)
    (stale / ".tmpBiIj37").write_bytes(b"0" * 1000)
    trainer = Trainer(cfg)
    trainer.run()
    final = tmp_path / "run" / "final"
    assert not stale.exists()
    ids = torch.randint(3, 40, (2, 7))
    reloaded = PauseModel.from_pretrained(final)
    trainer.model.eval()
    with torch.no_grad():
        a = trainer.model(ids, return_logits=True).logits
        b = reloaded(ids, return_logits=True).logits
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert reloaded.settings == trainer.model.settings

    plain = AutoModelForCausalLM.from_pretrained(final)
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, trainer.model.hf_model(ids).logits, rtol=0, atol=0)
    for name in ("run.json", "config.yaml", "metrics.jsonl", "final_metrics.json"):
        assert (tmp_path / "run" / name).is_file(), name
    assert RunConfig.load(tmp_path / "run" / "config.yaml").to_dict() == cfg.to_dict()


@pytest.mark.parametrize("how", ["full", "lora", "tokenizer", "other_method"])
def test_a_saved_synthetic_task_model_is_fine_tuned(tmp_path, how):
    """A model trained on a synthetic task (character tokenizer plus its pause and dk tokens)
    fine-tunes on a task: fully, with LoRA, with data.tokenizer naming it, with another method."""
    from cyb.model import PauseModel

    first = tiny_cfg(tmp_path / "first", train={"steps": 2})
    Trainer(first).run()
    final = str(tmp_path / "first" / "final")
    sections = {"model": {"name_or_path": final}, "train": {"steps": 2}}
    name = "tbys" if how == "other_method" else "cyb"
    if how == "lora":
        pytest.importorskip("peft")
        sections["lora"] = {"rank": 2}
    if how == "tokenizer":
        sections["data"] = {"tokenizer": final}
    cfg = tiny_cfg(tmp_path / "again", name, **sections)
    trainer = Trainer(cfg)
    start = PauseModel.from_pretrained(final)
    if how != "other_method":  # it starts from the saved weights
        assert trainer.model.settings == start.settings
        for a, b in zip(trainer.model.hf_model.get_input_embeddings().weight, start.hf_model.get_input_embeddings().weight):
            torch.testing.assert_close(a, b)
    trainer.run()
    assert PauseModel.from_pretrained(tmp_path / "again" / "final").num_steps == 3


def test_logged_rows_average_the_window_and_report_throughput(tmp_path, capsys):
    cfg = tiny_cfg(tmp_path / "run", train={"steps": 4, "log_every": 2, "eval_every": 2, "progress": True})
    Trainer(cfg).run()
    train_rows = read_metrics(cfg.train.out_dir, "train")
    valid_rows = read_metrics(cfg.train.out_dir, "valid")
    assert [r["step"] for r in train_rows] == [2, 4] and [r["step"] for r in valid_rows] == [0, 2, 4]
    one = tiny_cfg(tmp_path / "one", train={"steps": 4, "log_every": 1})
    Trainer(one).run()
    singles = read_metrics(one.train.out_dir, "train")
    # the window's mean is weighted by target tokens
    t0, t1 = singles[0]["targets"], singles[1]["targets"]
    assert train_rows[0]["targets"] == t0 + t1
    assert train_rows[0]["loss"] == pytest.approx((singles[0]["loss"] * t0 + singles[1]["loss"] * t1) / (t0 + t1))
    assert all(r["tokens_per_s"] > 0 for r in train_rows)
    err = capsys.readouterr().err
    assert "step 4/4" in err and "tok/s" in err and "E[S]" in err and "eta" in err


def test_progress_false_hides_the_steps_but_not_the_header(tmp_path, capsys):
    cfg = tiny_cfg(tmp_path / "run", train={"steps": 4, "log_every": 2, "eval_every": 2, "progress": False})
    Trainer(cfg).run()
    err = capsys.readouterr().err
    assert "cyb train: cyb (M=3), " in err and f"out_dir {tmp_path / 'run'}" in err
    assert "step 4: held-out loss" in err and "step 4/4" not in err and "eta" not in err

def test_a_checkpoint_between_logged_steps_trains_on_and_resumes(tmp_path):
    """A checkpoint taken between two logged steps carries the window of unlogged sums (as
    lists); training on from it, and resuming from it, add the next steps' tensors to them."""
    import shutil

    cfg = tiny_cfg(tmp_path / "run", train={"steps": 6, "log_every": 4, "save_every": 3, "keep_last": 5})
    Trainer(cfg).run()
    first = read_metrics(cfg.train.out_dir, "train")
    assert [r["step"] for r in first] == [4, 6]
    run = tmp_path / "run"
    shutil.rmtree(run / "ckpt-00000006")
    shutil.rmtree(run / "final")
    trainer = Trainer(cfg)
    assert trainer.step == 3 and isinstance(trainer.window["stop_dist"], list)
    trainer.run()
    again = read_metrics(cfg.train.out_dir, "train")
    assert [r["step"] for r in again] == [4, 6]
    assert again[0]["loss"] == pytest.approx(first[0]["loss"], rel=1e-5)


# ------------------------------------------------------------------------- clear errors


def test_resume_refuses_another_runs_checkpoints(tmp_path):
    Trainer(tiny_cfg(tmp_path / "run", train={"steps": 2})).run()
    with pytest.raises(ValueError, match=r"method\.name was 'cyb', now 'tbys'"):
        Trainer(tiny_cfg(tmp_path / "run", "tbys", train={"steps": 2}))
    with pytest.raises(ValueError, match="train.resume"):
        Trainer(tiny_cfg(tmp_path / "run", train={"steps": 2, "resume": False}))


def test_text_without_blocks_is_a_clear_error(tmp_path, text_data):
    short = _write_jsonl(tmp_path / "short.jsonl", ["two words"])
    cfg = tiny_cfg(tmp_path / "run", text={**text_data, "source": str(short)})
    with pytest.raises(ValueError, match=r"data\.source .* yields no block .*data\.block_len"):
        Trainer(cfg)
    empty = _write_jsonl(tmp_path / "empty.jsonl", [])
    cfg = tiny_cfg(tmp_path / "run2", text={**text_data, "source": str(empty), "tokenizer": None})
    with pytest.raises(ValueError, match=r"data\.source"):
        Trainer(cfg)
    cfg = tiny_cfg(tmp_path / "run3", text={**text_data, "valid_source": str(short)})
    with pytest.raises(ValueError, match=r"data\.valid_source"):
        Trainer(cfg)


def test_positions_beyond_the_model_limit_are_a_clear_error(tmp_path):
    cfg = tiny_cfg(tmp_path / "run", model={"max_position_embeddings": 8})
    with pytest.raises(ValueError, match="max_position_embeddings"):
        Trainer(cfg)


SPEED_OPTIONS = [
    ({"train": {"loss_impl": "fused"}}, {"name": "cyb"}),
    ({"train": {"loss_impl": "fused"}}, {"name": "cyb", "recipe": 2, "omega": [1.0, 1.0, 1.0]}),
    ({"train": {"loss_impl": "fused"}}, {"name": "tbys_original"}),
    ({"model": {"gradient_checkpointing": True}}, {"name": "cyb"}),
]


@pytest.mark.parametrize("option,method", SPEED_OPTIONS,
                         ids=["fused-cyb", "fused-recipe2", "fused-tbys_original", "gradient-checkpointing"])
def test_speed_options_do_not_change_the_update(tmp_path, monkeypatch, option, method):
    import cyb.kernels

    calls = []
    for name in ("fused_linear_loss", "fused_readout"):
        real = getattr(cyb.kernels, name)
        monkeypatch.setattr(cyb.kernels, name, lambda *a, _real=real, **k: calls.append(1) or _real(*a, **k))
    base = Trainer(tiny_cfg(tmp_path / "base", method=dict(method), train={"loss_impl": "naive"}))
    assert not calls
    other_cfg = tiny_cfg(tmp_path / "other", method=dict(method), **{k: dict(v) for k, v in option.items()})
    other = Trainer(other_cfg)
    batch = _padded_batch(len(base.tokenizer) - 3)
    a, b = base.accumulate([batch]), other.accumulate([batch])
    assert bool(calls) == (other_cfg.train.loss_impl == "fused")
    assert float(a["objective"]) == pytest.approx(float(b["objective"]), rel=1e-5)
    for (name, p), q in zip(base.model.named_parameters(), other.model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


# ------------------------------------------------------------------ data order and epochs


def _marker_corpus(root, n=120):
    """Documents that are each one marker word repeated: a row's words name its documents."""
    from cyb.data.tokenizer import train_bpe_tokenizer

    docs = [" ".join([f"m{i:03d}"] * 30) for i in range(n)]
    root.mkdir(parents=True, exist_ok=True)
    train_bpe_tokenizer(docs, 400, root / "bpe")
    return {"source": str(_write_jsonl(root / "train.jsonl", docs)),
            "valid_source": str(_write_jsonl(root / "valid.jsonl", docs[:4])), "tokenizer": str(root / "bpe")}


def _first_batch_documents(trainer) -> set[str]:
    import re

    ids = next(iter(trainer.train_data))["ids"]
    return {w for row in ids.tolist() for w in re.findall(r"m\d{3}", trainer.tokenizer.decode(row))}


def test_training_shuffles_the_whole_corpus_by_default(tmp_path):
    """The first batch mixes documents from all over the corpus (corpus order gave a few)."""
    data = _marker_corpus(tmp_path / "data")
    cfg = tiny_cfg(tmp_path / "run", text=data, train={"batch_size": 16})
    assert cfg.data.shuffle == "auto"
    shuffled = _first_batch_documents(Trainer(cfg))
    in_order = _first_batch_documents(Trainer(tiny_cfg(tmp_path / "ordered", text=data, train={"batch_size": 16},
                                                       data={"shuffle": "none"})))
    assert len(in_order) <= 10
    assert len(shuffled) >= 12 and max(int(w[1:]) for w in shuffled) >= 60


def test_epochs_are_logged_and_passing_one_is_said(tmp_path, capsys):
    data = _marker_corpus(tmp_path / "data", n=16)  # about 60 blocks of 16: 8 steps of 8 per epoch
    cfg = tiny_cfg(tmp_path / "run", text=data, train={"steps": 12, "progress": True, "log_every": 4})
    trainer = Trainer(cfg)
    trainer.run()
    err = capsys.readouterr().err
    assert "data.shuffle = corpus" in err
    assert "completes epoch 1 of the training data" in err
    rows = read_metrics(cfg.train.out_dir, "train")
    epochs = [r["epoch"] for r in rows]
    assert epochs == sorted(epochs) and epochs[0] > 0 and 1.0 < epochs[-1] < 2.0
    state = json.loads((tmp_path / "run" / "final" / "training_state.json").read_text())
    assert state["epochs"] == pytest.approx(epochs[-1]) and state["step"] == 12
    assert state["real_tokens_seen"] == 12 * 8 * 16


def test_corpus_order_is_only_used_when_asked_for_and_warned(tmp_path, capsys):
    data = _marker_corpus(tmp_path / "data", n=30)
    cfg = tiny_cfg(tmp_path / "run", text=data, data={"shuffle": "none"}, train={"steps": 2, "progress": True})
    Trainer(cfg).run()
    assert "warning: data.shuffle = none" in capsys.readouterr().err


def test_a_run_that_cannot_start_leaves_no_folder(tmp_path):
    data = {"source": str(tmp_path / "missing.jsonl"), "valid_source": str(tmp_path / "missing.jsonl")}
    cfg = tiny_cfg(tmp_path / "run", text={**data, "tokenizer": None})
    with pytest.raises((ValueError, FileNotFoundError)):
        Trainer(cfg)
    assert not (tmp_path / "run").exists()


def test_frozen_pause_rows_keep_their_values_while_the_rest_trains(tmp_path):
    """method.pause_rows = frozen (an ablation): after training the pause rows are bitwise the
    ones the run started with, in the saved model too, while the other rows and the dk row moved."""
    from cyb.model import PauseModel
    from cyb.train import shutdown

    cfg = tiny_cfg(tmp_path / "run", method={"pause_rows": "frozen", "pause_visibility": "private"})
    trainer = Trainer(cfg)
    start = trainer.model.hf_model.get_input_embeddings().weight.detach().clone()
    try:
        trainer.run()
    finally:
        shutdown(trainer.info)
    saved = PauseModel.from_pretrained(tmp_path / "run" / "final")
    after = saved.hf_model.get_input_embeddings().weight.detach()
    pauses, dk = list(saved.settings.pause_ids), saved.settings.dk_id
    assert torch.equal(after[pauses], start[pauses])
    assert not torch.equal(after[dk], start[dk])
    real = [i for i in range(start.shape[0]) if i not in pauses and i != dk]
    assert not torch.equal(after[real], start[real])


@pytest.mark.parametrize("fields,says", [({"name": "baseline"}, "needs a method with pauses"),
                                         ({"pause_rows": "fixed"}, "must be one of train, frozen")])
def test_frozen_pause_rows_are_checked(tmp_path, fields, says):
    from cyb.config import ConfigError

    method = {"pause_rows": "frozen", **fields}
    with pytest.raises(ConfigError, match=says):
        tiny_cfg(tmp_path / "run", method=method).validate()


def test_frozen_pause_rows_refuse_lora_and_fsdp():
    from types import SimpleNamespace

    from cyb.config import MethodConfig
    from cyb.model.pause_rows import check_settings

    method = MethodConfig(pause_rows="frozen")
    with pytest.raises(ValueError, match="lora.rank = 0"):
        check_settings(method, SimpleNamespace(rank=8), SimpleNamespace(distributed="none"))
    with pytest.raises(ValueError, match="FSDP"):
        check_settings(method, SimpleNamespace(rank=0), SimpleNamespace(distributed="fsdp"))
    check_settings(method, SimpleNamespace(rank=0), SimpleNamespace(distributed="ddp"))
