"""Text a model cannot read gets one line naming the characters (or words) at fault, the same
from every entry point: the check itself (:func:`cyb.data.tokenizer.check_text`), the Python API
(:mod:`cyb.generation`), ``cyb generate`` and ``cyb eval --data`` (``cyb serve``:
tests/test_serve_prompts.py; the lm-evaluation-harness model: tests/test_lm_eval_cli.py); never
the tokenizer's ``WordLevel error: Missing [UNK] token``."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import transformers

from cyb.cli import main
from cyb.data.synthetic import CharTokenizer
from cyb.data.tokenizer import UnencodableText, check_text, encode_failure, text_encoder, unknown_pieces
from cyb.generation import generate
from cyb.model import PauseModel

pytestmark = pytest.mark.usefixtures("one_thread")

ADDITION = ("task addition (digits=3)", "0123456789+=")
NEVER_SAW = ("prompt 0 has the characters ' ', 'd', 'e', 'h', 'l', 'o', 'r', 'w' that the model never saw: it was "
             "trained on task addition (digits=3), whose text has only the characters '+0123456789='")
LACKS = "prompt 0 has the character 'é' that the model's character tokenizer does not have (it reads only '0123"


def word_tokenizer(unk: bool = False):
    """A word-level tokenizer of five words, with or without an unknown token."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<bos>", "<eos>", *(["<unk>"] if unk else []), "hello", "world", "one", "two", "three"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>" if unk else None))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>",
                                                eos_token="<eos>", **({"unk_token": "<unk>"} if unk else {}))


def tiny(tokenizer) -> PauseModel:
    cfg = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                   max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return PauseModel.from_config(cfg, copy.deepcopy(tokenizer), num_steps=2, use_dk=True, psi_dk=0.5).eval()


@pytest.fixture(scope="module")
def char_folder(tmp_path_factory):
    """A saved model of the addition task with the character tokenizer (the demo's kind)."""
    folder = tmp_path_factory.mktemp("addition")
    tiny(CharTokenizer().to_hf()).save_pretrained(folder)
    (folder / "training_state.json").write_text(json.dumps({"step": 1, "task": "addition",
                                                            "task_kwargs": {"digits": 3}}))
    return folder


# ----------------------------------------------------------------------------- the check


def test_the_pieces_a_vocabulary_without_an_unknown_token_lacks_are_named():
    char = CharTokenizer()
    assert unknown_pieces(char, "héllo<eos> 世") == ["é", "世"]  # special-token names are tokens
    assert unknown_pieces(char.to_hf(), "héllo<eos>\n世") == ["\n", "é", "世"]
    assert unknown_pieces(char.to_hf(), "a\n\nB\n") == ["\n", "B"]  # characters, never a run of them
    assert unknown_pieces(char.to_hf(), "<eos>", special_tokens=False) == ["<"]  # ">" is in the alphabet
    assert unknown_pieces(word_tokenizer(), "hello there world four") == ["four", "there"]
    assert unknown_pieces(word_tokenizer(unk=True), "hello there") == []  # <unk> stands for them
    assert unknown_pieces(word_tokenizer(), "hello world") == []


def test_check_text_names_the_characters_never_seen_then_those_the_tokenizer_lacks():
    with pytest.raises(UnencodableText) as e:
        check_text("hello world", "prompt 0", tokenizer=CharTokenizer().to_hf(), trained_on=ADDITION)
    assert str(e.value) == NEVER_SAW
    with pytest.raises(UnencodableText) as e:
        check_text("café", "prompt 0", tokenizer=CharTokenizer().to_hf())
    assert str(e.value).startswith(LACKS) and "\n" not in str(e.value)
    assert e.value.reason == "its vocabulary lacks the character 'é' and has no unknown token to stand for it"
    with pytest.raises(ValueError, match="^prompt 2 has the words 'four', 'there' that the tokenizer's vocabulary "
                                         "does not have, and no unknown token to stand for them$"):
        check_text("hello there four", "prompt 2", tokenizer=word_tokenizer())
    check_text("12+34=", "prompt 0", tokenizer=CharTokenizer().to_hf(), trained_on=ADDITION)
    check_text("hello there", "prompt 0", tokenizer=word_tokenizer(unk=True))


def test_a_failure_that_names_no_piece_says_the_tokenizers_error_in_one_line():
    e = encode_failure(None, "x", "prompt 1", Exception("WordLevel error: Missing [UNK] token from the vocabulary"))
    assert str(e) == ("the tokenizer cannot encode prompt 1: its vocabulary lacks some of the text's characters "
                      "and has no unknown token to stand for them")
    assert str(encode_failure(None, "x", "prompt 1", RuntimeError("bad\nthing"))) == \
        "the tokenizer cannot encode prompt 1: bad thing"


def test_the_batch_encoder_names_what_its_vocabulary_lacks():
    with pytest.raises(UnencodableText) as e:
        text_encoder(word_tokenizer())(["hello world", "one two four"])
    assert str(e.value).startswith("text 1 of the batch has the word 'four' that")
    assert e.value.reason == "its vocabulary lacks the word 'four' and has no unknown token to stand for it"


# ----------------------------------------------------------------------------- the entry points


def test_the_python_api_refuses_text_its_model_cannot_read(char_folder):
    model = PauseModel.from_pretrained(char_folder)
    assert model.trained_on == ADDITION
    with pytest.raises(UnencodableText, match="^prompt 0 has the characters ' ', 'd'"):
        generate(model, "hello world", max_new_tokens=2)
    with pytest.raises(ValueError, match="^prompt 1 has the character 'é' that the model never saw"):
        generate(model, ["12+34=", "1+é"], max_new_tokens=2)
    [res] = generate(model, "12+34=", max_new_tokens=2)
    assert len(res.token_ids) >= 1
    words = tiny(word_tokenizer())
    with pytest.raises(ValueError, match="^prompt 0 has the word 'there' that the tokenizer's vocabulary does not"):
        generate(words, "hello there", max_new_tokens=2)
    generate(words, "hello world", max_new_tokens=2)


def _one_line(capsys, command: str) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith(f"cyb {command}: error: ") and "\n" not in err and "Traceback" not in err, err
    assert captured.out == ""
    return err.split(": error: ", 1)[1]


def test_cyb_generate_says_one_line_and_exits_2(char_folder, capsys):
    assert main(["generate", str(char_folder), "--prompt", "hello world", "--device", "cpu"]) == 2
    assert _one_line(capsys, "generate") == NEVER_SAW
    assert main(["generate", str(char_folder), "--prompt", "héllo 世界", "--shade", "--device", "cpu"]) == 2
    assert _one_line(capsys, "generate").startswith("prompt 0 has the characters ' ', 'h', 'l', 'o', 'é', '世', '界' "
                                                     "that the model never saw")
    assert main(["generate", str(char_folder), "--prompt", "12+34=", "--max-new-tokens", "2", "--device", "cpu"]) == 0


def test_cyb_eval_names_the_document_and_its_characters(char_folder, tmp_path, capsys):
    data = tmp_path / "text.txt"
    data.write_text("12+34=46\ncafé\n", encoding="utf-8")
    out = tmp_path / "eval"
    assert main(["eval", str(char_folder), "--data", str(data), "--out", str(out), "--no-progress",
                 "--device", "cpu"]) == 2
    assert _one_line(capsys, "eval").startswith(f"document 1 of {data} has the characters '\\n', 'a', 'c', 'f', "
                                                "'é' that the model never saw: it was trained on task addition")
    assert not out.exists()
