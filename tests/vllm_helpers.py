"""Shared pieces of the vLLM plugin's tests (``tests/test_integrations_vllm*.py``): tiny random
shared-pause models saved as cyb saves them, and what cyb's engine generates for them.

vLLM's CPU attention needs a head dimension of at least 32, so these Llamas have hidden 64 and
two heads (the generation tests' models have head dimension 8).  The byte-level BPE tokenizer
is the server tests' (``serve_helpers``); the dk row of the output projection is drawn so that
both dk and answers occur.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
import transformers

from cyb.model import PauseModel
from serve_helpers import CHAT_TEMPLATE, CORPUS

M = 3
#: prompts of mixed lengths (1 to 28 tokens)
PROMPTS = ["The quick brown fox", "Water", "Q: There are 15 trees in the grove. How many trees?",
           "A", "Answer: 5", "freezes at zero degrees Celsius.\nA. one\nB. two", "lazy dog", "B. two\nC."]

_TOK: dict = {}


def tokenizer(folder: Path):
    from cyb.data.tokenizer import train_bpe_tokenizer

    if "tok" not in _TOK:
        tok = train_bpe_tokenizer(CORPUS, 320, folder)
        tok.chat_template = CHAT_TEMPLATE
        _TOK["tok"] = tok
    return copy.deepcopy(_TOK["tok"])


def build(tok, *, scheme: str = "shared", visibility: str = "shared", seed: int = 0, use_dk: bool = True,
          eos_like: int | None = None, hidden: int = 64, num_steps: int = M, **shape) -> PauseModel:
    """A 2-layer Llama (hidden 64, head dimension 32: two heads of ``hidden / 2``) with ``M`` = 3,
    float32.  ``eos_like``: the EOS row of the output projection becomes that token's, a little
    larger (so that EOS comes where that token would).  ``shape``: other LlamaConfig fields (the
    benchmarks' larger models: heads, layers, ``max_position_embeddings``)."""
    fields = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=256)
    fields.update(shape)
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok), initializer_range=0.3, tie_word_embeddings=False, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **fields)
    torch.manual_seed(seed)
    pm = PauseModel.from_config(cfg, copy.deepcopy(tok), num_steps=num_steps, use_dk=use_dk,
                                psi_dk=0.5 if use_dk else None, position_scheme=scheme,
                                pause_visibility=visibility).eval()
    with torch.no_grad():
        w = pm.hf_model.get_output_embeddings().weight
        if pm.settings.dk_id is not None:
            w[pm.settings.dk_id] = torch.randn(w.shape[1]) * 0.3
        if eos_like is not None:
            w[tok.eos_token_id] = w[eos_like] * 1.2
    return pm


def save_run(model: PauseModel, run: Path) -> Path:
    """``run`` laid out as a ``cyb train`` run folder whose ``final/`` holds ``model``."""
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text("model:\n  name_or_path: null\n", encoding="utf-8")
    (run / "run.json").write_text(json.dumps({"status": "finished"}), encoding="utf-8")
    model.save_pretrained(run / "final")
    return run


__all__ = ["M", "PROMPTS", "build", "save_run", "tokenizer"]
