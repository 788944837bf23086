"""Trainable parameters of LoRA fine-tuning at the shapes of the paper's models and an 8B Llama.

Builds each model on the meta device from its config (no weights, no download), reserves the
pause and dk ids (M = 4), applies LoRA as ``cyb train`` does with ``lora.rank`` and the default
target modules, and prints a Markdown table.  Runs on a CPU in seconds::

    PYTHONPATH=src python benchmarks/lora_params.py [--rank 16]
"""

from __future__ import annotations

import argparse

import torch

SHAPES = {
    "Gemma1-2B": ("gemma", dict(vocab_size=256000, hidden_size=2048, intermediate_size=16384, num_hidden_layers=18,
                                num_attention_heads=8, num_key_value_heads=1, head_dim=256,
                                tie_word_embeddings=True)),
    "Gemma3-4B (text)": ("gemma3_text", dict(vocab_size=262208, hidden_size=2560, intermediate_size=10240,
                                             num_hidden_layers=34, num_attention_heads=8, num_key_value_heads=4,
                                             head_dim=256, tie_word_embeddings=True)),
    "Llama-3-8B": ("llama", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                 num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False)),
}


def main() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from cyb.model import lora
    from cyb.config import LoraConfig
    from cyb.model import PauseModel

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    print(f"| model | parameters | trainable with LoRA rank {args.rank} | share |")
    print("| --- | --- | --- | --- |")
    for name, (model_type, kw) in SHAPES.items():
        with torch.device("meta"):
            hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **kw), dtype=torch.bfloat16)
            model = PauseModel.from_hf(hf, num_steps=4)
            lora.apply_lora(model, LoraConfig(rank=args.rank))
        trainable, total = lora.parameter_counts(model)
        frozen = total - trainable
        print(f"| {name} | {frozen / 1e9:.2f} B | {trainable / 1e6:.1f} M | {100 * trainable / frozen:.2f}% |")


if __name__ == "__main__":
    main()
