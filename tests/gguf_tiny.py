"""A tiny Llama written as a GGUF file (float32 tensors, a byte-level BPE the project trains), so
that GGUF loading and conversion are tested in a second, without a real model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

DOCS = [f"the number {i} is {'even' if i % 2 == 0 else 'odd'}, and {i * 7} is seven times {i}." for i in range(200)]
LAYER_NAMES = (("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
               ("self_attn.o_proj", "attn_output"), ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"),
               ("mlp.down_proj", "ffn_down"), ("input_layernorm", "attn_norm"),
               ("post_attention_layernorm", "ffn_norm"))


def _to_gguf_layout(weight: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face's q/k row order to llama.cpp's (transformers undoes this when it reads)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_tiny_gguf(path: Path, *, seed: int = 0, tokenizer_dir: Path | None = None, name: str = "tiny test llama"):
    """Write a 2-layer Llama (hidden 32) with a trained BPE tokenizer as ``path``; returns the
    Hugging Face model it holds (float32, eval mode)."""
    from gguf import GGUFWriter
    from transformers import LlamaConfig, LlamaForCausalLM

    from cyb.data.tokenizer import train_bpe_tokenizer

    path = Path(path)
    tok_dir = tokenizer_dir or path.parent / f"{path.stem}-bpe"
    train_bpe_tokenizer(DOCS, 300, tok_dir)
    model_json = json.loads((tok_dir / "tokenizer.json").read_text())["model"]
    tokens = [None] * len(model_json["vocab"])
    for t, i in model_json["vocab"].items():
        tokens[i] = t
    merges = [" ".join(m) if isinstance(m, list) else m for m in model_json["merges"]]
    heads, kv_heads, layers = 4, 2, 2
    cfg = LlamaConfig(vocab_size=len(tokens), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=256,
                      tie_word_embeddings=True, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg).eval()
    w = GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_license("apache-2.0")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(32 // heads)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t.startswith("<") and t.endswith(">") else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    for i in range(layers):
        for hf, gg in LAYER_NAMES:
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    state = model.state_dict()
    for key, gg in names.items():
        t = state[key].numpy().astype(np.float32)
        if "q_proj" in key:
            t = _to_gguf_layout(t, heads)
        elif "k_proj" in key:
            t = _to_gguf_layout(t, kv_heads)
        w.add_tensor(gg, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model
