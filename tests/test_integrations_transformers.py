"""cyb inside transformers.Trainer and TRL's SFTTrainer: the same losses as cyb train on the same
batches (gradient accumulation, bf16 autocast), cyb model folders out, resume, LoRA, errors."""

from __future__ import annotations

import copy
import json
import os
import random
import sys

import pytest
import torch

pytest.importorskip("accelerate")

from cyb.config import ConfigError, RunConfig  # noqa: E402
from cyb.integrations.transformers import (PauseCollator, PauseTrainer, PauseTrainingModel,  # noqa: E402
                                           pad_examples, with_pauses)
from cyb.model import PauseModel  # noqa: E402
from cyb.train import Trainer as CybTrainer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = "the cat dog sat ran on under a big small red blue mat log tree house and then it was".split()
MODEL = {"arch": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "max_position_embeddings": 256}
# the optimiser both sides share: constant LR, AdamW as cyb train sets it, clipping
OPTIM = {"lr": 1e-2, "warmup_steps": 0, "min_lr_ratio": 1.0, "weight_decay": 0.1, "beta2": 0.95}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Nothing leaves the machine (TRL's telemetry, the hub)."""
    for name in ("HF_HUB_OFFLINE", "HF_HUB_DISABLE_TELEMETRY", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("WANDB_MODE", "disabled")


def _docs(n, seed):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))) for _ in range(n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    path = root / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in _docs(60, 0)))
    return path


def _cyb(out, *, method=None, precision="fp32", text=None, batch=8, micro=4):
    """A cyb train Trainer (the reference) on the addition task or on ``text``."""
    data = ({"task": "addition", "task_kwargs": {"digits": 2}, "num_train_examples": 64, "num_valid_examples": 8}
            if text is None else {"source": str(text), "valid_source": str(text), "bpe_vocab_size": 300,
                                  "block_len": 16})
    cfg = RunConfig.from_dict({
        "model": MODEL, "method": method or {"name": "cyb", "num_steps": 3}, "data": data, "optim": OPTIM,
        "train": {"out_dir": str(out), "steps": 10, "batch_size": batch, "micro_batch_size": micro,
                  "eval_every": 0, "save_every": 0, "progress": False, "precision": precision}}).validate()
    return CybTrainer(cfg)


def _steps(ct, n):
    """The micro-batches of ``n`` optimiser steps of a cyb trainer's data."""
    it = iter(ct.train_data)
    return [[{k: v for k, v in next(it).items() if k != "row"} for _ in range(ct.accum)] for _ in range(n)]


def _reference(ct, steps):
    """Per step: cyb train's mean objective per target token and E[S] (if any)."""
    out = []
    for micro in steps:
        sums = ct.accumulate(micro)
        ct.optimizer_step()
        n = sums["targets"]
        out.append((float(sums["objective"]) / n, float(sums["stop_step"]) / n if "stop_step" in sums else None))
    return out


def _examples(steps):
    """The rows of ``steps`` as Trainer examples (labels -100 where cyb's loss mask is 0)."""
    out = []
    for micro in steps:
        for b in micro:
            for r in range(b["ids"].shape[0]):
                ids = b["ids"][r].tolist()
                ex = {"input_ids": ids}
                if "loss_mask" in b:
                    ex["labels"] = [i if m else -100 for i, m in zip(ids, b["loss_mask"][r].tolist())]
                out.append(ex)
    return out


def _args(out, cls=None, **kw):
    from transformers import TrainingArguments

    cls = cls or TrainingArguments
    settings = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=3,
                    learning_rate=OPTIM["lr"], lr_scheduler_type="constant", weight_decay=OPTIM["weight_decay"],
                    adam_beta1=0.9, adam_beta2=OPTIM["beta2"], adam_epsilon=1e-8, max_grad_norm=1.0,
                    optim="adamw_torch", logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                    dataloader_num_workers=0, disable_tqdm=True, train_sampling_strategy="sequential")
    settings.update(kw)
    return cls(str(out), **settings)


def _logged(trainer, key="loss"):
    return [(h[key], h.get("mean_steps")) for h in trainer.state.log_history if key in h and "train_runtime" not in h]


def _same_parameters(a, b, tol):
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys()
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=tol, atol=tol, msg=k)


@pytest.mark.parametrize("precision,method", [
    ("fp32", {"name": "cyb", "num_steps": 3}),
    ("bf16", {"name": "cyb", "num_steps": 3, "pause_visibility": "private", "gamma0": 0.9}),
    ("fp32", {"name": "tbys_original", "num_steps": 3, "tbys_scheme": "append"}),
])
def test_trainer_gives_cyb_trains_losses_on_the_same_batches(tmp_path, precision, method):
    """Three optimiser steps of 2 micro-batches of 4 rows: the logged loss, E[S] and the weights
    after the last step are those of cyb train's own loop, in float32 and under bf16 autocast."""
    ct = _cyb(tmp_path / "cyb", method=method, precision=precision)
    model = with_pauses(copy.deepcopy(ct.model), method=ct.cfg.method)
    steps = _steps(ct, 3)
    expected = _reference(ct, steps)
    trainer = PauseTrainer(model=model, args=_args(tmp_path / "hf", bf16=precision == "bf16"),
                           train_dataset=_examples(steps))
    trainer.train()
    got = _logged(trainer)
    tol = 1e-5 if precision == "fp32" else 1e-4
    assert [g[0] for g in got] == pytest.approx([e[0] for e in expected], rel=tol, abs=tol)
    if expected[0][1] is not None:
        assert [g[1] for g in got] == pytest.approx([e[1] for e in expected], rel=tol, abs=tol)
    _same_parameters(model.pause_model, ct.model, 1e-4 if precision == "fp32" else 2e-3)


def test_sft_trainer_gives_cyb_trains_losses_with_accumulation_and_bf16(tmp_path, corpus):
    """TRL tokenises the text (and appends the end-of-sequence token); cyb train's loop on the same
    token rows gives the same per-step losses, under bf16 autocast with 2 micro-batches per step
    (and TRL's default gradient checkpointing); its evaluation reports E[S] per token."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import SFTConfig

    from cyb.integrations.transformers import PauseSFTTrainer

    ct = _cyb(tmp_path / "cyb", method={"name": "cyb", "num_steps": 2}, precision="bf16", text=corpus)
    model = with_pauses(copy.deepcopy(ct.model), ct.tokenizer, method=ct.cfg.method)
    texts = Dataset.from_list([{"text": d} for d in _docs(24, 1)])
    args = _args(tmp_path / "sft", SFTConfig, bf16=True, max_length=64, shuffle_dataset=False,
                 per_device_eval_batch_size=4)
    trainer = PauseSFTTrainer(model=model, args=args, train_dataset=texts, eval_dataset=texts.select(range(8)),
                              processing_class=ct.tokenizer)
    rows = [trainer.train_dataset[i] for i in range(24)]
    assert rows[0]["input_ids"][-1] == ct.tokenizer.eos_token_id
    trainer.train()
    steps = [[pad_examples(rows[s * 8 + k * 4: s * 8 + k * 4 + 4], pad_id=ct.tokenizer.pad_token_id)
              for k in range(2)] for s in range(3)]
    expected = _reference(ct, steps)
    got = _logged(trainer)
    assert [g[0] for g in got] == pytest.approx([e[0] for e in expected], rel=1e-4, abs=1e-4)
    assert [g[1] for g in got] == pytest.approx([e[1] for e in expected], rel=1e-4, abs=1e-4)
    metrics = trainer.evaluate()
    held_out = [trainer.eval_dataset[i] for i in range(8)]
    sums, targets = 0.0, 0  # the same rows through cyb's objective and the trained model
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for k in range(2):
            out = ct.objective(model.pause_model, pad_examples(held_out[k * 4:k * 4 + 4]))
            sums += float(out.sums["objective"])
            targets += out.num_targets
    assert metrics["eval_loss"] == pytest.approx(sums / targets, rel=1e-4)
    assert metrics["eval_targets"] == targets and 1.0 <= metrics["eval_mean_steps"] <= 2.0


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus):
    """A PauseTrainer run of 4 steps on text with checkpoints at 2 and 4, and its cyb reference."""
    root = tmp_path_factory.mktemp("trained")
    ct = _cyb(root / "cyb", text=corpus)
    init = copy.deepcopy(ct.model)
    steps = _steps(ct, 4)
    examples = _examples(steps)
    model = with_pauses(copy.deepcopy(init), ct.tokenizer, method=ct.cfg.method)
    trainer = PauseTrainer(model=model, args=_args(root / "hf", max_steps=4, save_strategy="steps", save_steps=2),
                           train_dataset=examples, processing_class=ct.tokenizer)
    trainer.train()
    trainer.save_model(str(root / "final"))
    return {"root": root, "ct": ct, "init": init, "examples": examples, "trainer": trainer}


def test_saved_model_is_a_cyb_folder_that_generate_and_eval_read(trained, tmp_path, corpus):
    from cyb.cli import main

    final = trained["root"] / "final"
    assert (final / "cyb_pause.json").is_file() and (final / "model.safetensors").is_file()
    card = (final / "README.md").read_text()
    assert "fine-tuned with CYB 2 pauses" in card and "4 optimiser steps of `PauseTrainer`" in card
    loaded = PauseModel.from_pretrained(final)
    model = trained["trainer"].model.pause_model.eval()
    ids = torch.tensor([[5, 9, 17, 3, 40]])
    torch.testing.assert_close(loaded(ids).log_t, model(ids).log_t)
    assert loaded.settings == model.settings
    assert main(["generate", str(final), "--prompt", "the cat", "--max-new-tokens", "4", "--device", "cpu",
                 "--json", str(tmp_path / "gen.json")]) == 0
    assert json.loads((tmp_path / "gen.json").read_text())
    assert main(["eval", str(final), "--data", str(corpus), "--tokens", "200", "--block-len", "16",
                 "--out", str(tmp_path / "ev"), "--no-progress", "--device", "cpu"]) == 0
    ppl = json.loads((tmp_path / "ev" / "metrics.json").read_text())["perplexity"]
    assert ppl["tokens"] > 0 and ppl["loss"] > 0


def test_resuming_a_checkpoint_reproduces_the_run(trained, tmp_path):
    """Trainer's resume_from_checkpoint reads the cyb folder of checkpoint-2 back: steps 3 and 4
    log the losses of the uninterrupted run."""
    t = trained
    ckpt = t["root"] / "hf" / "checkpoint-2"
    assert (ckpt / "cyb_pause.json").is_file()
    model = with_pauses(copy.deepcopy(t["init"]), t["ct"].tokenizer, method=t["ct"].cfg.method)
    again = PauseTrainer(model=model, args=_args(tmp_path / "again", max_steps=4),
                         train_dataset=t["examples"], processing_class=t["ct"].tokenizer)
    again.train(resume_from_checkpoint=str(ckpt))
    first = [loss for loss, _ in _logged(t["trainer"])]
    history = [loss for loss, _ in _logged(again)]  # steps 1-2 from the checkpoint's state, 3-4 trained again
    assert len(history) == 4 and history == pytest.approx(first, rel=1e-5)
    _same_parameters(again.model.pause_model, t["trainer"].model.pause_model, 1e-5)


def test_lora_from_a_peft_config_trains_adapters_and_pause_rows(tmp_path, trained):
    """A peft LoraConfig as Trainer users write it: only the adapters and the pause/dk rows change,
    and the saved LoRA folder loads back with the same outputs."""
    peft = pytest.importorskip("peft")
    base = tmp_path / "base"
    trained["init"].save_pretrained(base)
    model = with_pauses(str(base), method="cyb", num_steps=3,
                        lora=peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    before = {n: p.detach().clone() for n, p in model.pause_model.hf_model.named_parameters()}
    trainer = PauseTrainer(model=model, args=_args(tmp_path / "hf", max_steps=2, gradient_accumulation_steps=1),
                           train_dataset=trained["examples"][:8])
    trainer.train()
    changed = {n for n, p in model.pause_model.hf_model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n or "trainable_tokens" in n for n in changed)
    assert any("trainable_tokens" in n for n in changed)
    trainer.save_model(str(tmp_path / "final"))
    assert (tmp_path / "final" / "adapter_model.safetensors").is_file()
    loaded = PauseModel.from_pretrained(tmp_path / "final")
    ids = torch.tensor([[5, 9, 17, 3]])
    torch.testing.assert_close(loaded(ids).log_t, model.pause_model.eval()(ids).log_t)


def test_collator_reads_labels_and_trl_masks():
    batch = pad_examples([{"input_ids": [4, 5, 6], "labels": [-100, 5, 6]},
                          {"input_ids": [7, 8], "completion_mask": [0, 1]},
                          {"input_ids": [9]}], pad_id=1)
    assert batch["ids"].tolist() == [[4, 5, 6], [7, 8, 1], [9, 1, 1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0], [1, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [0, 1, 0], [1, 0, 0]]
    with pytest.raises(ValueError, match="example 0: labels must equal input_ids"):
        pad_examples([{"input_ids": [4, 5], "labels": [5, -100]}])
    with pytest.raises(ValueError, match="example 1 has no input_ids"):
        pad_examples([{"input_ids": [4]}, {"text": "hi"}])


def test_bad_input_is_named_in_one_line(trained):
    model = copy.deepcopy(trained["init"])
    with pytest.raises(ConfigError, match=r"method\.omega"):
        with_pauses(model, method="cyb", num_steps=3, omega=[1.0, -1.0, 1.0])
    with pytest.raises(ConfigError, match=r"method\.gamm: unknown field"):
        with_pauses(model, method="cyb", num_steps=3, gamm=0.9)
    with pytest.raises(ConfigError, match="gated"):
        with_pauses(model, method="cyb", num_steps=3, pause_visibility="gated")
    with pytest.raises(ConfigError, match=r"method\.pause_rows"):
        with_pauses(model, method="cyb", num_steps=3, pause_rows="frozen")
    with pytest.raises(TypeError, match="with_pauses"):
        PauseTrainer(model=model.hf_model, args=_args("unused"))
    tm = with_pauses(model, method=trained["ct"].cfg.method)
    assert isinstance(tm, PauseTrainingModel) and isinstance(PauseCollator(tm)([{"input_ids": [3, 4]}]), dict)


def test_without_trl_the_sft_trainer_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)
    monkeypatch.delitem(sys.modules, "cyb.integrations.transformers.trl", raising=False)
    from cyb.extras import MissingPackage

    with pytest.raises(MissingPackage, match=r"needs the trl package.*pip install -e '\.\[trl\]'") as e:
        from cyb.integrations.transformers import PauseSFTTrainer  # noqa: F401
    assert "\n" not in str(e.value)
    assert os.environ.get("HF_HUB_OFFLINE") == "1"


def test_two_processes_under_torchrun_give_one_process_losses(tmp_path):
    """DDP through the Trainer (accelerate, gloo): 2 processes x 2 rows x 2 micro-batches per step
    log the losses and E[S] of 1 process x 4 rows x 2, rows of different lengths included: the
    loss is normalised by the target tokens of the whole step on every process."""
    import subprocess

    import hf_trainer_run

    hf_trainer_run.main(str(tmp_path / "one"))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           hf_trainer_run.__file__, str(tmp_path / "two")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    one, two = (json.loads((tmp_path / name / "log_history.json").read_text()) for name in ("one", "two"))
    rows = [(a, b) for a, b in zip(one, two) if "loss" in a]
    assert len(rows) == 3 and len({a["targets"] for a, _ in rows}) > 1
    for a, b in rows:
        assert b["targets"] == a["targets"]
        for key in ("loss", "mean_steps", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-5), key
