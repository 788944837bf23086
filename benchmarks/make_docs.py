"""Render the tables of the benchmarks record (docs/record/benchmarks/) from the JSON results in
``results/benchmarks/`` into one Markdown file, whose sections go into the record's pages by hand
(the pages also hold readings and history that this script does not write).

Every ``*.json`` written by ``cyb bench loss|train|decode`` 
becomes a section: the device and versions, the command that produced it, its table and, for
the training and decode benchmarks, each target marked met or missed with its ratio.

    python benchmarks/make_docs.py --out /tmp/b.md                   # results/benchmarks/
    python benchmarks/make_docs.py --results DIR --out FILE.md
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("cyb") is None:  # a source checkout without an install
    sys.path.insert(0, str(ROOT / "src"))

from cyb.bench.flops import FORMULA  # noqa: E402
from cyb.bench.markdown import table_for  # noqa: E402
from cyb.bench.targets import result_kind, targets_for  # noqa: E402

TITLES = {"train": "Training step", "decode": "Decoding", "loss": "Readout + loss (forward and backward)"}
ORDER = ("train", "decode", "loss")
NOTES = {
    "train": [
        "One optimiser step (forward, backward, fused AdamW) per row; median of the timed steps "
        "(CUDA events) after untimed warm-up steps (compiled rows: their warm-up compiles).",
        "`real tok/s` counts real tokens (B x L); `positions/s` counts every position the "
        "decoder runs (pauses included).",
        f"FLOPs per step: {FORMULA}.",
        "Peak memory: `torch.cuda.max_memory_allocated` over the timed steps (parameters, "
        "gradients, optimiser state and activations).",
        "`kernel ms`: the GPU's kernel time per step (two more steps under the torch profiler; "
        "`-` in results from before it was measured): unlike the step time, it does not move with "
        "the speed of the host.",
        "`first loss`: the loss of each variant's first step, from the same weights and batch, "
        "so that two implementations of one loss can be compared.",
        "Variants: `baseline_hf` no pauses, the Hugging Face loss; `tbys_hf` TBYS with the "
        "Hugging Face loss (labels only at the last step of each block, full logits); "
        "`tbys_liger` TBYS with Liger-Kernel's fused linear cross-entropy on the last-step "
        "hidden states; `cyb_naive` / `cyb_fused` the CYB loss as `cyb train` computes it (full "
        "logits / fused readout).",
    ],
    "decode": [
        "Per step: every decoding row feeds one position (`engine_one`: its token, or its next "
        "pause after a dk) or its whole block (`engine_block`, `static_batches`, the eager "
        "block decoder; adaptive rows keep the steps up to their stop). Decisions are read back "
        "to the host at every step; host clock. `ms / real token` = time per real token of a "
        "row; `positions / token` = positions fed per real token; `steps / token` = steps the "
        "readout took per real token (E[S] realised).",
        "`hf_eager`: plain Hugging Face loop with a DynamicCache; `eager` / `eager_pos`: the "
        "eager decoders (`cyb.generation.decoders`, DynamicCache; whole blocks / one position); "
        "`static_batches`: the previous release's static batch, each step a CUDA graph "
        "(`cyb.bench.static_batches`); `engine_one` / `engine_block`: the engine (`cyb.engine`), "
        "each step a CUDA graph.",
        "Adaptive rows run a CYB model whose dk prior is set so that a given share of the "
        "prompts' step-1 decisions say dk (`dk share`; the run's `adaptive_fixture`).",
    ],
    "loss": [
        "Forward + backward of the readout and loss alone on random hidden states; `GiB` is the "
        "peak memory beyond the inputs.  Methods: see `cyb.bench.loss`.",
    ],
}


def load_results(folder: Path) -> list[tuple[Path, dict]]:
    """``(path, result)`` of every benchmark JSON in ``folder``, by kind then file name."""
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            print(f"skipping {path}: {e}", file=sys.stderr)
            continue
        if isinstance(data, dict) and result_kind(data) in ORDER:
            found.append((path, data))
        else:
            print(f"skipping {path}: not a benchmark result", file=sys.stderr)
    return sorted(found, key=lambda pr: (ORDER.index(result_kind(pr[1])), pr[0].name))


def _device(result: dict) -> str:
    env = result.get("env", {})
    name = env.get("device_name") or env.get("gpu") or env.get("device") or "unknown device"
    versions = ", ".join(f"{k} {env[k]}" for k in ("torch", "transformers", "triton", "liger_kernel")
                         if env.get(k))
    return f"{name}" + (f" ({versions})" if versions else "")


def _command(result: dict) -> str:
    if result.get("command"):
        return result["command"]
    argv = result.get("env", {}).get("argv") or []
    return "python " + " ".join(argv) if argv else "(not recorded)"


def _setup(result: dict) -> str | None:
    """One line on the model and the sizes of a train or decode result."""
    cfg = result.get("config", {})
    shape = cfg.get("shape")
    if not shape:
        return None
    tie = "tied" if shape.get("tie_embeddings") else "untied"
    text = (f"Llama, hidden {shape['hidden']}, {shape['layers']} layers, {shape['heads']} heads, "
            f"MLP {shape['intermediate']}, {tie} embeddings")
    params = result.get("models") or {}
    if params:
        text += "; parameters: " + ", ".join(f"{int(p['parameters']) / 1e6:.1f} M at V={v}"
                                             for v, p in params.items())
    if result_kind(result) == "train":
        text += (f"; {cfg.get('real_tokens')} real tokens per row, M = {cfg.get('num_steps')}, "
                 f"precision {cfg.get('precision')}, {cfg.get('repeats')} timed steps per row")
    else:
        text += (f"; V = {cfg.get('vocab')}, M = {cfg.get('num_steps')}, {cfg.get('dtype')}, "
                 f"prompt {cfg.get('prompt_len')} real tokens, {cfg.get('new_tokens')} timed steps")
    return text


def _targets_block(checks: list[dict]) -> list[str]:
    if not checks:
        return []
    lines = ["", "| target | value | needed | status |", "|---|---|---|---|"]
    for c in checks:
        v = c["value"]
        shown = f"{v:.3g}" if isinstance(v, float) else ("-" if v is None else str(v))
        status = {True: "**met**", False: "**missed**", None: "n/a"}[c["met"]]
        if c.get("note"):
            status += f" ({c['note']})"
        lines.append(f"| {c['target']} | {shown} | {c['op']} {c['threshold']} | {status} |")
    return lines


def section(path: Path, result: dict) -> list[str]:
    """The Markdown lines of one result file."""
    kind = result_kind(result)
    out = [f"## {TITLES[kind]}: `{path.name}`", "",
           f"- Device: {_device(result)}",
           f"- Command: `{_command(result)}`"]
    setup = _setup(result)
    if setup:
        out.append(f"- Setup: {setup}")
    when = result.get("env", {}).get("time_utc")
    if when:
        out.append(f"- Run: {when}")
    out += ["", table_for(result)]
    out += _targets_block(targets_for(result))
    fixture = result.get("adaptive_fixture")
    if kind == "decode" and isinstance(fixture, dict):
        out += ["", f"Adaptive fixture: dk prior psi_dk = {fixture['psi_dk']:.3g} (dk logit bias "
                f"{fixture['dk_bias']:.2f}), {fixture['step1_dk_fraction_on_prompts']:.0%} of the "
                "prompts' step-1 decisions say dk."]
    out += [""] + [f"- {n}" for n in NOTES[kind]] + [""]
    return out


def render(results: list[tuple[Path, dict]], folder: Path) -> str:
    lines = ["# Benchmarks", "",
             f"Generated by `python benchmarks/make_docs.py` from the JSON files in "
             f"`{_rel(folder)}`; do not edit by hand.  Each file comes from one run on the device "
             "named in its section; ratios in the target tables are within that run.", ""]
    if not results:
        lines += ["No results yet: run `bash benchmarks/run_gpu.sh` on a GPU machine and copy the "
                  "JSON files here.", ""]
    for path, result in results:
        lines += section(path, result)
    return "\n".join(lines).rstrip() + "\n"


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=ROOT / "results" / "benchmarks",
                   help="folder of JSON results")
    p.add_argument("--out", type=Path, required=True, help="Markdown file to write")
    args = p.parse_args(argv)
    if not args.results.is_dir():
        print(f"make_docs: no results folder {args.results}", file=sys.stderr)
        return 2
    text = render(load_results(args.results), args.results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
