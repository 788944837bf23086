"""Run the examples of README.md and the docs pages and compare what they print with what the pages show.

    bash scripts/check_docs.sh                       # check every page (about an hour on 2 cores)
    bash scripts/check_docs.sh --pages README.md     # some pages only (only the runs they need)
    bash scripts/check_docs.sh --write --pages README.md,docs/concepts/demo.md   # put what ran into the pages
    bash scripts/check_docs.sh --list                # what is checked, without running anything

What is checked:

* every fenced block whose lines start with ``$ cyb ...``: each command runs, and what it prints
  (standard output and error together, as a terminal shows them) must be the lines below it up to
  the next ``$`` line; with ``--json PATH`` the line shown is the first result in that file;
* every fenced block or table that follows a ``<!-- check: NAME -->`` line: NAME is one of
  :data:`BLOCKS` below, which says which command made it and which part of its output it shows;
* :data:`FACTS`: numbers in the prose that come from those runs (the answers the README's
  generate example prints, the perplexity a run ended at, ...), and :data:`CLAIMS`: readings of
  the numbers that the prose makes (the baseline ahead, say), which a run can contradict: those
  are reported, never rewritten.

Every command runs in the work folder (``--work``, default ``/tmp/cyb-docs``; kept, so that a
second check reuses the runs that finished, ``--fresh`` starts over), where the pages' ``/tmp/NAME``
is the work folder's ``NAME``, with ``CYB_NUM_THREADS=1`` and the CPU's numerics pinned (cyb's
defaults, with which the pages' numbers were made; the thread count and the instruction sets
decide the last bits of the sums, docs/how-to/train.md "CPU threads and numerics"), ``COLUMNS=80``
(the width of ``--help``),
``HF_HUB_OFFLINE=1`` (SmolLM2 comes from its PyPI wheel), a model cache inside the work folder
(``CYB_CACHE``; ``--cache DIR`` shares one) and ``TQDM_DISABLE=1``.  Timings (seconds, tokens per
second, minutes) are not compared, nor how a streamed answer falls into events (:func:`stream_content`).
Exit status 1 when anything differs.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
PAGES = ("README.md", "docs/how-to/evaluate.md", "docs/concepts/demo.md", "docs/how-to/train.md",
         "docs/how-to/fine-tune.md", "docs/record/benchmarks/cpu.md", "docs/how-to/generate.md",
         "docs/how-to/serve.md", "docs/reference/cli.md", "docs/reference/config.md")
THREADS = "1"

#: The runs that examples read, each made once per work folder: the commands (``{repo}``: the
#: clone, ``{work}``: the work folder, the current folder of every command).
RUNS: dict[str, list[str]] = {
    "add": ["cyb train {repo}/configs/cpu-addition.yaml --set train.out_dir={work}/add"],
    "add-base": ["cyb train {repo}/configs/cpu-addition.yaml --set method.name=baseline "
                 "--set train.out_dir={work}/add-base"],
    "tinyfull": ["cyb train {repo}/configs/cpu-tiny.yaml --set train.out_dir={work}/tinyfull"],
    "measure-baseline": ["cyb train {repo}/configs/cpu-tiny.yaml --set method.name=baseline "
                         "--set train.out_dir=runs/measure-baseline"],
    "measure-tbys": ["cyb train {repo}/configs/cpu-tiny.yaml --set method.name=tbys "
                     "--set train.out_dir=runs/measure-tbys"],
    "tiny-gated": ["cyb train {repo}/configs/cpu-tiny.yaml --set method.pause_visibility=gated "
                   "--set train.out_dir=runs/tiny-gated"],
    "reasoning": ["cyb train {repo}/configs/cpu-reasoning.yaml --set train.out_dir={work}/reasoning"],
    "demo": ["cyb demo"],
    "smollm2": ["cyb train {repo}/configs/smollm2-135m.yaml"],
    "smollm2-baseline": ["cyb train {repo}/configs/smollm2-135m.yaml --set method.name=baseline "
                         "--set train.out_dir=runs/smollm2-baseline"],
    "smollm2-shared": ["cyb train {repo}/configs/smollm2-135m.yaml --set method.pause_visibility=shared "
                       "--set train.out_dir=runs/smollm2-shared"],
}
#: Where a page's command names a run: the run it needs first.
RUN_PATHS = (("/tmp/add-base", "add-base"), ("/tmp/add", "add"), ("/tmp/tinyfull", "tinyfull"),
             ("/tmp/reasoning", "reasoning"),
             ("runs/demo", "demo"), ("runs/smollm2-135m-cyb", "smollm2"))
#: What is not compared: timings.
TIMING = re.compile(r"\b\d+(?:\.\d+)? m?s\b|\b\d+ min \d+ s\b|\b\d[\d,]* tok/s\b")


class Context:
    """The work folder, its runs, and the commands' outputs (each command runs once)."""

    def __init__(self, work: Path, cache: Path | None, fresh: bool, verbose: bool):
        self.work = work
        if fresh and work.exists():
            shutil.rmtree(work)
        (work / "logs").mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "CYB_NUM_THREADS": THREADS, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1",
                    "CYB_CACHE": str(cache or work / "cache"), "COLUMNS": "80", "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"}
        self.env.pop("OMP_NUM_THREADS", None)
        self.env.pop("CYB_CPU_NUMERICS", None)  # pinned, as the pages' numbers were made
        self.outputs: dict[str, tuple[str, str]] = {}
        self.verbose = verbose

    def expand(self, command: str) -> str:
        return command.format(repo=REPO, work=self.work)

    def shell(self, command: str, *, merged: bool = False) -> tuple[str, str]:
        """``(stdout, stderr)`` of ``command`` (``merged``: both in stdout, as a terminal shows
        them), run in the work folder; the work folder's path shown as ``/tmp``."""
        key = f"{merged}:{command}"
        if key not in self.outputs:
            if self.verbose:
                print(f"  $ {command}", file=sys.stderr, flush=True)
            proc = subprocess.run(command + (" 2>&1" if merged else ""), shell=True, cwd=self.work, env=self.env,
                                  capture_output=True, text=True)
            out, err = (self.public(proc.stdout), self.public(proc.stderr))
            if proc.returncode != 0 and not merged:
                raise RuntimeError(f"`{command}` failed ({proc.returncode}):\n{err[-2000:]}")
            self.outputs[key] = (out, err)
        return self.outputs[key]

    def public(self, text: str) -> str:
        return text.replace(f"{self.work}/", "/tmp/").replace(str(self.work), "/tmp")

    def run(self, name: str) -> str:
        """What run ``name`` printed (standard output, then standard error), made first if needed
        (``logs/NAME.out``, ``.err`` and ``.time``, the wall time in seconds)."""
        logs = self.work / "logs"
        if not (logs / f"{name}.done").is_file():
            import time

            print(f"running {name} ...", file=sys.stderr, flush=True)
            outs, errs, start = [], [], time.monotonic()
            for command in RUNS[name]:
                out, err = self.shell(self.expand(command))
                outs.append(out), errs.append(err)
            (logs / f"{name}.out").write_text("".join(outs))
            (logs / f"{name}.err").write_text("".join(errs))
            (logs / f"{name}.time").write_text(f"{time.monotonic() - start:.0f}")
            (logs / f"{name}.done").write_text("")
        return self.stdout(name) + self.stderr(name)

    def stdout(self, name: str) -> str:
        return (self.work / "logs" / f"{name}.out").read_text()

    def stderr(self, name: str) -> str:
        f = self.work / "logs" / f"{name}.err"
        return f.read_text() if f.is_file() else ""

    def wall(self, name: str) -> str:
        f = self.work / "logs" / f"{name}.time"
        if not f.is_file():
            return "?"
        seconds = int(f.read_text())
        return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"

    def path(self, relative: str) -> Path:
        return self.work / relative


# ------------------------------------------------------------------------------ what is shown


def _lines_between(text: str, first: str, last: str | None = None) -> str:
    """The lines of ``text`` from the first that starts with ``first`` to the first after it that
    starts with ``last`` (included; to the end when None)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    end = len(lines) - 1 if last is None else next(i for i in range(start, len(lines)) if lines[i].startswith(last))
    return "\n".join(lines[start:end + 1]).rstrip() + "\n"


def demo_report(ctx: Context) -> str:
    """What ``cyb demo`` printed from its table on."""
    ctx.run("demo")
    return _lines_between(ctx.stdout("demo"), "| method")


def demo_table(ctx: Context) -> str:
    return _lines_between(demo_report(ctx), "| method", "| cyb_decoupled")


def demo_generation(ctx: Context) -> str:
    text = demo_report(ctx)
    return _lines_between(text, "cyb generating", "  (adaptive") + "\n" + _lines_between(
        text, "cyb_decoupled generating", "  (adaptive")


def reasoning_steps(ctx: Context) -> str:
    """The held-out lines of docs/how-to/train.md's reasoning-gym run (configs/cpu-reasoning.yaml)."""
    log = ctx.run("reasoning")
    return "".join(line + "\n" for line in log.splitlines() if re.match(r"step \d+: held-out", line))


def reasoning_eval(ctx: Context) -> str:
    """What ``cyb eval`` of that run says of its answers: the teacher-forced exact match and the
    verifier's score of the generated answers."""
    ctx.run("reasoning")
    out = ctx.shell(f"cyb eval {ctx.work}/reasoning --no-progress")[0]
    return "".join(line + "\n" for line in out.splitlines() if line.startswith(("task:", "reasoning-gym:")))


def smollm2_steps(ctx: Context) -> str:
    log = ctx.run("smollm2")
    return "".join(line + "\n" for line in log.splitlines() if re.match(r"step \d+: held-out", line))


def eval_tinyfull(ctx: Context) -> str:
    ctx.run("tinyfull")
    return ctx.shell("cyb eval /tmp/tinyfull --no-progress".replace("/tmp/", f"{ctx.work}/"))[0]


def eval_add(ctx: Context) -> str:
    ctx.run("add"), ctx.run("add-base")
    w = ctx.work
    return ctx.shell(f"cyb eval {w}/add --reference {w}/add-base --out {w}/add/eval-vs-base --no-progress")[0]


def eval_add_base(ctx: Context) -> str:
    ctx.run("add-base")
    return ctx.shell(f"cyb eval {ctx.work}/add-base --no-progress")[0]


def eval_demo_generate(ctx: Context) -> str:
    ctx.run("demo")
    out = ctx.shell("cyb eval runs/demo/runs/cyb_decoupled --generate 512 --no-progress")[0]
    return _lines_between(out, "task:", "  generating the first 512 answers in adaptive")


def eval_tinyfull_generate(ctx: Context) -> str:
    ctx.run("tinyfull")
    w = ctx.work
    out = ctx.shell(f"cyb eval {w}/tinyfull --generate 16 --out {w}/tinyfull/eval-generate --no-progress")[0]
    return _lines_between(out, "generation:", "  adaptive mode:")


def pause_stats_tinyfull(ctx: Context) -> str:
    eval_tinyfull(ctx)
    text = ctx.path("tinyfull/eval/pause_stats.md").read_text()
    return _lines_between(text, "|  | Low median", "Split at")


def _valid_losses(run: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {int(r["step"]): r for r in rows if r.get("split") == "valid"}


def measure_table(ctx: Context) -> str:
    """docs/record/benchmarks/cpu.md's table of the three cpu-tiny runs (the CYB one is the README's)."""
    rows = []
    for name, label, run in (("measure-baseline", "baseline", "runs/measure-baseline"),
                             ("measure-tbys", "tbys (M=4)", "runs/measure-tbys"),
                             ("tinyfull", "cyb (M=4)", "tinyfull")):
        log = ctx.run(name)
        valid = _valid_losses(ctx.path(run))
        final = json.loads(ctx.path(run).joinpath("final_metrics.json").read_text())
        speeds = sorted(float(m.replace(",", "")) for m in re.findall(r"\| ([\d,]+) tok/s", log))
        speed = f"{speeds[len(speeds) // 2]:,.0f}" if speeds else "?"
        steps = " / ".join(f"{valid[s]['loss']:.3f}" for s in (0, 100, 200, 300))
        es = f"{final['mean_steps']:.2f}" if label.startswith("cyb") else "—"
        rows.append(f"| {label} | {steps} | {final['ppl']:.0f} | {es} | {speed} | {ctx.wall(name)} |")
    head = ("| method | held-out loss at step 0 / 100 / 200 / 300 | final ppl | E[S] at 300 | median tokens/s | "
            "wall time |\n| --- | --- | --- | --- | --- | --- |\n")
    return head + "\n".join(rows) + "\n"


#: The README's calls of ``cyb serve`` (its port is the one the server printed).
SERVE_CURL = ("curl -s {url}/v1/completions -H \"Content-Type: application/json\" "
              "-d '{{\"prompt\": \"864+394=\", \"max_tokens\": 8, \"temperature\": 0, \"return_steps\": true}}'")
SERVE_OPENAI = """from openai import OpenAI

client = OpenAI(base_url="{url}/v1", api_key="none")
r = client.completions.create(model="runs/demo/runs/cyb_decoupled", prompt=["864+394=", "123+456="],
                              max_tokens=8, temperature=0, extra_body={{"return_steps": True}})
for choice in r.choices:
    print(choice.text, choice.model_extra["steps"], choice.finish_reason)
print(r.usage.completion_tokens, r.usage.model_extra)
"""
SERVE_STREAM = ("curl -sN {url}/v1/completions -H \"Content-Type: application/json\" "
                "-d '{{\"prompt\": \"776+911=\", \"max_tokens\": 8, \"temperature\": 0, \"stream\": true, "
                "\"return_steps\": true}}'")
#: docs/how-to/serve.md's bad requests.
SERVE_BAD = ('{{"prompt": "864+394=", "max_tokens": 5000}}', '{{"prompt": "864+394=", "max_token": 8}}',
             '{{"prompt": "hello world", "max_tokens": 8}}')
#: What differs between two calls of the same request: its id and time.
SERVE_VOLATILE = (re.compile(r'"id":"cmpl-\w+"'), re.compile(r'"created":\d+'))


def stream_content(text: str) -> str:
    """What a streamed completion says whatever the timing: each choice's text, steps and
    finish_reason over all its events, the fields every event has, and the ``[DONE]`` that ends
    it.  An event carries the tokens decided since the one before, so the same request streams
    in four events or in five from run to run: how they fall into events is not compared.
    Text that is not such a stream comes back as it is."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2 or lines[-1] != "data: [DONE]":
        return text
    try:
        events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    except ValueError:
        return text
    fields, choices = set(), {}
    for event in events:
        fields.add(json.dumps({k: v for k, v in event.items() if k != "choices"}, separators=(",", ":")))
        for choice in event["choices"]:
            seen = choices.setdefault(choice["index"], {"text": "", "steps": [], "finish_reason": [], "other": set()})
            seen["text"] += choice["text"]
            seen["steps"] += choice.get("steps", [])
            seen["finish_reason"].append(choice["finish_reason"])
            seen["other"].add(json.dumps({k: v for k, v in choice.items()
                                          if k not in ("index", "text", "steps", "finish_reason")}))
    out = [f"every event: {' | '.join(sorted(fields))}"]
    for index, seen in sorted(choices.items()):
        *before, last = seen["finish_reason"]
        ending = f"finish_reason {last} in its last event" + ("" if not any(before) else f", and before: {before}")
        out.append(f"choice {index}: text {seen['text']!r}, steps {seen['steps']}, {ending}, "
                   f"{' | '.join(sorted(seen['other']))}")
    return "\n".join(out + [lines[-1]]) + "\n"


def serve_example(ctx: Context) -> dict:
    """The README's ``cyb serve`` example: the server on the demo's cyb_decoupled model (on a free
    port, stopped afterwards), then its curl and openai calls; what each printed."""
    if "serve" not in ctx.outputs:
        ctx.run("demo")
        proc = subprocess.Popen(["cyb", "serve", "runs/demo/runs/cyb_decoupled", "--port", "0"], cwd=ctx.work,
                                env=ctx.env, stderr=subprocess.PIPE, text=True)
        try:
            url = None
            for line in proc.stderr:
                found = re.search(r"listening: .* on (http://[\d.:]+) ", line)
                if found:
                    url = found.group(1)
                    break
            if url is None:
                raise RuntimeError("cyb serve did not start")
            listening = line.replace(url, "http://127.0.0.1:8000").strip() + "\n"
            curl = ctx.shell(SERVE_CURL.format(url=url))[0]
            stream = "".join(part + "\n" for part in ctx.shell(SERVE_STREAM.format(url=url))[0].split("\n") if part)
            bad = "".join(ctx.shell(f"curl -s {url}/v1/completions -H \"Content-Type: application/json\" "
                                    f"-d '{body.format()}'")[0].strip() + "\n" for body in SERVE_BAD)
            py = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", SERVE_OPENAI.format(url=url)],
                                cwd=ctx.work, env=ctx.env, capture_output=True, text=True)
            if py.returncode != 0:
                raise RuntimeError(f"the openai example failed:\n{py.stderr[-2000:]}")
        finally:
            proc.terminate()
            proc.wait(60)
        ctx.outputs["serve"] = {"curl": curl.strip() + "\n", "openai": py.stdout, "listening": listening,
                                "stream": stream, "errors": bad}
    return ctx.outputs["serve"]


def generation_python(ctx: Context) -> str:
    """docs/how-to/generate.md's Python example (``From Python``) on the addition run, what it printed."""
    ctx.run("add")
    text = (REPO / "docs" / "how-to" / "generate.md").read_text(encoding="utf-8").split("## From Python", 1)[1]
    code = _FENCE.search(text).group(1).replace("/tmp/add/", f"{ctx.work}/add/")
    py = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", code], cwd=ctx.work, env=ctx.env,
                        capture_output=True, text=True)
    if py.returncode != 0:
        raise RuntimeError(f"the Python example of docs/how-to/generate.md failed:\n{py.stderr[-2000:]}")
    return py.stdout


def lm_eval_tiny(ctx: Context) -> str:
    """The table of the in-process lm-eval model on the shipped tiny tasks (docs/how-to/serve.md: the
    server gives the same), for the cpu-tiny run."""
    ctx.run("tinyfull")
    tasks = ctx.shell("python -c 'from cyb.integrations.tasks import tasks_dir; print(tasks_dir())'")[0].strip()
    out = ctx.shell(f"python -m cyb.integrations.lm_eval --model cyb --model_args pretrained={ctx.work}/tinyfull,"
                    f"device=cpu --tasks cyb_tiny_mc,cyb_tiny_gen --include_path {tasks}")[0]
    return "".join(line + "\n" for line in out.splitlines() if line.startswith("|"))


@dataclass
class Block:
    """A block a page marks ``<!-- check: NAME -->``: what makes it, and what is not compared."""

    make: Callable[[Context], str]
    #: patterns whose matches are not compared (timings)
    volatile: tuple = (TIMING,)
    #: what of a text is compared (:func:`stream_content`); None: all of it
    compared: Callable[[str], str] | None = None


BLOCKS: dict[str, Block] = {
    "demo-report": Block(demo_report, (TIMING, re.compile(r"(?<=\| )\d+(?= \|$)", re.M))),
    "demo-table": Block(demo_table, (re.compile(r"(?<=\| )\d+(?= \|$)", re.M),)),
    "demo-generation": Block(demo_generation),
    "reasoning-steps": Block(reasoning_steps),
    "reasoning-eval": Block(reasoning_eval),
    "smollm2-steps": Block(smollm2_steps),
    "smollm2-generate": Block(lambda ctx: smollm2_generate(ctx)),
    "eval-tinyfull": Block(eval_tinyfull),
    "eval-add": Block(eval_add),
    "eval-demo-generate": Block(eval_demo_generate),
    "eval-tinyfull-generate": Block(eval_tinyfull_generate),
    "pause-stats-tinyfull": Block(pause_stats_tinyfull),
    "measure-table": Block(measure_table, (re.compile(r"\| [\d,?]+ \| [^|]+ \|$", re.M),)),
    "serve-curl": Block(lambda ctx: serve_example(ctx)["curl"], SERVE_VOLATILE),
    "serve-openai": Block(lambda ctx: serve_example(ctx)["openai"]),
    "serve-listening": Block(lambda ctx: serve_example(ctx)["listening"]),
    "serve-stream": Block(lambda ctx: serve_example(ctx)["stream"], SERVE_VOLATILE, stream_content),
    "serve-errors": Block(lambda ctx: serve_example(ctx)["errors"]),
    "lm-eval-tiny": Block(lambda ctx: lm_eval_tiny(ctx)),
    "generation-python": Block(lambda ctx: generation_python(ctx)),
}


# ------------------------------------------------------------------------------ facts in the prose


def _final(ctx: Context, run: str) -> dict:
    return json.loads(ctx.path(run).joinpath("final_metrics.json").read_text())


def _generated(ctx: Context, command: str, json_path: str) -> list[dict]:
    ctx.shell(f"{command} --json {json_path}")
    return json.loads(ctx.path(json_path).read_text())["results"]


def readme_answers(ctx: Context) -> dict:
    ctx.run("demo")
    res = _generated(ctx, 'cyb generate runs/demo/runs/cyb_decoupled --prompt "864+394=" --prompt "123+456="',
                     "logs/readme-answers.json")
    a, b = res
    digits = lambda r: ", ".join(str(s) for s in r["steps"][:-2]) + f" and {r['steps'][-2]}"  # noqa: E731
    m = lambda r: sum(r["steps"]) / len(r["steps"])  # noqa: E731
    return {"a": a["text"], "b": b["text"], "a_steps": digits(a), "b_steps": digits(b),
            "a_line": f"[{len(a['token_ids'])} tokens, mean steps {m(a):.2f} of {a['num_steps']}, stop: {a['stop_reason']}]"}


def smollm2_numbers(ctx: Context) -> dict:
    def ppl(log: str, step: int) -> float:
        return float(re.search(rf"^step {step}: held-out .*? ppl ([\d.,]+)", log, re.M).group(1).replace(",", ""))

    base, shared = ctx.run("smollm2-baseline"), ctx.run("smollm2-shared")
    return {"base0": f"{ppl(base, 0):.1f}", "base16": f"{ppl(base, 16):.2f}",
            "shared": f"{ppl(shared, 0):,.0f}, {ppl(shared, 8):.1f}, {ppl(shared, 16):.1f}"}


def smollm2_generate(ctx: Context) -> str:
    """The README's generate command on the SmolLM2 run, without the colours of --shade."""
    ctx.run("smollm2")
    return ctx.shell('cyb generate runs/smollm2-135m-cyb --prompt "The json module" --max-new-tokens 24',
                     merged=True)[0]


def tinyfull_numbers(ctx: Context) -> dict:
    ctx.run("tinyfull")
    f = _final(ctx, "tinyfull")
    return {"ppl": f"{f['ppl']:.0f}", "final": f"final held-out: loss={f['loss']:.3f} ... ppl={f['ppl']:.1f} ... "
                                              f"targets={f['targets']} step={f['step']}"}


def add_numbers(ctx: Context) -> dict:
    base = eval_add_base(ctx)
    cyb = eval_add(ctx)
    ppl = re.search(r"^perplexity ([\d.]+) \(loss ([\d.]+); cross-entropy\)", base, re.M)
    exact = lambda text: re.search(r"exact match ([\d.]+%)", text).group(1)  # noqa: E731
    return {"base_ppl": ppl.group(1), "base_loss": ppl.group(2), "base_exact": exact(base), "cyb_exact": exact(cyb)}


def gated_numbers(ctx: Context) -> dict:
    ctx.run("tiny-gated")
    out = ctx.shell("cyb eval runs/tiny-gated --no-progress")[0]
    return {"line": next(line for line in out.splitlines() if line.startswith("gated pauses:"))}


def demo_numbers(ctx: Context) -> dict:
    report = demo_report(ctx)
    dec = re.search(r"^\| cyb_decoupled \| \d+ \| ([\d.]+%) \|", report, re.M)
    steps = re.search(r"^- cyb_decoupled [^\n]*criterion[^\n]*; more steps on the hard answer positions than on the easy "
                      r"ones: \w+ \(E\[S\] ([\d.]+) against ([\d.]+)\)", report, re.M)
    cyb = re.search(r"^\| cyb \| \d+ \| [^|]+ \| [^|]+ \| [^|]+ \| ([\d.]+) \|", report, re.M)
    modes = r" generating .*?\n  fixed    mode: exact match ([\d.]+%).*?\n  adaptive mode: exact match ([\d.]+%), ([\d.]+) "
    dec_modes = re.search(r"^cyb_decoupled" + modes, report, re.S | re.M)
    tbys = re.search(r"^\| tbys \| \d+ \| ([\d.]+%) \|", report, re.M)
    cyb_modes = re.search(r"^cyb" + modes, report, re.S | re.M)
    return {"dec_exact": dec.group(1), "dec_hard": steps.group(1), "dec_easy": steps.group(2),
            "dec_adaptive": dec_modes.group(2), "dec_positions": dec_modes.group(3), "cyb_es": cyb.group(1),
            "tbys_exact": tbys.group(1), "dec_fixed": dec_modes.group(1), "cyb_fixed": cyb_modes.group(1),
            "cyb_adaptive": cyb_modes.group(2)}


@dataclass
class Fact:
    """A phrase of a page made from a run's numbers: ``pattern`` finds it (spaces match any white
    space, so a phrase may break across lines), ``text`` writes it from ``numbers(ctx)``."""

    page: str
    pattern: str
    text: str
    numbers: Callable[[Context], dict]

    def regex(self) -> re.Pattern:
        return re.compile(r"\s+".join(self.pattern.split(" ")))


FACTS: list[Fact] = [
    Fact("docs/concepts/demo.md", r"prints the answers `\d+` and `\d+`", "prints the answers `{a}` and `{b}`", readme_answers),
    Fact("docs/concepts/demo.md", r"In that run the digits of `\d+` took [\d, and]+ steps; those of `\d+`, with no carry, took [\d, and]+\.",
         "In that run the digits of `{a}` took {a_steps} steps; those of `{b}`, with no carry, took {b_steps}.",
         readme_answers),
    Fact("docs/concepts/demo.md", r"`\[\d+ tokens, mean steps [\d.]+ of 4, stop: eos\]`", "`{a_line}`", readme_answers),
    Fact("docs/how-to/fine-tune.md", r"\([\d.]+ as a no-pause baseline", "({base0} as a no-pause baseline", smollm2_numbers),
    Fact("docs/how-to/fine-tune.md", r"which ends at [\d.]+\)", "which ends at {base16})", smollm2_numbers),
    Fact("docs/how-to/fine-tune.md", r"the same run went [\d,.]+, [\d.]+, [\d.]+\.", "the same run went {shared}.", smollm2_numbers),
    Fact("docs/how-to/train.md", r"ending at held-out perplexity \d+", "ending at held-out perplexity {ppl}", tinyfull_numbers),
    Fact("docs/how-to/evaluate.md", r"`final held-out: loss=[\d.]+ \.\.\. ppl=[\d.]+ \.\.\. targets=\d+ step=\d+`", "`{final}`",
         tinyfull_numbers),
    Fact("docs/how-to/evaluate.md", r"`perplexity [\d.]+ \(loss [\d.]+; cross-entropy\)` and `exact match [\d.]+%`",
         "`perplexity {base_ppl} (loss {base_loss}; cross-entropy)` and `exact match {base_exact}`", add_numbers),
    Fact("docs/how-to/evaluate.md", r"\(the baseline [\d.]+% exact, CYB [\d.]+%\)",
         "(the baseline {base_exact} exact, CYB {cyb_exact})", add_numbers),
    Fact("docs/how-to/evaluate.md", r"that line read `gated pauses: [^`]*`", "that line read `{line}`", gated_numbers),
    Fact("docs/concepts/demo.md", r"it answers at the real token \(E\[S\] [\d.]+\)",
         "it answers at the real token (E[S] {cyb_es})", demo_numbers),
    Fact("docs/concepts/demo.md", r"adaptive decoding spends [\d.]+ positions per token",
         "adaptive decoding spends {dec_positions} positions per token", demo_numbers),
    Fact("docs/concepts/demo.md", r"`cyb_decoupled` spent [\d.]+ steps on the hard answer digits and [\d.]+ on the easy ones",
         "`cyb_decoupled` spent {dec_hard} steps on the hard answer digits and {dec_easy} on the easy ones", demo_numbers),
    Fact("docs/concepts/demo.md", r"`cyb_decoupled` answers [\d.]+% exactly against TBYS's [\d.]+%",
         "`cyb_decoupled` answers {dec_exact} exactly against TBYS's {tbys_exact}", demo_numbers),
    Fact("docs/concepts/demo.md", r"\([\d.]+% exact against [\d.]+% in fixed mode\)",
         "({dec_adaptive} exact against {dec_fixed} in fixed mode)", demo_numbers),
    Fact("docs/concepts/demo.md", r"it answers [\d.]+% exactly in fixed mode and [\d.]+% in adaptive mode",
         "it answers {cyb_fixed} exactly in fixed mode and {cyb_adaptive} in adaptive mode", demo_numbers),
]


def _negative_improvement(ctx: Context):
    m = re.search(r"relative improvement vs Baseline \(perplexity [\d.]+\): (-?[\d.]+)%", eval_add(ctx))
    return float(m.group(1)) < 0, f"the relative improvement of /tmp/add over /tmp/add-base is {m.group(1)}%"


def _decoupled_meets(ctx: Context):
    n = demo_numbers(ctx)
    dec, tbys = float(n["dec_exact"][:-1]), float(n["tbys_exact"][:-1])
    return "- cyb_decoupled meets the demo's criterion" in demo_report(ctx), f"cyb_decoupled {dec}% against TBYS {tbys}%"


def _cyb_learned(ctx: Context):
    cyb = re.search(r"^\| cyb \| \d+ \| ([\d.]+)%", demo_report(ctx), re.M).group(1)
    return float(cyb) > 50, f"CYB {cyb}%"


def _decoupled_misses(ctx: Context):
    meets, numbers = _decoupled_meets(ctx)
    return not meets, numbers


def _decoupled_keeps(ctx: Context):
    n = demo_numbers(ctx)
    fixed, adaptive = float(n["dec_fixed"][:-1]), float(n["dec_adaptive"][:-1])
    return adaptive >= fixed - 2, f"cyb_decoupled {adaptive}% adaptive against {fixed}% fixed"


def _baseline_ahead_on_add(ctx: Context):
    n = add_numbers(ctx)
    return float(n["base_exact"][:-1]) > float(n["cyb_exact"][:-1]), f"the baseline {n['base_exact']}, CYB {n['cyb_exact']}"


#: ``(page, the phrase that reads the numbers, check(ctx) -> (holds, what the numbers are))``.
CLAIMS = [
    ("docs/how-to/evaluate.md", "Here the baseline is better (a negative relative improvement)", _negative_improvement),
    ("docs/concepts/demo.md", "In this run plain CYB learned the task", _cyb_learned),
    ("docs/concepts/demo.md", "CYB learned it too", _cyb_learned),
    ("docs/concepts/demo.md", "Here the recipe does not meet the demo's criterion", _decoupled_misses),
    ("docs/concepts/demo.md", "keeps its answers (", _decoupled_keeps),
    ("docs/how-to/evaluate.md", "keeps its answers that way", _decoupled_keeps),
    ("docs/how-to/evaluate.md", "the baseline does more of the sums than CYB", _baseline_ahead_on_add),
]


# ------------------------------------------------------------------------------ pages


@dataclass
class Finding:
    page: str
    line: int
    what: str
    shown: str
    got: str
    volatile: tuple = ()
    span: tuple[int, int] | None = None  # where ``shown`` sits in the page (for --write)
    compared: Callable[[str], str] | None = None

    def same(self) -> bool:
        def norm(text: str) -> str:
            if self.compared is not None:
                text = self.compared(text)
            for pattern in self.volatile:
                text = pattern.sub("…", text)
            return text.strip()

        return norm(self.shown) == norm(self.got)


_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_MARK = re.compile(r"^<!-- check: ([\w-]+) -->[ \t]*\n", re.M)


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def marked_blocks(page: str, text: str, ctx: Context | None):
    """``Finding``s of the blocks a page marks (``got`` empty without a context)."""
    for mark in _MARK.finditer(text):
        name, start = mark.group(1), mark.end()
        if name not in BLOCKS:
            raise SystemExit(f"{page}:{_line(text, mark.start())}: no block named {name!r} in scripts/check_docs.py")
        fence = _FENCE.match(text, start)
        if fence:
            span = fence.span(1)
        else:  # a table: the lines that start with |
            table = re.match(r"(?:\|[^\n]*\n)+", text[start:])
            if not table:
                raise SystemExit(f"{page}:{_line(text, start)}: <!-- check: {name} --> is followed by no block or table")
            span = (start, start + table.end())
        block = BLOCKS[name]
        got = block.make(ctx) if ctx is not None else ""
        yield Finding(page, _line(text, span[0]), f"block {name}", text[span[0]:span[1]], got, block.volatile, span,
                      block.compared)


def command_blocks(page: str, text: str, ctx: Context | None):
    """``Finding``s of the fenced blocks whose lines start with ``$ cyb``."""
    for fence in _FENCE.finditer(text):
        body = fence.group(1)
        if not body.startswith("$ cyb "):
            continue
        pieces = re.split(r"^\$ ", body, flags=re.M)[1:]
        offset = fence.start(1)
        for piece in pieces:
            command, _, shown = piece.partition("\n")
            start = offset + 2 + len(command) + 1
            got = ""
            if ctx is not None:
                for path, run in RUN_PATHS:
                    if path in command:
                        ctx.run(run)
                real = command.replace("/tmp/", f"{ctx.work}/")
                out, _ = ctx.shell(real, merged=True)
                got = out
                json_path = re.search(r"--json (\S+)", real)
                if json_path:  # the page shows the first result of the file
                    results = json.loads(Path(json_path.group(1)).read_text())["results"]
                    got = json.dumps(results[0]) + "\n"
            yield Finding(page, _line(text, start), f"$ {command}", shown, got, (TIMING,), (start, start + len(shown)))
            offset = start + len(shown)


def facts(page: str, text: str, ctx: Context | None):
    for fact in FACTS:
        if fact.page != page:
            continue
        m = fact.regex().search(text)
        if m is None:
            yield Finding(page, 0, f"fact {fact.pattern!r}", "(not found on the page)", "", ())
            continue
        got = fact.text.format(**fact.numbers(ctx)) if ctx is not None else ""
        shown = " ".join(m.group(0).split())
        yield Finding(page, _line(text, m.start()), "fact", shown, got, (), m.span())


def claims(page: str, text: str, ctx: Context | None):
    for where, phrase, check in CLAIMS:
        if where != page:
            continue
        if " ".join(phrase.split()) not in " ".join(text.split()):
            continue  # the page no longer says it
        holds, numbers = check(ctx) if ctx is not None else (True, "")
        yield Finding(page, 0, f"claim {phrase!r}", "holds", "holds" if holds else f"does not hold: {numbers}", ())


def findings(page: str, ctx: Context | None):
    text = (REPO / page).read_text(encoding="utf-8")
    yield from marked_blocks(page, text, ctx)
    yield from command_blocks(page, text, ctx)
    yield from facts(page, text, ctx)
    yield from claims(page, text, ctx)


def write(page: str, found: list[Finding]) -> int:
    """Put what ran into ``page`` (blocks, commands' outputs and facts; never claims)."""
    path = REPO / page
    text = path.read_text(encoding="utf-8")
    changes = sorted((f for f in found if f.span is not None and not f.same()), key=lambda f: -f.span[0])
    for f in changes:
        a, b = f.span
        new = f.got if f.what != "fact" else f.got
        if f.what != "fact" and not new.endswith("\n"):
            new += "\n"
        text = text[:a] + new + text[b:]
    path.write_text(text, encoding="utf-8")
    return len(changes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", default=",".join(PAGES), help="comma-separated pages (default: %(default)s)")
    p.add_argument("--work", default="/tmp/cyb-docs", help="work folder (default: %(default)s)")
    p.add_argument("--cache", default=None, help="model cache (default: WORK/cache)")
    p.add_argument("--fresh", action="store_true", help="start the work folder afresh")
    p.add_argument("--write", action="store_true", help="put what ran into the pages (facts and blocks; claims "
                                                       "that no longer hold are only reported)")
    p.add_argument("--list", action="store_true", help="list what is checked, run nothing")
    p.add_argument("-v", "--verbose", action="store_true", help="print each command as it runs")
    args = p.parse_args(argv)
    pages = [x.strip() for x in args.pages.split(",") if x.strip()]
    ctx = None if args.list else Context(Path(args.work).resolve(), Path(args.cache) if args.cache else None,
                                        args.fresh, args.verbose)
    differ = total = 0
    for page in pages:
        found = []
        for f in findings(page, ctx):
            found.append(f)
            total += 1
            if args.list:
                print(f"{page}:{f.line}: {f.what}")
                continue
            if f.same():
                print(f"ok      {page}:{f.line}: {f.what[:100]}", flush=True)
                continue
            differ += 1
            print(f"DIFFERS {page}:{f.line}: {f.what[:100]}", flush=True)
            diff = difflib.unified_diff(f.shown.splitlines(), f.got.splitlines(), "page", "ran", lineterm="", n=1)
            print("\n".join("        " + line for line in diff), flush=True)
        if args.write and ctx is not None:
            n = write(page, found)
            if n:
                print(f"wrote {n} change(s) into {page}")
    if not args.list:
        print(f"{total - differ} of {total} checks agree" + (f"; {differ} differ" if differ else ""))
    return 1 if differ and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
