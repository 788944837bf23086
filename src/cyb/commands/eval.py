"""``cyb eval RUN_OR_MODEL [--data SOURCE] [--tokens N] [--batch-size B] [--out DIR] [--reference X]``."""

from __future__ import annotations

import argparse
import shlex
import sys

HELP = ("evaluate a run or saved model on held-out data: perplexity, latency, calibration, "
        "pause statistics and shaded text")
#: output paths checked before the command runs (:func:`cyb.files.unwritable`)
OUTPUTS = {"out": ("--out", "folder")}


# Help texts that explain their own default end with this: it renders as nothing, and its
# presence stops the "(default: None)" suffix of ArgumentDefaultsHelpFormatter.
_OWN_DEFAULT = "%(default).0s"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="RUN_OR_MODEL",
                   help="a run folder written by cyb train (uses final/ and config.yaml), one of its checkpoints (ckpt-N: "
                        "the model of step N, on the run's held-out data) or a saved cyb model folder; "
                        "a plain model folder, a .gguf file or a known model's name (smollm2-135m) is evaluated "
                        "as a no-pause baseline (give --data)")
    p.add_argument("--data", default=None, metavar="SOURCE",
                   help="held-out data: a text source (file, folder, glob, hf:NAME), of which every token of every "
                        "document is scored, however short, or task:NAME; default: the run's own held-out split "
                        "(in the blocks its training evaluated) or synthetic test set" + _OWN_DEFAULT)
    p.add_argument("--tokens", type=int, default=None, metavar="N",
                   help="evaluate about N real tokens (whole batches; 0 = all the data); default: for a "
                        "run on its own held-out data, exactly the rows its training evaluated "
                        "(train.eval_batches x train.batch_size, all when 0), so both perplexities "
                        "agree; else 100,000" + _OWN_DEFAULT)
    p.add_argument("--batch-size", type=int, default=None, metavar="B",
                   help="rows per forward pass (default: the run's micro-batch, else 8)" + _OWN_DEFAULT)
    p.add_argument("--block-len", type=int, default=None, metavar="L",
                   help="real tokens per text row (default: the run's data.block_len, else 256); with --data the "
                        "rows overlap by one token and the last is padded" + _OWN_DEFAULT)
    p.add_argument("--out", default=None, metavar="DIR", help="output folder (default: RUN_OR_MODEL/eval)" + _OWN_DEFAULT)
    p.add_argument("--reference", default=None, metavar="RUN_OR_METRICS_JSON",
                   help="reference for the relative improvement: a run/model folder (evaluated on the same "
                        "data) or a metrics.json / final_metrics.json" + _OWN_DEFAULT)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                   help="auto = bf16 autocast on CUDA, float32 on CPU (as in training)")
    p.add_argument("--dtype", default=None, choices=("auto", "float32", "bfloat16", "float16"),
                   help="parameter dtype (default: the run's model.dtype)" + _OWN_DEFAULT)
    p.add_argument("--impl", default="auto", choices=("auto", "fused", "naive"),
                   help="readout: fused (no full logits; default on CUDA) or naive")
    p.add_argument("--passages", type=int, default=3, help="passages in shaded.html")
    p.add_argument("--passage-tokens", type=int, default=200, help="tokens per shaded passage")
    p.add_argument("--min-count", type=int, default=5,
                   help="pause statistics: token strings seen at least this often")
    p.add_argument("--top-k", type=int, default=15, help="pause statistics: tokens listed per cell")
    p.add_argument("--attribution", default="input", choices=("input", "target"),
                   help="pause statistics: count a block's pauses for the token after which they come "
                        "(input, Table 2) or for the token it predicts (target, as the shaded text)")
    p.add_argument("--generate", type=int, default=0, metavar="N",
                   help="a task run: also generate the answers to the first N held-out prompts, "
                        "free-running, in fixed and adaptive mode, and report their exact match "
                        "and positions per token; text: continue the first 128 tokens (at most half) "
                        "of the first N held-out rows by 64 tokens in both modes and report the "
                        "positions per token (default: 0, the teacher-forced readout only)")
    p.add_argument("--answer-mode", default="adaptive", choices=("adaptive", "fixed"),
                   help="a reasoning-gym task run (data.task: reasoning-gym:NAME): generate the answers to "
                        "the held-out questions in this mode and score them with the task's own verifier "
                        "(mean score, exact share, reasoning_gym.jsonl per question)")
    p.add_argument("--read-at", type=int, default=None, metavar="K",
                   help="a reasoning-gym task run, an ablation: read every answer token out at step K "
                        "(1: the pauses removed at inference; M: every pause taken) instead of where the "
                        "model stops" + _OWN_DEFAULT)
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args) -> int:
    from ..eval import evaluate, format_summary

    if args.tokens is not None and args.tokens < 0:
        raise ValueError(f"--tokens must be >= 0 (0 = all the data), got {args.tokens}")
    command = _command(args)
    tokens = "run" if args.tokens is None else (args.tokens or None)
    metrics = evaluate(args.path, data=args.data, max_tokens=tokens, batch_size=args.batch_size,
                       out_dir=args.out, reference=args.reference, device=args.device, precision=args.precision,
                       impl=args.impl, dtype=args.dtype, block_len=args.block_len, num_passages=args.passages,
                       passage_tokens=args.passage_tokens, min_count=args.min_count, top_k=args.top_k,
                       attribution=args.attribution, progress=not args.no_progress, command=command,
                       generate=args.generate, answer_mode=args.answer_mode, answer_read_at=args.read_at)
    print(format_summary(metrics))
    return 0


def _command(args) -> str:
    """The command line that made the results (from sys.argv when run from a shell)."""
    if sys.argv[1:2] == ["eval"]:
        return "cyb " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    opts = [f"--{k.replace('_', '-')} {shlex.quote(str(v))}" if v is not True else f"--{k.replace('_', '-')}"
            for k, v in sorted(vars(args).items()) if k not in ("command", "path") and v not in (None, False)]
    return " ".join(["cyb eval", shlex.quote(args.path), *opts])
