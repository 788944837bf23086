"""cyb.families: one entry per model family, and everything that asks it."""

from __future__ import annotations

import pytest

from cyb import families
from cyb.build import hf_config_for
from cyb.config import ConfigError, RunConfig, field_docs


@pytest.mark.parametrize("name", families.NAMES)
def test_every_family_builds_its_model_type(name):
    fam = families.family(name)
    cfg = RunConfig.from_dict({"model": {"arch": name, "hidden_size": 64, "num_heads": 4}}).validate()
    config = hf_config_for(cfg, 100)
    assert config.model_type == fam.model_type and families.of_model_type(config.model_type) is fam
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (64, 4, 100)
    if fam.head_dim:
        assert config.head_dim == 16
    if fam.query_scale:
        assert config.query_pre_attn_scalar == 16
    for key, value in fam.fixed:
        assert getattr(config, key) == value


def test_config_checks_and_help_config_name_the_families():
    with pytest.raises(ConfigError, match="model.arch: must be one of " + ", ".join(families.NAMES)):
        RunConfig.from_dict({"model": {"arch": "gpt2"}}).validate()
    assert field_docs()["model.arch"].endswith(": " + ", ".join(families.NAMES) + ".")
    with pytest.raises(ValueError, match="unknown model family 'gpt2'; known: llama"):
        families.family("gpt2")


def test_pretrained_model_types_find_their_family():
    assert families.of_model_type("gemma3").name == families.of_model_type("gemma3_text").name == "gemma3"
    assert families.of_model_type("phi3") is None
