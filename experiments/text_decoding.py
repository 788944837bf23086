"""What a finished text run costs to decode, from the engine, into RUN/decode.json.

    python experiments/text_decoding.py RUN --data FILE [--prompts 64] [--prompt-tokens 128]
        [--new-tokens 64]

The first ``--prompts`` documents of ``--data`` (a held-out file) each give a prompt of their
first ``--prompt-tokens`` tokens (all but the last of a shorter document; no special token
added); the run's final model continues every prompt by ``--new-tokens`` tokens
(an end-of-sequence token does not stop it), greedily, through cyb's engine: in adaptive mode
where the model has ``<don't know>`` (Recipe 2: a pause only after dk), else in fixed mode (TBYS
reads out at step M and takes M steps a token, a baseline one).  ``positions_per_token`` is the
mean of the steps each new token used: the network positions a token costs at inference.  Beside
it, ``teacher_forced_mean_steps``: the E[S] of the run's final held-out evaluation (the expected
steps under the model's own stopping distribution, where the engine counts its decisions).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def prompt_ids(tokenizer, data: str, prompts: int, prompt_tokens: int) -> list[list[int]]:
    """Prompts from the first ``prompts`` documents of ``data`` of two tokens or more: each
    document's first ``prompt_tokens`` token ids (all but its last, where it holds no more)."""
    from cyb.data.sources import iter_texts
    from cyb.data.tokenizer import text_encoder

    encode = text_encoder(tokenizer)
    out: list[list[int]] = []
    for text in iter_texts(data):
        [ids] = encode([text])
        if len(ids) >= 2:
            out.append(list(ids[:min(prompt_tokens, len(ids) - 1)]))
            if len(out) == prompts:
                break
    if not out:
        raise ValueError(f"no document of {data} holds two tokens")
    return out


def decode_cost(run: Path, data: str, *, prompts: int = 64, prompt_tokens: int = 128, new_tokens: int = 64) -> dict:
    """``decode.json``'s fields for ``run`` (see the module docstring)."""
    from cyb.eval.evaluate import load_model, resolve_target
    from cyb.generation import generate

    model = load_model(resolve_target(run))
    mode = "adaptive" if model.vocab.dk_id is not None else "fixed"
    ids = prompt_ids(model.tokenizer, data, prompts, prompt_tokens)
    t0 = time.perf_counter()
    results = generate(model, ids, mode=mode, max_new_tokens=new_tokens, eos_token_ids=())
    seconds = time.perf_counter() - t0
    steps = [s for r in results for s in r.steps]
    final = run / "final_metrics.json"
    forced = json.loads(final.read_text()).get("mean_steps") if final.is_file() else None
    return {"mode": mode, "num_steps": model.num_steps, "pause_visibility": model.pause_visibility,
            "prompts": len(ids), "prompt_tokens": prompt_tokens, "new_tokens": len(steps),
            "positions_per_token": statistics.fmean(steps), "pauses_per_token": statistics.fmean(steps) - 1,
            "teacher_forced_mean_steps": forced, "seconds": seconds, "device": str(model.device), "data": str(data)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a finished text run (config.yaml, final/)")
    p.add_argument("--data", required=True, help="the held-out file whose documents give the prompts")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    args = p.parse_args(argv)
    try:
        cost = decode_cost(args.run, args.data, prompts=args.prompts, prompt_tokens=args.prompt_tokens,
                           new_tokens=args.new_tokens)
    except (FileNotFoundError, ValueError) as e:  # not a finished run, or no prompt: say so in one line
        p.error(str(e))
    (args.run / "decode.json").write_text(json.dumps(cost, indent=1) + "\n")
    forced = cost["teacher_forced_mean_steps"]
    print(f"{args.run.name}: {cost['positions_per_token']:.3f} positions per token ({cost['mode']} mode, "
          f"{cost['new_tokens']} tokens of {cost['prompts']} prompts)"
          + (f"; teacher-forced E[S] {forced:.3f}" if forced is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
