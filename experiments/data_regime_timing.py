"""A step's time for each row of the data-regime study, and the estimate of the whole plan
(``python experiments/data_regime.py time``).

Each row trains ``--steps`` steps (default 40) of its 1x3 cell alone on a GPU, logging every 10,
on a tenth of the training documents (tokenising all of them is measured apart, below), then is
evaluated on the whole in-distribution held-out file and saved, as a cell is.  From its metrics:
the steady step time (the median of the logging windows after the first two, which hold the
compilation), the start-up (launch to the first step: loading, compiling), the evaluation and the
save.  The tokenizer's speed on techdocs is measured in this process.  With ``--concurrent K`` K
copies of the CYB row then train at once on the first GPU: their step time over the solo one is
the load factor of K cells per GPU.  Everything goes to ``OUT/timing.json`` (rows already there
are not timed again, so a cut call resumes), then the estimate of the plan is printed.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from experiments import data_regime_plan
from experiments import data_regime_cells as dc
from experiments.run_suite import smollm2_model

#: The share of the training documents the timing runs read.
TIMING_SHARE = 0.1


def read_run(folder: Path, launched: float, ended: float) -> dict:
    """What a timing run's ``metrics.jsonl`` says: ``step_s`` (steady), ``startup_s``,
    ``eval_s``, ``save_s`` (the final save and exit) and ``steps``."""
    lines = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = [(r["step"], r["time"]) for r in lines if r.get("split") == "train"]
    valid = [r["time"] for r in lines if r.get("split") == "valid"]
    if len(train) < 2 or not valid:
        raise ValueError(f"{folder}: too few logged steps to time ({len(train)}; need 2 and the evaluation)")
    windows = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in zip(train, train[1:])]
    steady = statistics.median(windows[1:] if len(windows) > 2 else windows[-1:])
    return {"step_s": steady, "startup_s": max(0.0, train[0][1] - launched - train[0][0] * steady),
            "eval_s": valid[-1] - train[-1][1], "save_s": max(0.0, ended - valid[-1]), "steps": train[-1][0],
            "windows_s": windows}


def tokenise_speed(train_file: str, chars: int = 4_000_000) -> float:
    """Characters per second of the model's tokenizer on the first ``chars`` of the text, in
    batches as the packer sends them."""
    from cyb.data.sources import iter_texts
    from cyb.data.tokenizer import chunked, load_tokenizer, text_encoder
    from cyb.model.sources import resolve_model_source

    encode = text_encoder(load_tokenizer(resolve_model_source(smollm2_model())))
    docs, held = [], 0
    for text in iter_texts(train_file):
        docs.append(text)
        held += len(text)
        if held >= chars:
            break
    start = time.perf_counter()
    for chunk in chunked(docs, 128):
        encode(list(chunk))
    return held / (time.perf_counter() - start)


def _launch(cfg: dict, folder: Path, gpu: str) -> tuple[subprocess.Popen, float]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder.parent / f"{folder.name}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if gpu != "cpu":
        env["CUDA_VISIBLE_DEVICES"] = gpu
    log = open(folder.parent / f"{folder.name}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "cyb", "train", str(folder.parent / f"{folder.name}.yaml")], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, time.time()


def _config(row: dc.Row, files: dict, root: Path, steps: int, name: str) -> dict:
    cfg = data_regime_plan.cell_config(dc.Cell(row, "1x3", 0), files, root, steps=steps)
    cfg["data"]["fraction"] = TIMING_SHARE
    cfg["train"]["out_dir"] = str(root / name)
    return cfg


def _run_all(batch: list[tuple[str, dict, str]], deadline: float) -> dict[str, tuple[float, float, int]]:
    """Run ``(name, config, gpu)`` at once; ``{name: (launched, ended, returncode)}``."""
    procs = {name: _launch(cfg, Path(cfg["train"]["out_dir"]), gpu) for name, cfg, gpu in batch}
    ends = {}
    while len(ends) < len(procs):
        for name, (proc, launched) in procs.items():
            if name in ends:
                continue
            if proc.poll() is not None:
                ends[name] = (launched, time.time(), proc.returncode)
            elif time.time() > deadline:
                os.killpg(proc.pid, 9)
                proc.wait()
                ends[name] = (launched, time.time(), -9)
        time.sleep(0.5)
    return ends


def main(args, cells: list, files: dict) -> int:
    out = Path(os.path.relpath(args.out.resolve()))
    root = out / "timing"
    path = out / "timing.json"
    timing = json.loads(path.read_text()) if path.is_file() else {"rows": {}, "load": {}}
    deadline = time.time() + args.deadline if args.deadline else float("inf")
    gpus = args.gpus.split(",")
    if "tokenise_chars_per_s" not in timing:
        timing["tokenise_chars_per_s"] = tokenise_speed(files["train"])
        timing["corpus_chars"] = data_regime_plan.DEFAULT_TIMING["corpus_chars"]
    rows = [r for r in dc.ROWS if any(c.row.key == r.key for c, _ in cells) and r.key not in timing["rows"]]
    # the rows with pauses first: they set most of the plan's time
    rows.sort(key=lambda r: -r.step_cost)
    while rows and time.time() < deadline:
        batch = [(f"time-{r.key}", _config(r, files, root, args.steps, f"time-{r.key}"), gpu)
                 for r, gpu in zip(rows, gpus)]
        rows = rows[len(batch):]
        for name, (launched, ended, rc) in _run_all(batch, deadline).items():
            key = name.removeprefix("time-")
            if rc == 0:
                timing["rows"][key] = read_run(root / name, launched, ended)
                print(f"{key:10s} step {timing['rows'][key]['step_s'] * 1000:6.1f} ms, start-up "
                      f"{timing['rows'][key]['startup_s']:5.1f} s, evaluation {timing['rows'][key]['eval_s']:5.1f} s",
                      flush=True)
            else:
                print(f"{key:10s} not timed (rc={rc}; log {root / name}.log)", flush=True)
        path.write_text(json.dumps({**timing, "measured": True}, indent=2))
    k = args.concurrent
    if k > 1 and "cyb" in timing["rows"] and str(k) not in timing["load"] and time.time() < deadline:
        batch = [(f"load{k}-cyb-{i}", _config(dc.BY_KEY["cyb"], files, root, args.steps, f"load{k}-cyb-{i}"), gpus[0])
                 for i in range(k)]
        ends = _run_all(batch, deadline)
        steps = [read_run(root / n, *ends[n][:2])["step_s"] for n, *_ in batch if ends[n][2] == 0]
        if len(steps) == k:
            timing["load"][str(k)] = statistics.fmean(steps) / timing["rows"]["cyb"]["step_s"]
            print(f"{k} CYB cells at once on one GPU: each {timing['load'][str(k)]:.2f}x slower", flush=True)
    device = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                            text=True).stdout.splitlines() if args.gpus != "cpu" else ["cpu"]
    timing.update(measured=True, device=device[0] if device else "", steps=args.steps)
    path.write_text(json.dumps(timing, indent=2))
    missing = [r.key for r in dc.ROWS if r.key not in timing["rows"]]
    print(f"wrote {path}" + (f"; not timed yet: {', '.join(missing)} (run again)" if missing else ""))
    best = args.best or "cyb-ad16"  # the CYB row best at one epoch (results/experiments/smollm2-epoch)
    plan = data_regime_plan.planned({}, [int(x) for x in args.seeds.split(",")], best)
    print(f"the plan: every figure cell, and 2x3 and 3x3 for the baseline and {best} (more passes where they "
          "still improve, and third seeds, come on top)")
    print(data_regime_plan.estimate(plan, data_regime_plan.load_timing(out), set(), hold_s=args.hold,
                                    per_gpu=max(1, args.per_gpu)))
    return 0
