"""Shared pieces of the server's tests (``tests/test_serve*.py``): a tiny random pause model
with a small byte-level BPE tokenizer and a chat template, saved once per session, and the
server on 127.0.0.1 in a thread of the test process."""

from __future__ import annotations

import contextlib
import copy

import torch
import transformers

from cyb.data.tokenizer import train_bpe_tokenizer
from cyb.model import PauseModel

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Question: what is 2 + 3? Answer: 5",
    "Water freezes at zero degrees Celsius.\nA. one\nB. two\nC. three\nD. four\nAnswer: B",
    "Q: There are 15 trees in the grove. How many trees? A: The answer is 6.",
] * 4
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")
NAME = "tiny"

_CACHE: dict = {}


def tokenizer(folder):
    if "tok" not in _CACHE:
        tok = train_bpe_tokenizer(CORPUS, 320, folder)
        tok.chat_template = CHAT_TEMPLATE
        _CACHE["tok"] = tok
    return copy.deepcopy(_CACHE["tok"])


def pause_model(tok, kind: str = "cyb", num_steps: int = 3, visibility: str = "shared",
                max_positions: int = 1024) -> PauseModel:
    """A 2-layer Llama (hidden 32): ``cyb`` (dk, with a dk row that makes both dk and answers
    occur), ``tbys`` (pauses, no dk) or ``baseline`` (M = 1)."""
    key = (kind, num_steps, visibility, max_positions)
    if key not in _CACHE:
        cfg = transformers.LlamaConfig(
            vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
            initializer_range=0.3, tie_word_embeddings=False, pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
        torch.manual_seed(0)
        m = 1 if kind == "baseline" else num_steps
        pm = PauseModel.from_config(cfg, copy.deepcopy(tok), num_steps=m, use_dk=kind == "cyb",
                                    psi_dk=0.5 if kind == "cyb" else None,
                                    pause_visibility=visibility if m > 1 else "shared").eval()
        if pm.settings.dk_id is not None:
            with torch.no_grad():
                w = pm.hf_model.get_output_embeddings().weight
                w[pm.settings.dk_id] = torch.randn(w.shape[1]) * 0.3
        _CACHE[key] = pm
    return _CACHE[key]


def served(model, **kw):
    from cyb.serve.served import ServedModel

    kw.setdefault("max_model_len", 256)
    return ServedModel(model, NAME, **kw)


@contextlib.contextmanager
def running(model, served_kw: dict | None = None, **options):
    """The server of ``model`` on a free port of 127.0.0.1, in a thread; stopped on exit."""
    from cyb.serve import ServeOptions
    from cyb.serve.server import start_background

    options.setdefault("port", 0)
    options.setdefault("grace_s", 5.0)
    srv = start_background(served(model, **(served_kw or {})), ServeOptions(**options))
    try:
        yield srv
    finally:
        srv.stop()


def metric(text: str, name: str) -> float:
    """The value of an unlabelled sample ``name`` in Prometheus text."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)
