"""What ``cyb serve`` does with a prompt its model cannot read: characters the model never saw in
training (a model of a synthetic task with the character tokenizer) or that its tokenizer lacks
get a 400 that names them; an empty prompt is what the tokenizer makes of it (docs/how-to/serve.md)."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from cyb.data.synthetic import CharTokenizer  # noqa: E402
from cyb.model import PauseModel  # noqa: E402
from serve_helpers import NAME, pause_model, running, tokenizer  # noqa: E402
from test_serve import post  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

ADDITION = ("task addition (digits=3)", "0123456789+=")


@pytest.fixture(scope="module")
def char_model():
    """A tiny cyb model with the character tokenizer of the synthetic tasks (the demo's kind)."""
    tok = CharTokenizer().to_hf()
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                                   pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                                   eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    return PauseModel.from_config(cfg, copy.deepcopy(tok), num_steps=2, use_dk=True, psi_dk=0.5).eval()


def _ask(url, prompt):
    return post(url, "/v1/completions", {"model": NAME, "prompt": prompt, "max_tokens": 2, "temperature": 0})


def test_a_prompt_of_characters_the_task_never_had_gets_a_400_naming_them(char_model):
    with running(char_model, {"trained_on": ADDITION}) as srv:
        status, _, body = _ask(srv.url, "hello world")
        assert status == 400
        message = body["error"]["message"]
        assert message.startswith("prompt: prompt 0 has the characters ' ', 'd', 'e', 'h', 'l', 'o', 'r', 'w' "
                                  "that the model never saw: it was trained on task addition (digits=3), whose text "
                                  "has only the characters '+0123456789='")
        assert "\n" not in message
        status, _, body = _ask(srv.url, ["864+394=", "2+2=é"])
        assert status == 400 and body["error"]["message"].startswith("prompt: prompt 1 has the character 'é' that")
        status, _, body = _ask(srv.url, "864+394=")
        assert status == 200 and body["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_character_the_tokenizer_lacks_is_named_not_the_tokenizers_unk_error(char_model):
    """Without its task (a folder without training_state.json), the character tokenizer's own
    alphabet decides; never `WordLevel error: Missing [UNK] token`."""
    with running(char_model) as srv:
        status, _, body = _ask(srv.url, "café")
        message = body["error"]["message"]
        assert status == 400 and "UNK" not in message and "WordLevel" not in message
        assert message.startswith("prompt: prompt 0 has the character 'é' that the model's character tokenizer does not "
                                  "have (it reads only '0123456789abcdefghijklmnopqrstuvwxyz")
        status, _, _ = _ask(srv.url, "hello world")  # letters are in its alphabet
        assert status == 200


def test_an_empty_prompt_is_what_the_tokenizer_makes_of_it(char_model, tmp_path):
    """The character tokenizer adds <bos>: "" is a prompt of one token, answered 200; a tokenizer
    that adds nothing leaves no token, a 400 that says the prompt is empty."""
    with running(char_model, {"trained_on": ADDITION}) as srv:
        status, _, body = _ask(srv.url, "")
        assert status == 200 and body["usage"]["prompt_tokens"] == 1
    bpe = pause_model(tokenizer(tmp_path))
    assert bpe.tokenizer("", add_special_tokens=True)["input_ids"] == []
    with running(bpe) as srv:
        status, _, body = _ask(srv.url, "")
        assert status == 400
        assert body["error"]["message"] == "prompt: prompt 0 is empty: generation needs at least one prompt token"


def test_the_model_reads_its_task_from_its_training_state(tmp_path, char_model):
    import json

    from cyb.model.loading import trained_on

    folder = tmp_path / "final"
    folder.mkdir()
    tok = char_model.tokenizer
    assert trained_on(folder, tok) is None  # no training_state.json
    (folder / "training_state.json").write_text(json.dumps({"step": 3, "task": "addition",
                                                            "task_kwargs": {"digits": 3}}))
    assert trained_on(folder, tok) == ADDITION
    (folder / "training_state.json").write_text(json.dumps({"step": 3, "task": "lookup", "task_kwargs": {}}))
    assert trained_on(folder, tok)[0] == "task lookup" and "a" in trained_on(folder, tok)[1]
    (folder / "training_state.json").write_text(json.dumps({"step": 3, "task": "reasoning-gym:chain_sum"}))
    assert trained_on(folder, tok) is None
    text_model = pause_model(tokenizer(tmp_path / "tok"))
    (folder / "training_state.json").write_text(json.dumps({"step": 3, "task": "addition"}))
    assert trained_on(folder, text_model.tokenizer) is None  # a pretrained tokenizer read all kinds of text


def test_a_saved_model_of_a_task_is_served_with_its_task(tmp_path, char_model):
    """``from_pretrained`` reads the task, and the server refuses what the task never had."""
    import json

    folder = tmp_path / "saved"
    char_model.save_pretrained(folder)
    (folder / "training_state.json").write_text(json.dumps({"step": 3, "task": "addition",
                                                            "task_kwargs": {"digits": 3}}))
    loaded = PauseModel.from_pretrained(folder)
    assert loaded.trained_on == ADDITION
    with running(loaded) as srv:
        status, _, body = _ask(srv.url, "hello")
        assert status == 400 and "that the model never saw: it was trained on task addition" in body["error"]["message"]
