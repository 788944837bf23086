"""What a finished text run costs to decode, through the engine, into RUN/decode.json.

    python experiments/text_decoding.py RUN [--prompts 64]

``cyb eval RUN --generate N``'s continuations (:mod:`cyb.eval.text_generation`): the first 128
tokens (at most half a row) of each of the first ``--prompts`` rows of the run's own held-out
data, continued by 64 tokens, greedily, through the engine: in fixed mode, and in adaptive mode
where the model has ``<don't know>`` (Recipe 2: a pause only after dk).  ``positions_per_token``
is that of the mode the model decodes in (adaptive with dk, else fixed: TBYS M, a baseline 1): the
network positions a token costs at inference.  Beside it, ``teacher_forced_mean_steps``: the E[S]
of the run's final held-out evaluation (the expected steps under the model's own stopping
distribution, where the engine counts its decisions).  No perplexity pass: training's final
evaluation scored these rows already.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def decode_cost(run: Path, prompts: int = 64) -> dict:
    """``decode.json``'s fields for ``run`` (see the module docstring)."""
    from cyb.eval import load_model, resolve_data, resolve_target
    from cyb.eval.text_generation import held_out_prompts, score_text_generation

    target = resolve_target(run)
    model = load_model(target)
    rows = resolve_data(target.config).batches(model.tokenizer, 8, trained_on=model.trained_on)
    g = score_text_generation(model, held_out_prompts(rows, prompts))
    mode = "adaptive" if "adaptive" in g else "fixed"
    final = run / "final_metrics.json"
    forced = json.loads(final.read_text()).get("mean_steps") if final.is_file() else None
    return {"mode": mode, "num_steps": model.num_steps, "prompts": g["prompts"], "new_tokens": g["new_tokens"],
            "positions_per_token": g[mode]["positions_per_token"], "teacher_forced_mean_steps": forced,
            "generation": g, "device": str(model.device)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a finished text run (config.yaml, final/)")
    p.add_argument("--prompts", type=int, default=64, help="held-out rows continued (default 64)")
    args = p.parse_args(argv)
    try:
        cost = decode_cost(args.run, args.prompts)
    except (FileNotFoundError, ValueError) as e:  # not a finished run, or no prompt: say so in one line
        p.error(str(e))
    (args.run / "decode.json").write_text(json.dumps(cost, indent=1) + "\n")
    forced = cost["teacher_forced_mean_steps"]
    print(f"{args.run.name}: {cost['positions_per_token']:.3f} positions per token ({cost['mode']} mode, "
          f"{cost['new_tokens']} tokens after each of {cost['prompts']} held-out rows)"
          + (f"; teacher-forced E[S] {forced:.3f}" if forced is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
