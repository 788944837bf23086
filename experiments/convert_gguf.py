"""Convert a GGUF causal LM to a plain model folder (safetensors, tokenizer), for machines where
only the GGUF file travels: ``python experiments/convert_gguf.py FILE.gguf OUT``."""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def main(path: str, out: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = Path(path)
    gguf = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, dtype=torch.float32)
    cfg = gguf.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    plain.load_state_dict(gguf.state_dict())
    plain.save_pretrained(out)
    AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name).save_pretrained(out)
    print(f"{out}: {sum(x.numel() for x in plain.parameters()) / 1e6:.1f} M parameters")


if __name__ == "__main__":
    main(*sys.argv[1:3])
