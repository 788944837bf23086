"""cyb.generation.text and cyb.generation.shade: stop strings (held back while they may still
complete, cut from the text, the same through the stream) and the colours of steps used."""

from __future__ import annotations

import pytest

from cyb.generation import generate
from cyb.generation.shade import legend, step_rgb
from cyb.generation.text import TextStream
from generation_helpers import model

pytestmark = pytest.mark.usefixtures("one_thread")

def test_stop_string_cuts_text_and_stream_matches():
    pm = model("llama")
    [full] = generate(pm, "hello world", max_new_tokens=12, eos_token_ids=())
    stop = full.text[5:7]
    cut = full.text.find(stop)
    events = []
    [res] = generate(pm, "hello world", max_new_tokens=12, eos_token_ids=(), stop=[stop],
                     on_token=events.append)
    assert res.stop_reason == "stop"
    assert res.text == full.text[:cut]
    assert res.token_ids == full.token_ids[: len(res.token_ids)]
    assert "".join(e.text for e in events) == res.text
    assert [e.token_id for e in events] == res.token_ids
    assert [e.steps for e in events] == res.steps
    assert events[-1].finished and events[-1].stop_reason == "stop"
    assert not any(e.finished for e in events[:-1])


def test_text_stream_holds_back_possible_stop_strings():
    ts = TextStream(lambda ids: "".join(chr(i) for i in ids), stop=["ab"])
    assert ts.push(ord("x")) == ("x", False)
    assert ts.push(ord("a")) == ("", False)  # could start "ab"
    assert ts.push(ord("c")) == ("ac", False)
    assert ts.push(ord("a")) == ("", False)
    assert ts.push(ord("b")) == ("", True)
    assert ts.text == "xac"
    ts = TextStream(lambda ids: "".join(chr(i) for i in ids))
    assert ts.push(0xFFFD) == ("", False)  # an incomplete character waits
    assert ts.push(ord("z")) == ("\ufffdz", False)
    assert ts.flush() == ""


def test_shading_colours():
    assert step_rgb(1, 4) == (255, 255, 255)
    assert step_rgb(4, 4) == (8, 48, 107)
    assert step_rgb(1, 1) == (255, 255, 255)
    line = legend(3, truecolor=True)
    assert line.count("\x1b[48;2;") == 3
    assert legend(3, truecolor=False).count("\x1b[48;5;") == 3
    assert line.startswith("steps used per token (1 = no pause, 3 = all 2 pauses): ")
    assert legend(2, truecolor=True).startswith("steps used per token (1 = no pause, 2 = its pause): ")
    one = legend(1, truecolor=True)  # a no-pause baseline
    assert one.startswith("steps used per token (M = 1: the model has no pauses, every token takes 1 step): ")
    assert one.count("\x1b[48;2;") == 1 and "0 pauses" not in one


def test_shade_marks_line_breaks_on_their_colour():
    from cyb.generation.shade import NEWLINE_MARK, shade

    assert shade("", 2, 4, truecolor=True) == ""
    two = shade("\n\n", 3, 4, truecolor=False)
    assert two.count(NEWLINE_MARK) == 2 and two.count("\n") == 2
    assert shade("ab", 2, 4, truecolor=True).endswith("ab\x1b[0m")
    assert shade("a\nb", 2, 4, truecolor=True).split("\n")[0].endswith(NEWLINE_MARK + "\x1b[0m")


def _trained_tokenizer(kind: str):
    """A small Hugging Face tokenizer trained here: byte-level BPE (GPT-2 / SmolLM2 style) or
    BPE with SentencePiece's metaspace (Llama / Gemma style)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = ["héllo wörld, the cat's ☃ sat. 日本語 テキスト!", "Return the value ; of x .", "naïve café — über"] * 20
    tok = Tokenizer(models.BPE(unk_token="<unk>" if kind == "metaspace" else None))
    if kind == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        alphabet = []
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>"],
                                                      initial_alphabet=alphabet))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace"])
def test_incremental_text_equals_decoding_the_whole_sequence(kind):
    """Random ids (multi-byte characters cut between tokens, special tokens, leading spaces):
    every prefix's streamed text is the decoding of all its ids, and the released pieces add up
    to it."""
    import torch

    from cyb.generation.text import decode_fn

    tok = _trained_tokenizer(kind)
    decode = decode_fn(tok)
    g = torch.Generator().manual_seed(0)
    for _ in range(60):
        ids = torch.randint(0, len(tok), (int(torch.randint(1, 60, (1,), generator=g)),), generator=g).tolist()
        ts, released = TextStream(decode), ""
        for k, t in enumerate(ids):
            piece, hit = ts.push(t)
            released += piece
            assert not hit and ts.text == decode(ids[:k + 1])
        assert released + ts.flush() == decode(ids)
