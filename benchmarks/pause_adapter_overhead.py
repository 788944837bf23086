"""What pause-step adapters cost per forward: the same Llama-shaped pause model (M = 4) with and
without them (``cyb.model.pause_adapters``), one forward of ``rows x positions`` real tokens (each
followed by its 3 pauses, where the adapters act), timed as the median of ``--repeats`` after a
warm-up, under ``torch.no_grad`` (as decoding runs it).

    python benchmarks/pause_adapter_overhead.py                       # SmolLM2-135M's shape, rank 16
    python benchmarks/pause_adapter_overhead.py --device cpu --hidden 32 --layers 2 --rows 64 --positions 8

Every adapted projection computes its low-rank product at every position and masks it to the
pauses, so what a decoding step pays for the adapters is these extra products and their
kernels, whether its positions are pauses or not.  Prints one JSON line: milliseconds without
and with the adapters, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import transformers


def model(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int, dtype, device):
    from cyb.data.synthetic import CharTokenizer
    from cyb.model import PauseModel

    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                                   num_hidden_layers=layers, num_attention_heads=heads,
                                   num_key_value_heads=kv_heads, max_position_embeddings=2048,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    pm = PauseModel.from_config(cfg, CharTokenizer().to_hf(), num_steps=4, use_dk=True, psi_dk=0.9)
    return pm.to(device=device, dtype=dtype).eval()


def forward_ms(pm, ids: torch.Tensor, repeats: int) -> float:
    """Median milliseconds of one forward of ``ids`` (after three untimed ones)."""
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    times = []
    with torch.no_grad():
        for i in range(repeats + 3):
            sync()
            t = time.perf_counter()
            pm(ids, return_logits=False)
            sync()
            if i >= 3:
                times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--vocab", type=int, default=49152, help="rows of the embedding and readout")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--positions", type=int, default=1)
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args()
    from cyb.model import pause_adapters

    dtype = getattr(torch, args.dtype)
    pm = model(args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate, args.vocab, dtype, args.device)
    ids = torch.randint(3, 20, (args.rows, args.positions), device=args.device)
    without = forward_ms(pm, ids, args.repeats)
    pause_adapters.add_pause_adapters(pm, pause_adapters.PauseAdapterSpec(rank=args.rank, alpha=2.0 * args.rank))
    pm.to(args.device)
    with_adapters = forward_ms(pm, ids, args.repeats)
    print(json.dumps({"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                      "dtype": args.dtype, "rows": args.rows, "positions": args.positions, "rank": args.rank,
                      "layers": args.layers, "hidden": args.hidden, "ms_without": round(without, 3),
                      "ms_with": round(with_adapters, 3), "ratio": round(with_adapters / without, 3)}))


if __name__ == "__main__":
    main()
