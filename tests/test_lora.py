"""LoRA fine-tuning: only the adapters and the pause/dk rows train; save, load, merge and resume
round-trip; DDP/FSDP2 agree with one process; configuration errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("peft")

from cyb.build import build_tokenizer, hf_config_for  # noqa: E402
from cyb.checkpoint import FAULT_ENV, list_checkpoints  # noqa: E402
from cyb.config import ConfigError, LoraConfig, RunConfig  # noqa: E402
from cyb.distributed import DistInfo  # noqa: E402
from cyb.metrics_log import read_metrics  # noqa: E402
from cyb.model import PauseModel, lora  # noqa: E402
from cyb.train import Trainer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = {"arch": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "max_position_embeddings": 256}


def _cfg(out_dir, base=None, *, method=None, lora_cfg=None, train=None, model=None) -> RunConfig:
    cfg = {
        "model": {**MODEL, "name_or_path": None if base is None else str(base), **(model or {})},
        "method": method or {"name": "cyb", "num_steps": 3},
        "lora": {"rank": 4, **(lora_cfg or {})},
        "data": {"task": "addition", "task_kwargs": {"digits": 2}, "num_train_examples": 128,
                 "num_valid_examples": 16},
        "optim": {"lr": 2e-2, "warmup_steps": 1},
        "train": {"out_dir": str(out_dir), "steps": 6, "batch_size": 8, "log_every": 1, "eval_every": 0,
                  "save_every": 0, "eval_batches": 1, "progress": False, **(train or {})},
    }
    return RunConfig.from_dict(cfg).validate()


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """Pretrained stand-ins: tiny random Llamas (tied and untied) saved as plain HF folders."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("bases")
    out = {}
    for tied in (True, False):
        cfg = RunConfig.from_dict({"model": {**MODEL, "tie_embeddings": tied},
                                   "data": {"task": "addition"}}).validate()
        tok = build_tokenizer(cfg, root, DistInfo())
        torch.manual_seed(1)
        hf = AutoModelForCausalLM.from_config(hf_config_for(cfg, len(tok), tok))
        name = "tied" if tied else "untied"
        hf.save_pretrained(root / name)
        out[name] = root / name
    return out


def _ids(rows=2, length=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 12, (rows, length), generator=g)


@torch.no_grad()
def _logits(model, ids):
    model.eval()
    return model(ids, return_logits=True).logits


def _effective_rows(model):
    hf = model.hf_model
    return hf.get_input_embeddings().weight.detach().clone(), hf.get_output_embeddings().weight.detach().clone()


CASES = [
    ("tied", {"name": "cyb", "num_steps": 3}, "naive"),
    ("tied", {"name": "cyb", "num_steps": 3, "pause_visibility": "private"}, "naive"),
    ("untied", {"name": "cyb", "num_steps": 3}, "fused"),
    ("untied", {"name": "tbys", "num_steps": 3}, "naive"),
    ("tied", {"name": "cyb", "num_steps": 3, "recipe": 2, "omega": [1.0, 1.0, 1.0]}, "fused"),
]


@pytest.mark.parametrize("base,method,impl", CASES, ids=["cyb-tied-naive", "cyb-private-tied", "cyb-untied-fused", "tbys-untied",
                                                          "cyb-recipe2-tied-fused"])
def test_only_adapters_and_pause_rows_train(tmp_path, bases, base, method, impl):
    trainer = Trainer(_cfg(tmp_path / "run", bases[base], method=method, train={"loss_impl": impl}))
    model = trainer.model
    hf = model.hf_model
    frozen = {n: p.detach().clone() for n, p in hf.named_parameters() if not p.requires_grad}
    trainable = {n: p.detach().clone() for n, p in hf.named_parameters() if p.requires_grad}
    assert frozen and all("lora_" in n or "trainable_tokens_delta" in n for n in trainable)
    emb0, out0 = _effective_rows(model)
    optimised = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert optimised == {id(p) for p in hf.parameters() if p.requires_grad}

    trainer.run()
    for n, p in hf.named_parameters():
        if n in frozen:
            assert torch.equal(p.detach(), frozen[n]), f"frozen {n} changed"
    moved = [n for n, p in hf.named_parameters() if n in trainable and not torch.equal(p.detach(), trainable[n])]
    assert any("lora_A" in n for n in moved) and any("lora_B" in n for n in moved)
    ids = lora.trainable_token_ids(model.settings)
    assert ids == sorted(set(model.settings.pause_ids) | ({model.settings.dk_id} - {None}))
    emb1, out1 = _effective_rows(model)
    rest = torch.ones(emb0.shape[0], dtype=torch.bool)
    rest[ids] = False
    assert torch.equal(emb1[rest], emb0[rest]) and torch.equal(out1[rest], out0[rest])
    pause = list(model.settings.pause_ids)
    assert not torch.equal(emb1[pause], emb0[pause])  # pauses are inputs
    if model.settings.dk_id is not None:  # dk is an output: its output row learns
        assert not torch.equal(out1[model.settings.dk_id], out0[model.settings.dk_id])
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["lora"] and 0 < info["trainable_parameters"] < info["num_parameters"] / 4
    if method.get("pause_visibility") == "private":  # the adapter folder loads back private
        loaded = PauseModel.from_pretrained(tmp_path / "run" / "final")
        assert loaded.pause_visibility == "private"
        ids = _ids()
        torch.testing.assert_close(_logits(loaded, ids), _logits(model, ids))


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, bases):
    """An untied LoRA run of 6 steps with checkpoints at 3 and 6."""
    root = tmp_path_factory.mktemp("lora_run")
    cfg = _cfg(root / "run", bases["untied"], train={"save_every": 3, "keep_last": 10, "eval_every": 3})
    trainer = Trainer(cfg)
    trainer.run()
    return cfg, trainer


def test_final_folder_holds_the_adapter_and_loads_back(lora_run):
    cfg, trainer = lora_run
    final = Path(cfg.train.out_dir) / "final"
    names = {p.name for p in final.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", lora.LORA_FILE, "cyb_pause.json"} <= names
    assert "model.safetensors" not in names and "config.json" not in names
    ids = _ids()
    expected = _logits(trainer.model, ids)
    loaded = PauseModel.from_pretrained(final)
    assert lora.is_lora(loaded) and loaded.settings == trainer.model.settings
    assert torch.equal(_logits(loaded, ids), expected)
    # as lm-eval loads it (num_steps given), and as cyb generate finds it in the run folder
    again = PauseModel.from_pretrained(final, num_steps=3)
    assert torch.equal(_logits(again, ids), expected)
    from cyb.commands.generate import _check_model_dir

    assert _check_model_dir(cfg.train.out_dir) == final


def test_cyb_eval_and_lm_eval_load_the_lora_run(lora_run, tmp_path):
    from cyb.cli import main

    cfg, trainer = lora_run
    run = Path(cfg.train.out_dir)
    assert main(["eval", str(run), "--out", str(tmp_path / "ev"), "--no-progress", "--device", "cpu"]) == 0
    ppl = json.loads((tmp_path / "ev" / "metrics.json").read_text())["perplexity"]
    trained = json.loads((run / "final_metrics.json").read_text())
    assert ppl["tokens"] == trained["targets"]
    assert ppl["loss"] == pytest.approx(trained["loss"], abs=1e-5)
    lm_eval = pytest.importorskip("cyb.integrations.lm_eval")
    pytest.importorskip("lm_eval")
    lm = lm_eval.CybLM(str(run / "final"), device="cpu", batch_size=2)
    assert lora.is_lora(lm._model)
    assert torch.equal(_logits(lm._model, _ids()), _logits(trainer.model, _ids()))


def test_merge_gives_a_plain_model_with_the_same_logits(lora_run, tmp_path, monkeypatch, capsys):
    from cyb.cli import main

    cfg, trainer = lora_run
    ids = _ids(seed=3)
    expected = _logits(trainer.model, ids)
    merged = lora.merge_lora(PauseModel.from_pretrained(Path(cfg.train.out_dir) / "final"))
    assert not lora.is_lora(merged)
    torch.testing.assert_close(_logits(merged, ids), expected, atol=1e-5, rtol=1e-5)

    assert main(["merge", cfg.train.out_dir, str(tmp_path / "merged")]) == 0
    out = tmp_path / "merged"
    assert {"config.json", "model.safetensors", "cyb_pause.json"} <= {p.name for p in out.iterdir()}
    assert not (out / lora.LORA_FILE).exists() and not (out / "adapter_config.json").exists()
    card = (out / "README.md").read_text()  # the run's card, re-titled, with what merging did
    assert "(merged)" in card and "Written by `cyb merge`" in card and "folded into the weights" in card
    assert "holds LoRA adapters" not in card
    assert "holds LoRA adapters" in (Path(cfg.train.out_dir) / "final" / "README.md").read_text()
    monkeypatch.setitem(sys.modules, "peft", None)  # loads without peft
    plain = PauseModel.from_pretrained(out)
    torch.testing.assert_close(_logits(plain, ids), expected, atol=1e-5, rtol=1e-5)
    assert main(["merge", str(out), str(tmp_path / "again")]) == 2
    assert "not a LoRA folder" in capsys.readouterr().err


def test_checkpoints_hold_the_trainable_tensors_only(lora_run):
    from safetensors import safe_open

    cfg, trainer = lora_run
    ckpt = list_checkpoints(cfg.train.out_dir)[-1]
    with safe_open(str(ckpt.path / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert keys == set(lora.trainable_names(trainer.model))


def test_resume_equals_the_uninterrupted_run(lora_run, tmp_path):
    cfg, trainer = lora_run
    src, dst = Path(cfg.train.out_dir), tmp_path / "resumed"
    shutil.copytree(src, dst)
    for ckpt in list_checkpoints(dst):
        if ckpt.step > 3:
            shutil.rmtree(ckpt.path)
    shutil.rmtree(dst / "final")
    resumed_cfg = RunConfig.from_dict({**cfg.to_dict(), "train": {**cfg.to_dict()["train"], "out_dir": str(dst)}})
    resumed = Trainer(resumed_cfg.validate())
    assert resumed.step == 3
    resumed.run()
    rows = {(r["split"], r["step"]): r for r in read_metrics(dst)}
    expected = {(r["split"], r["step"]): r for r in read_metrics(src)}
    assert rows.keys() == expected.keys()
    for key, row in rows.items():
        assert row["loss"] == expected[key]["loss"], key
    want = lora.trainable_state(trainer.model)
    got = lora.trainable_state(resumed.model)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_a_full_checkpoint_is_not_resumed_as_lora(lora_run, tmp_path):
    cfg, _ = lora_run
    dst = tmp_path / "run"
    shutil.copytree(cfg.train.out_dir, dst)
    d = cfg.to_dict()
    d["lora"]["rank"] = 0
    d["train"]["out_dir"] = str(dst)
    with pytest.raises(ValueError, match="lora.rank was 4, now 0"):
        Trainer(RunConfig.from_dict(d).validate())


def test_apply_lora_keeps_what_the_model_computes():
    from transformers import AutoConfig

    torch.manual_seed(0)
    for arch, tied in (("gemma", False), ("llama", True)):
        hf_cfg = AutoConfig.for_model(arch, vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, head_dim=8,
                                      tie_word_embeddings=tied)
        model = PauseModel.from_config(hf_cfg, num_steps=3, new_rows="random")
        ids = _ids()
        before = _logits(model, ids)
        lora.apply_lora(model, LoraConfig(rank=2))
        torch.testing.assert_close(_logits(model, ids), before, atol=1e-6, rtol=1e-6)
        trainable, total = lora.parameter_counts(model)
        assert 0 < trainable < total
        with pytest.raises(ValueError, match="already has LoRA adapters"):
            lora.apply_lora(model, LoraConfig(rank=2))
    bf16 = PauseModel.from_config(hf_cfg, num_steps=3, torch_dtype=torch.bfloat16)
    lora.apply_lora(bf16, LoraConfig(rank=2))
    kinds = {(p.requires_grad, p.dtype) for p in bf16.hf_model.parameters()}
    assert kinds == {(False, torch.bfloat16), (True, torch.float32)}
    assert bf16(_ids(), return_logits=True).logits.dtype == torch.bfloat16


def test_unknown_target_modules_are_named(tmp_path, bases):
    cfg = _cfg(tmp_path / "run", bases["tied"], lora_cfg={"target_modules": ["c_attn"]})
    with pytest.raises(ValueError, match=r"lora.target_modules \['c_attn'\].*q_proj"):
        Trainer(cfg)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("field,value,message", [
    ("rank", -1, "lora.rank: must be >= 0"),
    ("alpha", 0.0, "lora.alpha: must be finite and > 0"),
    ("dropout", 1.0, r"lora.dropout: must lie in \[0, 1\)"),
    ("target_modules", [], "lora.target_modules: must list module names"),
    ("target_modules", [""], "lora.target_modules: must list module names"),
])
def test_bad_lora_settings_are_named(tmp_path, field, value, message):
    with pytest.raises(ConfigError, match=message):
        _cfg(tmp_path, "some/model", lora_cfg={field: value})


def test_lora_needs_a_pretrained_model_and_peft(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="lora.rank: LoRA adapts a pretrained model: set model.name_or_path"):
        _cfg(tmp_path, None)
    assert _cfg(tmp_path, None, lora_cfg={"rank": 0}).lora.rank == 0  # full fine-tuning from scratch
    monkeypatch.setitem(sys.modules, "peft", None)
    hint = r"\.venv/bin/pip install -e '\.\[lora\]' \(or CYB_EXTRAS=lora bash scripts/setup\.sh\)"
    with pytest.raises(ConfigError, match=hint):
        _cfg(tmp_path, "some/model")
    with pytest.raises(ImportError, match=hint):
        lora.require_peft()


def test_without_peft_merge_and_generate_say_what_to_install_in_one_line(lora_run, tmp_path, monkeypatch, capsys):
    from cyb.cli import main

    cfg, _ = lora_run
    monkeypatch.setitem(sys.modules, "peft", None)
    capsys.readouterr()
    for command in (["merge", cfg.train.out_dir, str(tmp_path / "merged")],
                    ["generate", cfg.train.out_dir, "--prompt", "1+2=", "--max-new-tokens", "2"]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"cyb {command[0]}: error: the LoRA folder ") and "\n" not in err, err
        assert "needs the peft package, which is not installed: in the cyb clone, " \
               ".venv/bin/pip install -e '.[lora]' (or CYB_EXTRAS=lora bash scripts/setup.sh)" in err
    assert not (tmp_path / "merged").exists()


def test_lora_fields_come_from_set_and_help_config(tmp_path):
    from cyb.config import apply_overrides, field_docs

    cfg = apply_overrides(_cfg(tmp_path, "m"), ["lora.rank=8", "lora.target_modules=[q_proj, v_proj]"])
    assert cfg.validate().lora.rank == 8 and cfg.lora.target_modules == ["q_proj", "v_proj"]
    docs = field_docs()
    assert {"lora.rank", "lora.alpha", "lora.dropout", "lora.target_modules"} <= docs.keys()
    assert "peft" in docs["lora.rank"]


# ---------------------------------------------------------------------------- DDP / FSDP2


def _fsdp_available() -> bool:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return False
    return torch.distributed.is_available() and torch.distributed.is_gloo_available()


def _train_cli(cfg_path: Path, out: Path, procs: int, *overrides: str) -> None:
    train = ["-m", "cyb", "train", str(cfg_path), "--set", f"train.out_dir={out}"]
    for item in overrides:
        train += ["--set", item]
    cmd = [sys.executable, *train] if procs == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}", *train]
    env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.skipif(not _fsdp_available(), reason="FSDP2 (fully_shard) with gloo is not available")
def test_fsdp_lora_equals_one_process_and_its_sharded_checkpoint_resumes(tmp_path, bases):
    """FSDP2 shards decoder layers holding frozen base weights and trainable adapters together."""
    cfg = _cfg(tmp_path / "unused", bases["untied"],
               method={"name": "cyb", "num_steps": 3, "recipe": 2, "omega": [1.0, 1.0, 2.0]},
               train={"micro_batch_size": 2, "eval_every": 3, "save_every": 3, "keep_last": 10})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    _train_cli(path, tmp_path / "one", 1)
    _train_cli(path, tmp_path / "fsdp", 2, "train.distributed=fsdp", "train.checkpoint_format=sharded")
    rows = {(r["split"], r["step"]): r for r in read_metrics(tmp_path / "fsdp")}
    expected = {(r["split"], r["step"]): r for r in read_metrics(tmp_path / "one")}
    assert rows.keys() == expected.keys()
    for key, row in rows.items():
        assert row["loss"] == pytest.approx(expected[key]["loss"], abs=1e-5, rel=1e-5), key
    ids = _ids()
    torch.testing.assert_close(_logits(PauseModel.from_pretrained(tmp_path / "fsdp" / "final"), ids),
                               _logits(PauseModel.from_pretrained(tmp_path / "one" / "final"), ids),
                               atol=1e-5, rtol=1e-5)
    def resumed_from_step_3(run, procs, *sets):
        """The last training loss of ``run`` cut back to its checkpoint of step 3 and resumed."""
        shutil.rmtree(run / "final")
        for ckpt in list_checkpoints(run):
            if ckpt.step > 3:
                shutil.rmtree(ckpt.path)
        _train_cli(path, run, procs, *sets)
        return [r for r in read_metrics(run) if r["split"] == "train"][-1]["loss"]

    want = pytest.approx(expected[("train", 6)]["loss"], abs=1e-5, rel=1e-5)
    # the sharded checkpoint of step 3 resumes in one process and ends where the others did
    assert resumed_from_step_3(tmp_path / "fsdp", 1, "train.checkpoint_format=sharded") == want
    # and the one-process (full) checkpoint of step 3 resumes under FSDP2
    shutil.copytree(tmp_path / "one", tmp_path / "back")
    assert resumed_from_step_3(tmp_path / "back", 2, "train.distributed=fsdp") == want


def test_gradient_checkpointing_gives_the_same_update(tmp_path, bases):
    losses = []
    for gc in (False, True):
        cfg = _cfg(tmp_path / f"gc{gc}", bases["untied"], model={"gradient_checkpointing": gc},
                   train={"steps": 3})
        trainer = Trainer(cfg)
        trainer.run()
        losses.append([r["loss"] for r in read_metrics(cfg.train.out_dir) if r["split"] == "train"])
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)
