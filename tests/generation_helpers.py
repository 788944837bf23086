"""Shared pieces of the generation tests (``tests/test_generation_*.py``): tiny random models
with a character tokenizer, and the comparison of two :func:`cyb.generation.generate` results.

Tiny random Llama and Gemma 2 (softcapped) models.  For the CYB models the dk row of the output
projection and the dk prior are set so that both dk and answer decisions occur.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from cyb.data.synthetic import CharTokenizer
from cyb.generation import GenerationResult
from cyb.model import PauseModel

TOK = CharTokenizer().to_hf()
PROMPTS = ["12+34=", "hello world", "a", "xyz 7"]

# (init range, dk row scale, psi_dk): settings that give a mix of dk and answer decisions
MIXED = {"llama": (0.3, 0.3, 0.5), "gemma2": (0.3, 1.0, None)}
RARE = ("llama", 0.3, 1.0, None)  # dk is rare


def build(family="llama", kind="cyb", *, init=0.3, dk_scale=0.3, psi_dk=0.5, num_steps=3,
          scheme="shared", seed=0) -> PauseModel:
    """A 2-layer model with the character tokenizer; ``kind`` is cyb (dk), tbys (no dk) or
    baseline (M = 1)."""
    common = dict(vocab_size=len(TOK), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  initializer_range=init, tie_word_embeddings=False,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if family == "llama":
        cfg, impl = transformers.LlamaConfig(**common), None
    else:
        cfg, impl = transformers.Gemma2Config(**common, head_dim=8, sliding_window=16,
                                              final_logit_softcapping=3.0), "eager"
    m = 1 if kind == "baseline" else num_steps
    torch.manual_seed(seed)
    pm = PauseModel.from_config(cfg, CharTokenizer().to_hf(), num_steps=m, use_dk=kind == "cyb",
                                psi_dk=psi_dk if kind == "cyb" else None, position_scheme=scheme,
                                attn_implementation=impl).eval()
    if pm.settings.dk_id is not None:
        with torch.no_grad():
            w = pm.hf_model.get_output_embeddings().weight
            w[pm.settings.dk_id] = torch.randn(w.shape[1]) * dk_scale
    return pm


_CACHE: dict = {}


def model(family="llama", kind="cyb", **kw) -> PauseModel:
    """:func:`build`'s model, built once per test session (a CYB model with the family's
    :data:`MIXED` settings unless told otherwise)."""
    if kind == "cyb" and not kw:
        init, dk_scale, psi = MIXED[family]
        kw = dict(init=init, dk_scale=dk_scale, psi_dk=psi)
    key = (family, kind, tuple(sorted(kw.items())))
    if key not in _CACHE:
        _CACHE[key] = build(family, kind, **kw)
    return _CACHE[key]


def encode(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


def same_results(got: list[GenerationResult], want: list[GenerationResult], *,
                 whole_blocks: bool = False) -> None:
    """``got`` and ``want`` agree (tokens, steps, text, stop reasons, positions, ``d``, ``E[S]``).
    ``whole_blocks``: ``got`` fed every token with all its pauses (the block-adaptive
    decoder), so its positions are those of fixed mode."""
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids
        assert g.steps == w.steps
        assert g.text == w.text and g.stop_reason == w.stop_reason
        if whole_blocks:
            assert g.positions == g.num_steps * (len(g.prompt_ids) + len(g.token_ids) - 1)
        else:
            assert g.positions == w.positions
        torch.testing.assert_close(torch.tensor(g.d), torch.tensor(w.d), equal_nan=True,
                                   atol=1e-5, rtol=1e-4)
        if w.expected_steps is not None:
            assert g.expected_steps == pytest.approx(w.expected_steps, abs=1e-5)


def record_growing_attention(monkeypatch, module) -> list[str]:
    """Make ``module``'s ``growing_attention`` also note the device type of every entry; returns
    the list it appends to."""
    from contextlib import contextmanager

    from cyb import runtime

    entered: list[str] = []

    @contextmanager
    def recording(device):
        entered.append(device.type)
        with runtime.growing_attention(device):
            yield

    monkeypatch.setattr(module, "growing_attention", recording)
    return entered
