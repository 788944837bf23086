"""Run configuration: shipped configs validate, bad input names the field, CLI checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cyb.cli import main
from cyb.config import ConfigError, RunConfig, apply_overrides, field_docs

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SHIPPED = sorted(CONFIGS.glob("*.yaml")) + sorted(CONFIGS.glob("paper/*.yaml"))


def _write(tmp_path, data: dict, name="cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(CONFIGS)) for p in SHIPPED])
def test_shipped_configs_validate(path):
    cfg = RunConfig.load(path)
    assert cfg.train.out_dir.startswith("runs/")


def test_there_are_shipped_configs():
    assert len(SHIPPED) >= 10 and any(p.parent.name == "paper" for p in SHIPPED)


def test_paper_configs_follow_the_paper():
    for path in CONFIGS.glob("paper/*.yaml"):
        if path.stem.endswith("-lora"):
            continue
        cfg = RunConfig.load(path)
        assert cfg.optim.lr is None and cfg.optim.lr_alpha == 1e-4 and cfg.optim.min_lr_ratio == 1e-2
        assert cfg.data.block_len == 2048
        assert cfg.method.name in ("baseline", "baseline_nx", "tbys", "cyb")
        assert cfg.lora.rank == 0


def test_every_paper_fine_tuning_has_a_lora_twin():
    """The LoRA recipe is its full fine-tuning config with adapters, an adapter LR and its own out_dir."""
    full = sorted(p for p in CONFIGS.glob("paper/*-finetune-*.yaml") if not p.stem.endswith("-lora"))
    assert full
    for path in full:
        twin = path.with_name(path.stem + "-lora.yaml")
        assert twin.is_file(), f"{twin.name} is missing"
        a, b = RunConfig.load(path).to_dict(), RunConfig.load(twin).to_dict()
        assert b["lora"]["rank"] > 0 and b["optim"]["lr"] is not None
        assert b["train"]["out_dir"] == a["train"]["out_dir"] + "-lora"
        for d in (a, b):
            d.pop("lora"), d["train"].pop("out_dir")
            for key in ("lr", "lr_alpha", "weight_decay"):
                d["optim"].pop(key)
        assert a == b, twin.name


@pytest.mark.parametrize("data,match", [
    ({"modle": {}}, r"unknown field 'modle' in the top level; did you mean 'model'"),
    ({"model": {"hiden_size": 8}}, r"unknown field 'hiden_size' in model; did you mean 'hidden_size'"),
    ({"train": {"steps": "many"}}, r"train\.steps: expected an integer, got 'many'"),
    ({"train": {"steps": 2.5}}, r"train\.steps: expected an integer"),
    ({"train": {"progress": 3}}, r"train\.progress: expected true or false"),
    ({"optim": {"lr": True}}, r"optim\.lr: expected a number"),
    ({"method": {"omega": 0.5}}, r"method\.omega: expected a list"),
    ({"method": {"omega": [1, "x", 1, 1]}}, r"method\.omega\[1\]: expected a number"),
    ({"model": {"arch": None}}, r"model\.arch: may not be null"),
    ({"data": {"task_kwargs": [1]}}, r"data\.task_kwargs: expected a mapping"),
    ({"train": 5}, r"train: expected a mapping"),
])
def test_type_errors_name_the_field(data, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig.from_dict(data)


@pytest.mark.parametrize("data,match", [
    ({"method": {"num_steps": 0}}, r"method\.num_steps: M must be >= 1"),
    ({"method": {"name": "tbys", "num_steps": 1}}, r"method\.num_steps: tbys needs M >= 2"),
    ({"method": {"name": "cybb"}}, r"method\.name: must be one of baseline, baseline_nx, tbys"),
    ({"method": {"omega": [1, 1]}}, r"method\.omega: must have length M = 4, got 2"),
    ({"method": {"omega": [1, -1, 1, 1]}}, r"method\.omega: must be non-negative"),
    ({"method": {"omega": [1, float("nan"), 1, 1]}}, r"method\.omega: must be finite"),
    ({"method": {"omega": [0, 0, 0, 0]}}, r"method\.omega: must have a positive entry"),
    ({"method": {"gamma": [1, 1.5, 1, 1]}}, r"method\.gamma: must lie in \[0, 1\]"),
    ({"method": {"gamma0": 1.5}}, r"method\.gamma0: must lie in \[0, 1\]"),
    ({"method": {"gamma0": 0.5, "gamma": [1, 1, 1, 1]}}, r"method\.gamma0: set either"),
    ({"method": {"name": "cyb_va"}}, r"method\.rho: cyb_va needs rho"),
    ({"method": {"name": "cyb_va", "rho": [0, 1, 1, 1]}}, r"method\.rho: cyb_va needs rho > 0"),
    ({"method": {"psi_dk": 1.0}}, r"method\.psi_dk: must lie in \(0, 1\)"),
    ({"method": {"recipe": 2, "name": "cyb_va", "rho": [1, 1, 1, 1]}}, r"method\.recipe: Recipe 2"),
    ({"method": {"name": "baseline_nx"}, "data": {"task": "addition"}}, r"method\.name: baseline_nx"),
    ({"method": {"name": "tbys_original", "tbys_scheme": "append"}}, r"method\.tbys_scheme: append"),
    ({"model": {"hidden_size": 30, "num_heads": 4}}, r"model\.hidden_size: must be a multiple"),
    ({"model": {"attn_implementation": "flash_attention_2"}}, r"model\.attn_implementation: must be sdpa"),
    ({"data": {"block_len": 1}}, r"data\.block_len: must be >= 2"),
    ({"data": {"task": "additon"}}, r"data\.task / data\.task_kwargs: unknown synthetic task 'additon'"),
    ({"data": {"task": "addition", "task_kwargs": {"digitz": 3}}}, r"data\.task_kwargs: .*unknown \['digitz'\]"),
    ({"data": {"valid_fraction": 1.0}}, r"data\.valid_fraction: must lie in \[0, 1\)"),
    ({"data": {"shuffle": "random"}}, r"data\.shuffle: must be one of auto, corpus, buffer, none"),
    ({"data": {"shuffle_buffer": 0}}, r"data\.shuffle_buffer: must be >= 2 blocks"),
    ({"optim": {"lr": -1}}, r"optim\.lr: must be > 0"),
    ({"optim": {"min_lr_ratio": 2}}, r"optim\.min_lr_ratio: must lie in \[0, 1\]"),
    ({"optim": {"beta2": 1.0}}, r"optim\.beta2: must lie in \[0, 1\)"),
    ({"train": {"micro_batch_size": 5, "batch_size": 16}}, r"train\.micro_batch_size: must divide"),
    ({"train": {"micro_batch_size": 32, "batch_size": 16}}, r"train\.micro_batch_size: must lie in"),
    ({"train": {"device": "gpu"}}, r"train\.device: must be auto, cpu, cuda or cuda:N"),
    ({"train": {"keep_last": 0}}, r"train\.keep_last: must be >= 1"),
    ({"train": {"distributed": "deepspeed"}}, r"train\.distributed: must be one of auto, ddp, fsdp, hsdp, none"),
])
def test_range_errors_name_the_field(data, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig.from_dict(data).validate()


def test_overrides(tmp_path):
    cfg = RunConfig()
    apply_overrides(cfg, ["train.steps=7", "method.omega=[1, 0, 0, 1]", "method.psi_dk=null",
                          "data.task=addition", "data.task_kwargs={digits: 3}", "data.task_kwargs.lsb_first=true",
                          "train.progress=off", "optim.lr=3e-4"])
    assert cfg.train.steps == 7 and cfg.method.omega == [1.0, 0.0, 0.0, 1.0]
    assert cfg.method.psi_dk is None and cfg.train.progress is False and cfg.optim.lr == 3e-4
    assert cfg.data.task_kwargs == {"digits": 3, "lsb_first": True}
    cfg.validate()


@pytest.mark.parametrize("item,match", [
    ("train.steps", r"--set 'train.steps': must look like section\.field=value"),
    ("steps=3", r"the key must be section\.field"),
    ("trian.steps=3", r"unknown field 'trian' .*did you mean 'train'"),
    ("train.stepz=3", r"unknown field 'stepz' .*did you mean 'steps'"),
    ("train.steps=abc", r"train\.steps: expected an integer, got 'abc'"),
    ("train.steps.x=1", r"train\.steps is not a mapping"),
    ("method.omega=[1, 2", r"method\.omega: cannot parse"),
])
def test_override_errors(item, match):
    with pytest.raises(ConfigError, match=match):
        apply_overrides(RunConfig(), [item])


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        RunConfig.load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        RunConfig.load(bad)
    listy = _write(tmp_path, [1, 2], "list.yaml")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        RunConfig.load(listy)
    typo = _write(tmp_path, {"train": {"step": 3}}, "typo.yaml")
    with pytest.raises(ConfigError, match=r"typo.yaml: unknown field 'step' in train; did you mean 'steps'"):
        RunConfig.load(typo)


def test_dump_load_round_trip(tmp_path):
    cfg = RunConfig.load(CONFIGS / "cpu-tiny.yaml", ["method.omega=[1, 1, 1, 1]", "method.gamma0=0.9"])
    cfg.dump(tmp_path / "again.yaml")
    assert RunConfig.load(tmp_path / "again.yaml").to_dict() == cfg.to_dict()


def test_every_field_is_documented():
    docs = field_docs()
    defaults = RunConfig().to_dict()
    fields = {f"{s}.{k}" for s, sec in defaults.items() for k in sec}
    assert set(docs) == fields
    assert not [k for k, v in docs.items() if len(v) < 10]


def test_cli_check_and_help_config(tmp_path, capsys):
    assert main(["train", str(CONFIGS / "cpu-tiny.yaml"), "--check"]) == 0
    assert "configuration is valid" in capsys.readouterr().out
    assert main(["train", str(CONFIGS / "cpu-tiny.yaml"), "--check", "--set", "method.num_steps=0"]) == 2
    assert "method.num_steps: M must be >= 1" in capsys.readouterr().err
    assert main(["train", str(CONFIGS / "cpu-tiny.yaml"), "--check", "--set", "train.bogus=1"]) == 2
    assert "unknown field 'bogus'" in capsys.readouterr().err
    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    assert "method.psi_dk = 0.9" in out and "Prior probability of <don't know>" in out
    assert "train.eval_batches = 20" in out
    assert main(["train"]) == 2
    assert "CONFIG" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["train", "--help"])
    assert exc.value.code == 0
    assert "--set" in capsys.readouterr().out


def test_validation_is_done_once_per_state(monkeypatch):
    import cyb.config as config

    calls = []
    real = config._validate_model
    monkeypatch.setattr(config, "_validate_model", lambda m: (calls.append(1), real(m)))
    cfg = RunConfig().validate()
    cfg.validate()
    assert len(calls) == 1
    cfg.train.steps = 0  # changed after it passed: checked again
    with pytest.raises(ConfigError, match="train.steps"):
        cfg.validate()
    assert len(calls) == 2
