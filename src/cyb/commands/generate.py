"""``cyb generate MODEL_DIR --prompt TEXT [...]``: text with pauses, streamed to the terminal."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

HELP = "generate text with pauses from a saved model (fixed or adaptive pauses, greedy or sampled)"
#: output paths checked before the command runs (:func:`cyb.files.unwritable`)
OUTPUTS = {"json_path": ("--json", "file")}

_SAMPLING_FLAGS = (("temperature", "--temperature"), ("top_k", "--top-k"), ("top_p", "--top-p"),
                   ("seed", "--seed"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..generation import registry

    p.add_argument("model_dir", metavar="MODEL_DIR",
                   help="a saved cyb model folder (written by `cyb train` or PauseModel.save_pretrained), "
                        "a run folder of cyb train (its final/ model) or one of its checkpoints (ckpt-N: the "
                        "model of step N); a plain model folder, a "
                        ".gguf file or a known model's name (smollm2-135m) runs as a no-pause baseline")
    p.add_argument("--prompt", action="append", default=[], metavar="TEXT",
                   help="a prompt (repeat for several)")
    p.add_argument("--file", metavar="PATH", help="a text file with one prompt per line (blank lines skipped)")
    p.add_argument("--mode", choices=registry.MODES, default="fixed",
                   help="fixed: all M-1 pauses after every token (one forward of M positions per token); "
                        "adaptive: a pause only when the model says <don't know>")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="new tokens per prompt at most")
    p.add_argument("--sample", action="store_true", help="sample instead of the greedy sequential readout")
    p.add_argument("--temperature", type=float, default=None, metavar="T",
                   help="sampling temperature >= 0 (0: greedy; 1.0 when not given); needs --sample")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="sample among the K most likely tokens")
    p.add_argument("--top-p", type=float, default=None, metavar="P", help="nucleus sampling, P in (0, 1]")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="seed of the sampler (reproducible runs)")
    p.add_argument("--stop", action="append", default=[], metavar="STR",
                   help="stop a prompt's generation at this string (repeatable; not printed)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-sequence token")
    p.add_argument("--batch-size", type=int, default=1, metavar="B",
                   help="prompts that decode at once (a finished prompt's place goes to the next "
                        "one); with 1 the text streams token by token, with more each completion "
                        "is printed, in the order of the prompts, as soon as it and those before it end")
    p.add_argument("--shade", action="store_true",
                   help="colour each token's background by the steps it used (white = 1, dark blue = M)")
    p.add_argument("--json", dest="json_path", metavar="PATH",
                   help="write the full results (ids, steps, d, E[S] per token) as JSON")
    p.add_argument("--decoder", choices=registry.DECODERS, default=registry.DEFAULT,
                   help="decode loop (all give the same tokens): " + registry.describe())
    p.add_argument("--device", default=None,
                   help="torch device, e.g. cpu, cuda, cuda:1 (None: cuda if available, else cpu)")
    p.add_argument("--dtype", default=None, choices=("auto", "float32", "bfloat16", "float16"),
                   help="parameter dtype (default, or auto: as transformers loads the checkpoint)")


def _fail(message: str) -> int:
    print(f"cyb generate: error: {message}", file=sys.stderr)
    return 2


def _prompts(args) -> list[str]:
    prompts = list(args.prompt)
    if args.file:
        path = Path(args.file)
        if not path.is_file():
            raise ValueError(f"--file {args.file}: no such file")
        from ..data.sources import read_utf8

        text = read_utf8(path, f"--file {args.file}")
        lines = [line.rstrip("\r\n") for line in text.splitlines() if line.strip()]
        if not lines:
            raise ValueError(f"--file {args.file} holds no prompt: it is empty or has only blank lines")
        prompts += lines
    if not prompts:
        raise ValueError("no prompt given: use --prompt TEXT (repeatable) or --file PATH")
    return prompts


def _check_model_dir(path: str) -> Path:
    from ..run_models import saved_model_folder

    # a .gguf file or a known model's name: its folder; a plain Hugging Face model is generated
    # from as a no-pause baseline
    return saved_model_folder(path, "MODEL_DIR", allow_plain=True)


def _config(args):
    import math

    from ..generation import GenerationConfig

    checks = [
        (args.max_new_tokens >= 1, f"--max-new-tokens must be >= 1, got {args.max_new_tokens}"),
        (args.batch_size >= 1, f"--batch-size must be >= 1, got {args.batch_size}"),
        (args.temperature is None or (math.isfinite(args.temperature) and args.temperature >= 0),
         f"--temperature must be a finite number >= 0, got {args.temperature}"),
        (args.top_k is None or args.top_k >= 0, f"--top-k must be >= 0 (0: off), got {args.top_k}"),
        (args.top_p is None or 0.0 < args.top_p <= 1.0, f"--top-p must lie in (0, 1], got {args.top_p}"),
        (all(args.stop), "--stop needs a non-empty string"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    if not args.sample:
        given = [flag for name, flag in _SAMPLING_FLAGS if getattr(args, name) is not None]
        if given:
            flags = given[0] if len(given) == 1 else ", ".join(given[:-1]) + " and " + given[-1]
            raise ValueError(f"{flags} only appl{'ies' if len(given) == 1 else 'y'} with --sample")
    options = dict(mode=args.mode, max_new_tokens=args.max_new_tokens, sample=args.sample,
                   stop=tuple(args.stop), top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                   decoder=args.decoder)
    if args.temperature is not None:
        options["temperature"] = args.temperature
    if args.ignore_eos:
        options["eos_token_ids"] = ()
    return GenerationConfig(**options)


def _write_json(path: str, payload: dict, results: list[dict]) -> None:
    """``payload`` plus ``"results"`` (one line per result), written atomically."""
    head = json.dumps(payload, indent=1)[:-2]  # without the closing "\n}"
    rows = ",\n".join("  " + json.dumps(r) for r in results)
    from ..files import write_text_atomic

    write_text_atomic(path, f'{head},\n "results": [\n{rows}\n ]\n}}\n')


def run(args) -> int:
    try:
        prompts = _prompts(args)
        cfg = _config(args)
        folder = _check_model_dir(args.model_dir)
        from ..runtime import resolve_device

        device = resolve_device(args.device, what="--device")
    except ValueError as e:
        return _fail(str(e))

    from ..data.tokenizer import check_text
    from ..generation import stream
    from ..generation.shade import legend, shade, supports_truecolor
    from ..generation.registry import resolve_decoder
    from ..model import PauseModel
    from ..model.sources import plain_model_kwargs, plain_model_note

    plain = plain_model_kwargs(folder)
    if plain:  # a plain model on purpose: said once
        print(plain_model_note(args.model_dir, "generates"), file=sys.stderr)
    model = PauseModel.from_pretrained(folder, torch_dtype=args.dtype, **plain).to(device).eval()
    if model.tokenizer is None:
        return _fail(f"{args.model_dir} has no tokenizer: text prompts cannot be encoded")
    try:
        decoder = resolve_decoder(model, cfg.decoder)
    except ValueError as e:
        return _fail(f"--decoder {cfg.decoder}: {e}")
    m = model.num_steps
    truecolor = supports_truecolor()
    out = sys.stdout

    def paint(text: str, steps: int) -> str:
        return shade(text, steps, m, truecolor=truecolor) if args.shade else text

    def summary(res) -> None:
        print(f"[{len(res.token_ids)} tokens, mean steps {res.mean_steps:.2f} of {m}, "
              f"stop: {res.stop_reason}]", file=sys.stderr)

    # every prompt through one stream (prompt i samples from the stream of (seed, i)); with one
    # row at a time its text streams token by token, else each completion is printed in order
    try:  # prompts are encoded and checked here, before any output
        for i, prompt in enumerate(prompts):  # the tokenizer's own error would be a traceback
            check_text(prompt, f"prompt {i}", tokenizer=model.tokenizer, trained_on=getattr(model, "trained_on", None))
        s = stream(model, prompts, dataclasses.replace(cfg, max_batch=args.batch_size),
                   engine_options=engine_options_for(len(prompts), cfg.max_new_tokens, args.batch_size))
    except ValueError as e:  # text the model cannot read, a prompt too long for its positions
        return _fail(str(e))
    if args.shade:
        print(legend(m, truecolor=truecolor), file=out)
    done, printed = set(), 0
    for event in s:
        if args.batch_size == 1:
            if event.index == 0:
                out.write(prompts[event.row])
            out.write(paint(event.text, event.steps))
            out.flush()
            if event.finished:
                out.write("\n")
                summary(s.partial[event.row])
            continue
        if event.finished:
            done.add(event.row)
        while printed in done:
            res = s.partial[printed]
            pieces = _pieces(model.tokenizer, res) if args.shade else [(res.text, 1)]
            out.write(prompts[printed] + "".join(paint(text, steps) for text, steps in pieces) + "\n")
            out.flush()
            summary(res)
            printed += 1
    results = s.results
    if args.json_path:
        _write_json(args.json_path, {"model": str(folder), "method": model.settings.method,
                                     "num_steps": m, "config": cfg.to_dict(), "decoder_used": decoder},
                    [r.to_dict() for r in results])
        print(f"results written to {args.json_path}", file=sys.stderr)
    return 0


#: a job of fewer decoding steps than this runs the plain model: compiling the engine's fused
#: kernels (``EngineOptions.fused``) takes 3-8 s once per process on CUDA, and a fused step
#: saves about 0.6 ms (a 134 M model on an H200), so a shorter one-off job would wait longer than
#: it gains
FUSED_MIN_STEPS = 16384


def engine_options_for(prompts: int, max_new_tokens: int, batch_size: int):
    """The engine's options for a job of ``prompts`` prompts of at most ``max_new_tokens`` new
    tokens, ``batch_size`` at a time: fused kernels only from :data:`FUSED_MIN_STEPS` decoding
    steps (the answers' length times the batches) up, where steps are graphed (their default)."""
    from ..engine import EngineOptions

    steps = max_new_tokens * -(-prompts // batch_size)
    return EngineOptions(fused=None if steps >= FUSED_MIN_STEPS else False)


def _pieces(tokenizer, res) -> list[tuple[str, int]]:
    """The result's text split by token, each piece with its token's steps (for shading)."""
    pieces, done = [], ""
    for k, steps in enumerate(res.steps):
        text = tokenizer.decode(res.token_ids[: k + 1], skip_special_tokens=True)
        text = text[: len(res.text)] if len(text) > len(res.text) else text
        pieces.append((text[len(done):], steps))
        done = text
    return pieces
