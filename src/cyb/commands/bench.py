"""``cyb bench loss|train|decode|memory|serve [--quick] [--out FILE] [...]``."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from . import HelpFormatter

HELP = "benchmark the loss, a training step, decoding, training memory or the server under load (JSON results and a table)"
#: output paths checked before the command runs (:func:`cyb.files.unwritable`)
OUTPUTS = {"out": ("--out", "file"), "markdown": ("--markdown", "file")}

_FMT = HelpFormatter
# Help texts that explain their own default end with this: it renders as nothing, and its
# presence stops the "(default: None)" suffix of ArgumentDefaultsHelpFormatter.
_OWN_DEFAULT = "%(default).0s"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="tiny shapes on the CPU: a smoke run of every code path (numbers mean nothing)")
    p.add_argument("--out", default=None, metavar="FILE.json", help="write the results here as JSON")
    p.add_argument("--device", default=None,
                   help="cuda or cpu (default: cuda when available; cpu with --quick)" + _OWN_DEFAULT)


def _case(text: str) -> tuple[int, int]:
    try:
        v, b = text.split(":")
        return int(v), int(b)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected VOCAB:BATCH (e.g. 32768:4), got {text!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="bench", metavar="WHAT")

    from ..bench.loss import CPU_SIZES, GPU_SIZES, METHODS

    def sizes(key):
        gpu, cpu = GPU_SIZES[key], CPU_SIZES[key]
        show = lambda v: " ".join(map(str, v)) if isinstance(v, tuple) else str(v)  # noqa: E731
        return f" (default: {show(gpu)} on CUDA, {show(cpu)} on the CPU)" + _OWN_DEFAULT

    loss = sub.add_parser("loss", formatter_class=_FMT,
                          help="readout + loss forward/backward: naive vs fused, plain CE, Liger",
                          description="Forward + backward time and peak extra memory of the readout "
                                      "and loss alone (see cyb.bench.loss). The default sizes are a GPU "
                                      "grid on CUDA and a small grid on the CPU.")
    _common(loss)
    loss.add_argument("--vocab", type=int, nargs="+", help="vocabulary sizes" + sizes("vocab"))
    loss.add_argument("--positions", type=int, nargs="+", help="positions N" + sizes("positions"))
    loss.add_argument("--methods", nargs="+", choices=METHODS, metavar="METHOD",
                      help=f"methods: {' '.join(METHODS)} (default: all)" + _OWN_DEFAULT)
    loss.add_argument("--hidden", type=int, help="hidden size H" + sizes("hidden"))
    loss.add_argument("--num-steps", type=int, help="M, rows per block (default 4)" + _OWN_DEFAULT)
    loss.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="parameter dtype" + sizes("dtype"))
    loss.add_argument("--repeats", type=int, help="timed runs per row" + sizes("repeats"))
    loss.add_argument("--chunk-blocks", type=int, help="fused_linear_loss chunk_blocks" + _OWN_DEFAULT)
    loss.add_argument("--skip-check", action="store_true", help="skip the fused == naive check")

    train = sub.add_parser("train", formatter_class=_FMT,
                           help="one optimiser step: baseline, TBYS (HF loss / Liger), CYB naive/fused, "
                                "shared / private / gated pauses",
                           description="Training-step time, the GPU's kernel time per step, tokens/s, "
                                       "MFU and peak memory of each method and pause layout on a Llama of "
                                       "the 134 M shape or SmolLM2-135M's (see cyb.bench.train_step).")
    _common(train)
    train.add_argument("--case", dest="cases", type=_case, action="append", metavar="VOCAB:BATCH",
                       help="a (vocabulary, batch) case, repeatable (default: 32768:4 262144:8)"
                       + _OWN_DEFAULT)
    train.add_argument("--variants", nargs="+", help="baseline_hf tbys_hf tbys_liger cyb_naive cyb_fused "
                       "cyb_fused_lowmem cyb_private tbys_private cyb_private_split cyb_gated cyb_gated_dense "
                       "cyb_gated_flex cyb_gated_split (default: all)" + _OWN_DEFAULT)
    train.add_argument("--shape", choices=("134m", "smollm2"),
                       help="the Llama's shape: 134m (hidden 768, 12 layers) or smollm2 (SmolLM2-135M: "
                       "hidden 576, 30 layers, 9 heads on 3 key/value heads, tied embeddings) "
                       "(default: 134m)" + _OWN_DEFAULT)
    train.add_argument("--modes", nargs="+", help="eager and/or compile (default: both; eager "
                       "only with --quick)" + _OWN_DEFAULT)
    train.add_argument("--precision", help="bf16 (bf16 parameters), autocast (fp32 parameters "
                       "under bf16 autocast, as cyb train by default) or fp32 (default: bf16)"
                       + _OWN_DEFAULT)
    train.add_argument("--real-tokens", type=int, help="real tokens per row (default 2048)" + _OWN_DEFAULT)
    train.add_argument("--num-steps", type=int, help="M (default 4)" + _OWN_DEFAULT)
    train.add_argument("--repeats", type=int, help="timed steps per row (default 5)" + _OWN_DEFAULT)
    train.add_argument("--warmup", type=int, help="untimed steps per eager row (default 2)" + _OWN_DEFAULT)
    train.add_argument("--compile-warmup", type=int,
                       help="untimed steps per compiled row (default 3)" + _OWN_DEFAULT)
    train.add_argument("--budget-s", type=float,
                       help="skip rows that would start after this many seconds" + _OWN_DEFAULT)

    decode = sub.add_parser("decode", formatter_class=_FMT,
                            help="what a real token costs against batch: the engine (one position per "
                                 "row, or whole blocks), the eager decoders, the previous static batches, "
                                 "M = 1 vs M = 4, fixed and adaptive mode, shared / private / gated pauses",
                            description="Per-real-token decode time of every decoder and layout against "
                                        "batch, with the positions and steps per token; the float32 "
                                        "engine = eager check; an offline job of prompts of mixed lengths "
                                        "(--offline N) through the engine against static batches of the same "
                                        "memory; lm-eval loglikelihood scoring (see cyb.bench.decode).")
    _common(decode)
    decode.add_argument("--batches", type=int, nargs="+", help="batch sizes (default 1 32 256)" + _OWN_DEFAULT)
    decode.add_argument("--num-steps", type=int, help="M of the pause models (default 4)" + _OWN_DEFAULT)
    decode.add_argument("--vocab", type=int, help="vocabulary size (default 32768)" + _OWN_DEFAULT)
    decode.add_argument("--prompt-len", type=int, help="real prompt tokens (default 128)" + _OWN_DEFAULT)
    decode.add_argument("--new-tokens", type=int, help="timed decode steps (default 64)" + _OWN_DEFAULT)
    decode.add_argument("--warmup-steps", type=int,
                        help="untimed decode steps before them (default 4)" + _OWN_DEFAULT)
    decode.add_argument("--impls", nargs="+", help="hf_eager eager eager_pos static_batches engine_one "
                                                   "engine_block (default: all)" + _OWN_DEFAULT)
    decode.add_argument("--dtype", help="bf16, fp16 or fp32 (default bf16)" + _OWN_DEFAULT)
    decode.add_argument("--modes", nargs="+", help="fixed adaptive (default: both)" + _OWN_DEFAULT)
    decode.add_argument("--pause-fraction", dest="pause_fractions", type=float, nargs="+",
                        help="adaptive rows: shares of step-1 decisions that say dk, set through the "
                             "dk prior (default 0.1 0.5)" + _OWN_DEFAULT)
    decode.add_argument("--visibility", dest="visibilities", nargs="+", choices=("shared", "private", "gated"),
                        help="pause visibilities of the random models (default shared; docs/concepts/layouts.md)"
                             + _OWN_DEFAULT)
    decode.add_argument("--offline", type=int, metavar="N",
                        help="an offline job of N prompts of mixed lengths (adaptive mode) through the "
                             "engine and through static batches of the same memory (default 0: none)"
                             + _OWN_DEFAULT)
    decode.add_argument("--offline-batch", type=int, metavar="B",
                        help="the static batch of the offline job, which sets its memory (default 256)"
                             + _OWN_DEFAULT)
    decode.add_argument("--budget-s", type=float,
                        help="skip rows that would start after this many seconds" + _OWN_DEFAULT)
    decode.add_argument("--model", metavar="MODEL_OR_RUN",
                        help="time a saved pause model, or the final/ model of a run folder (its M, "
                             "vocabulary, visibility and dk decisions) instead of the random one; the "
                             "float32 check, offline job and loglikelihood rows are skipped (without it: "
                             "the random 134M model)")
    decode.add_argument("--prompts", metavar="FILE",
                        help="with --model: prompts, one per line (without it: random ids)")

    from ..bench.memory import CONFIGS, GPU_SHAPES, SHAPES

    mem = sub.add_parser("memory", formatter_class=_FMT,
                         help="peak GPU memory and tokens/s of fine-tuning 2-8 B shapes, full or LoRA, "
                              "with or without gradient checkpointing, beside cyb.memory_estimate's estimate",
                         description="Each (shape, configuration) runs a few optimiser steps of "
                                     "cyb train (CYB, M = 4, 2048 real tokens, micro-batch 1, bf16) in "
                                     "a fresh process on random weights, and records the peak memory "
                                     "(allocated and reserved), real tokens/s and the estimate that "
                                     "cyb train checks; a run out of memory is recorded as oom (see "
                                     "cyb.bench.memory). Split the grid over GPUs with --shapes / "
                                     "--configs and CUDA_VISIBLE_DEVICES (benchmarks/memory_plan.sh).")
    mem.add_argument("--quick", action="store_true",
                     help="the tiny shape on the CPU, one warm-up and one timed step (a smoke run)")
    mem.add_argument("--out", default=None, metavar="FILE.jsonl",
                     help="write one JSON line per configuration here")
    mem.add_argument("--markdown", default=None, metavar="FILE.md", help="write the Markdown table here")
    mem.add_argument("--device", default=None,
                     help="cuda or cpu (default: cuda when available; cpu with --quick)" + _OWN_DEFAULT)
    mem.add_argument("--shapes", nargs="+", choices=tuple(SHAPES), metavar="SHAPE",
                     help=f"model shapes: {' '.join(SHAPES)} (default: {' '.join(GPU_SHAPES)})" + _OWN_DEFAULT)
    mem.add_argument("--configs", nargs="+", choices=tuple(CONFIGS), metavar="CONFIG",
                     help=f"configurations: {' '.join(CONFIGS)} (default: all)" + _OWN_DEFAULT)
    mem.add_argument("--real-tokens", type=int, help="real tokens per row (default 2048)" + _OWN_DEFAULT)
    mem.add_argument("--num-steps", type=int, help="M (default 4)" + _OWN_DEFAULT)
    mem.add_argument("--micro-batch", type=int, help="rows per micro-batch (default 1)" + _OWN_DEFAULT)
    mem.add_argument("--warmup", type=int, help="untimed optimiser steps (default 3)" + _OWN_DEFAULT)
    mem.add_argument("--steps", type=int, help="timed optimiser steps (default 3)" + _OWN_DEFAULT)
    mem.add_argument("--timeout-s", type=float,
                     help="limit per configuration in seconds (default 300)" + _OWN_DEFAULT)
    mem.add_argument("--from", dest="from_jsonl", default=None, metavar="FILE.jsonl",
                     help="measure nothing: read the rows of an earlier run (with --markdown / --fill-doc)")
    mem.add_argument("--fill-doc", default=None, metavar="DOC.md",
                     help="put the table between the <!-- table:memory --> and <!-- end table --> "
                          "markers of this file (docs/record/benchmarks/memory.md)")
    mem.add_argument("--set", dest="extra", action="append", metavar="KEY=VALUE",
                     help="a further configuration override for every row, e.g. --set "
                          "train.loss_impl=naive" + _OWN_DEFAULT)


    from ..bench.serve import ARRIVALS, CASES, SERVERS

    srv = sub.add_parser("serve", formatter_class=_FMT,
                         help="cyb serve under load (concurrency 1 to 256, closed-loop or Poisson arrivals): "
                              "throughput, time to first token and inter-token latency, against the engine offline "
                              "and generate() in static batches on the same prompts",
                         description="Each case (no pauses; shared or private pauses in fixed or adaptive mode) "
                                     "runs cyb serve in a child process and a streaming load client here; then the "
                                     "same prompts through the engine offline and generate() in static batches, "
                                     "and a ceiling of the engine from its steady step and prefill rate "
                                     "(see cyb.bench.serve).")
    _common(srv)
    srv.add_argument("--cases", nargs="+", choices=CASES, metavar="CASE",
                     help=f"cases: {' '.join(CASES)} (default: all)" + _OWN_DEFAULT)
    srv.add_argument("--concurrency", type=int, nargs="+", metavar="C",
                     help="requests in flight (default 1 16 64 256; 1 4 with --quick)" + _OWN_DEFAULT)
    srv.add_argument("--requests", type=int, metavar="N",
                     help="requests per concurrency (default max(2 C, 8))" + _OWN_DEFAULT)
    srv.add_argument("--arrivals", choices=ARRIVALS, default=None,
                     help="closed: C clients, each sending its next request when the last ends; poisson: "
                          "arrivals at --rate per second, at most C in flight (default closed)" + _OWN_DEFAULT)
    srv.add_argument("--rate", type=float, metavar="R", help="Poisson arrivals: requests per second")
    srv.add_argument("--prompt-lengths", type=int, nargs=2, metavar=("LO", "HI"),
                     help="prompt tokens, uniform in [LO, HI] (default 16 512)" + _OWN_DEFAULT)
    srv.add_argument("--answer-lengths", type=int, nargs=2, metavar=("LO", "HI"),
                     help="new tokens per request, uniform in [LO, HI] (default 8 256)" + _OWN_DEFAULT)
    srv.add_argument("--pause-fraction", type=float, metavar="P",
                     help="adaptive cases: share of step-1 decisions that say dk (default 0.1)" + _OWN_DEFAULT)
    srv.add_argument("--num-steps", type=int, help="M of the pause models (default 4)" + _OWN_DEFAULT)
    srv.add_argument("--vocab", type=int, help="vocabulary size (default 32768)" + _OWN_DEFAULT)
    srv.add_argument("--dtype", help="bf16, fp16 or fp32 (default bf16)" + _OWN_DEFAULT)
    srv.add_argument("--server", choices=SERVERS, default=None,
                     help="process: cyb serve in a child process; thread: in a thread of this process "
                          "(default process; thread with --quick)" + _OWN_DEFAULT)
    srv.add_argument("--http-processes", type=int, metavar="N",
                     help="cyb serve --http-processes: HTTP processes in front of the engine's process "
                          "(--server process; default: cyb serve's)" + _OWN_DEFAULT)
    srv.add_argument("--client-processes", type=int, metavar="N",
                     help="processes the load client runs in (default: one per 32 streams, at most 8)"
                          + _OWN_DEFAULT)
    srv.add_argument("--no-offline", dest="offline", action="store_false", default=None,
                     help="skip the engine offline on the same prompts")
    srv.add_argument("--no-static", dest="static", action="store_false", default=None,
                     help="skip generate() in static batches")
    srv.add_argument("--no-ceiling", dest="ceiling", action="store_false", default=None,
                     help="skip the ceiling (the engine's steady step and prefill rate with C rows)")
    srv.add_argument("--model", metavar="MODEL_OR_RUN",
                     help="serve a saved pause model (its visibility's cases) instead of the random ones")
    srv.add_argument("--seed", type=int, help="seed of the prompts and answer lengths (default 0)" + _OWN_DEFAULT)
    srv.add_argument("--budget-s", type=float,
                     help="skip rows that would start after this many seconds" + _OWN_DEFAULT)

def _command(args) -> str:
    """The command line that made the results (from sys.argv when run from a shell)."""
    if sys.argv[1:3] == ["bench", args.bench]:
        return "cyb " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    parts = ["cyb", "bench", args.bench]
    for key, value in sorted(vars(args).items()):
        if key in ("command", "bench") or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif key == "extra":
            parts += [x for v in value for x in ("--set", v)]
        elif key == "cases":
            parts += [x for v, b in value for x in ("--case", f"{v}:{b}")]
        elif isinstance(value, (list, tuple)):
            parts += [flag, *map(str, value)]
        else:
            parts += [flag, str(value)]
    return " ".join(shlex.quote(p) for p in parts)


def _given(args, names: dict) -> dict:
    """Config fields for the options given on the command line (``names``: option -> field)."""
    out = {}
    for opt, fieldname in names.items():
        value = getattr(args, opt, None)
        if value is not None:
            out[fieldname] = tuple(value) if isinstance(value, list) and fieldname != "cases" else value
    return out


def run(args) -> int:
    if args.bench is None:
        print("cyb bench: error: choose what to benchmark: loss, train, decode, memory or serve (see cyb bench --help)",
              file=sys.stderr)
        return 2
    from ..bench.markdown import table_for
    from ..bench.targets import format_check, targets_for
    from ..bench.timing import write_json

    command = _command(args)
    if args.bench == "memory":
        return _run_memory(args, command)
    if args.bench == "serve":
        return _run_serve(args, command)
    if args.bench == "loss":
        from ..bench import loss

        kw = _given(args, {"vocab": "vocab", "positions": "positions", "methods": "methods", "hidden": "hidden",
                           "num_steps": "num_steps", "dtype": "dtype", "repeats": "repeats",
                           "chunk_blocks": "chunk_blocks", "skip_check": "skip_check", "device": "device"})
        cfg = loss.LossBenchConfig.quick(**kw) if args.quick else loss.LossBenchConfig(**kw)
        result = loss.run(cfg, out=args.out)
    elif args.bench == "train":
        from ..bench import train_step

        kw = _given(args, {"cases": "cases", "variants": "variants", "modes": "modes",
                           "precision": "precision", "real_tokens": "real_tokens",
                           "num_steps": "num_steps", "repeats": "repeats", "warmup": "warmup",
                           "compile_warmup": "compile_warmup", "budget_s": "budget_s",
                           "device": "device"})
        if args.shape is not None:
            from ..bench.models import TRAIN_SHAPES

            kw["shape"] = TRAIN_SHAPES[args.shape]
        cfg = (train_step.TrainBenchConfig.quick(**kw) if args.quick
               else train_step.TrainBenchConfig(**kw))
        result = train_step.run(cfg, out=args.out)
    else:
        from ..bench import decode

        kw = _given(args, {"batches": "batches", "num_steps": "num_steps", "vocab": "vocab",
                           "prompt_len": "prompt_len", "new_tokens": "new_tokens", "warmup_steps": "warmup_steps",
                           "impls": "impls", "dtype": "dtype", "budget_s": "budget_s",
                           "device": "device", "modes": "modes", "pause_fractions": "pause_fractions",
                           "model": "model", "prompts": "prompts", "visibilities": "visibilities",
                           "offline": "offline", "offline_batch": "offline_batch"})
        cfg = decode.DecodeBenchConfig.quick(**kw) if args.quick else decode.DecodeBenchConfig(**kw)
        result = decode.run(cfg, out=args.out)
    result["command"] = command
    checks = targets_for(result)
    if checks:
        result["targets"] = checks
    write_json(args.out, result)
    print()
    print(table_for(result))
    for c in checks:
        print(format_check(c))
    if args.out:
        print(f"\nwrote {args.out}")
    return 0


def _run_memory(args, command: str) -> int:
    from ..bench import memory

    kw = _given(args, {"shapes": "shapes", "configs": "configs", "real_tokens": "real_tokens",
                       "num_steps": "num_steps", "micro_batch": "micro_batch", "warmup": "warmup",
                       "steps": "steps", "timeout_s": "timeout_s", "extra": "extra", "device": "device"})
    cfg = memory.MemoryBenchConfig.quick_config(**kw) if args.quick else memory.MemoryBenchConfig(**kw)
    try:
        cfg.validate()
    except ValueError as e:
        print(f"cyb bench memory: error: {e}", file=sys.stderr)
        return 2
    if args.from_jsonl:
        rows = memory.read_rows(args.from_jsonl)
        if args.markdown:
            Path(args.markdown).write_text(memory.memory_markdown(rows) + "\n")
    else:
        print(f"# {command}")
        rows = memory.run(cfg, out=args.out, markdown=args.markdown)["results"]
        print()
    print(memory.memory_table(rows))
    if args.fill_doc:
        memory.fill_doc(args.fill_doc, memory.memory_markdown(rows))
    for path in (None if args.from_jsonl else args.out, args.markdown, args.fill_doc):
        if path:
            print(f"wrote {path}")
    return 0


def _run_serve(args, command: str) -> int:
    from ..bench import serve
    from ..bench.targets import format_check
    from ..bench.timing import write_json

    kw = _given(args, {"cases": "cases", "concurrency": "concurrency", "requests": "requests",
                       "arrivals": "arrivals", "rate": "rate", "prompt_lengths": "prompt_lengths",
                       "answer_lengths": "answer_lengths", "pause_fraction": "pause_fraction",
                       "num_steps": "num_steps", "vocab": "vocab", "dtype": "dtype", "server": "server",
                       "offline": "offline", "static": "static", "ceiling": "ceiling", "model": "model", "seed": "seed",
                       "client_processes": "client_processes", "http_processes": "http_processes",
                       "budget_s": "budget_s", "device": "device"})
    cfg = serve.ServeBenchConfig.quick(**kw) if args.quick else serve.ServeBenchConfig(**kw)
    try:
        cfg.validate()
    except ValueError as e:
        print(f"cyb bench serve: error: {e}", file=sys.stderr)
        return 2
    print(f"# {command}")
    result = serve.run(cfg, out=args.out)
    result["command"] = command
    write_json(args.out, result)
    print()
    print(serve.serve_table(result))
    for c in result["targets"]:
        print(format_check(c))
    if args.out:
        print(f"\nwrote {args.out}")
    return 0
