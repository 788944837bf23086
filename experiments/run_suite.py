"""Small-scale reproductions of the paper's experiments on techdocs, scheduled over GPUs.

Every run is a plain ``cyb train`` of a config written next to its outputs (``OUT/SUITE/configs``).
Each row of ``docs/record/results/`` reruns from a fresh clone with the command recorded in
``summary.jsonl``: this script with ``--only`` the row, which writes the data splits (a
deterministic step: document ranges of techdocs' training file, the in-distribution part of its
held-out file, the shared BPE) and trains the row's base first where it fine-tunes one.

    python experiments/run_suite.py pretrain finetune hparams --seeds 0,1,2 \\
        --out results/experiments/text --gpus 0,1,2,3 --per-gpu 3 --deadline 560
    python experiments/run_suite.py pretrain --out /tmp/p --scale cpu-quick --gpus cpu   # smoke test

Run it from the repository root with techdocs in ``$CYB_DATA`` (default ``../shared/data/techdocs``;
any corpus of the same format, ``train.jsonl.gz`` and ``valid.jsonl.gz`` of ``{"text": ...}``
lines, works). The configs it writes hold paths relative to the repository root, so ``cyb
train OUT/SUITE/configs/NAME.yaml`` also reruns a run once the data under ``OUT/`` exist.

Suites (paper analogues; training data in a seeded random order over the whole corpus):

* ``pretrain`` (Table B.3): baseline, TBYS 3 pauses, CYB 3 pauses from scratch on all of
  techdocs for about one epoch.
* ``finetune`` (Table B.2): a base model pretrained without pauses on documents 0-3499 of
  techdocs (about one epoch of them), then fine-tuned on documents 3500 on (which the base never
  saw) as baseline, baseline 4x seq, TBYS 1/2/3 pauses and CYB 1/2/3 pauses.
* ``hparams`` (Fig. 5 and appendix D): CYB 3 pauses fine-tuned as above with omega 1:1:1:1 and
  4:1:1:4, gamma0 = 0.99, CYB-VA (rho 1:1:1:1) and CYB-DP (alpha 0.01, rho 1:1:1:1); the
  plain CYB 3 row of ``finetune`` is their reference.
* ``epochs``: baseline, TBYS 3 and CYB 3 pretrained for two epochs (seed 0 is enough to show the
  trend), evaluated every 400 steps.
* ``visibility``: shared against private pauses (``method.pause_visibility``) for TBYS 3 and
  CYB 3, beside the baseline, fine-tuned as ``finetune`` (``--scale cpu`` runs it on a CPU).
* ``smollm2``: SmolLM2-135M (``$CYB_SMOLLM2``, else ``cyb fetch smollm2-135m``'s folder)
  fine-tuned on all of techdocs for 500 steps of 32 x 256 real tokens at lr 1e-4: baseline, CYB
  3 pauses private and shared, TBYS 3 pauses private, CYB-decoupled private (``--scale smollm2``).
  More rows: TBYS 3 shared, CYB 1 and 2 pauses private and shared, LoRA (rank 16, lr 1e-3) for
  the baseline and private CYB 3, the baseline with 4x the context (``baseline_nx``,
  compute-matched), CYB-ponder tau=-0.05 private (docs/record/results/recipes.md), CYB 3 gated, and the
  quality-compute sweep: private CYB with the dk prior at 0.5 and 0.99, CYB-ponder at tau=-0.2
  and -0.5. ``cyb eval`` analyses seed 0 of every full fine-tuning row with dk and every seed of
  the sweep (H2 per step, pause statistics). ``--scale smollm2-epoch`` runs them for
  about one epoch (1,620 steps, checkpointed every 405 so that a cut run resumes).
* ``smollm2-arith`` (``--scale smollm2-arith``): SmolLM2-135M fine-tuned on 5-digit addition
  written as text (1,500 steps of 64 examples) as baseline, TBYS 3 and CYB 3 shared, private
  and gated and CYB-decoupled private and gated, scored by exact match three ways (``experiments/task_decoding.py``).
* ``reasoning-pilot`` and ``reasoning`` (``--scale smollm2-reasoning``; docs/record/results/reasoning.md):
  SmolLM2-135M fine-tuned on reasoning-gym tasks (the ``reasoning`` extra) and scored by each
  task's own verifier on answers generated in adaptive mode, with the measured decode time per
  answer at 256 rows at once. The pilot runs the baseline on every candidate task and keeps
  three on which it lands between 20% and 80% (``OUT/reasoning-choice.json``); the suite runs
  baseline, the baseline with 4x the steps (compute-matched), TBYS 3 private, CYB 3 private and
  gated, CYB-decoupled 3 private and CYB 3 private with pause-step adapters on them
  (``experiments/reasoning_suite.py``; ``bash experiments/reasoning_gpu.sh`` runs both).
* ``stability``: the ``pretrain`` suite's baseline and CYB 3 over five seeds (``--seeds
  0,1,2,3,4``), beside CYB with private pauses, with 400 warmup steps instead of 100, with peak
  lr 5e-4, and the baseline with 400 warmup steps: what narrows CYB's spread between seeds.
* ``recipes``: the training recipes beyond the paper (``cyb_anytime``, ``cyb_decoupled``,
  ``cyb_ponder`` at two costs, CYB-VA with a geometric rho as in PonderNet, CYB with gamma0 0.9
  held or annealed from 1 over half the steps) against baseline, TBYS 3 and
  CYB 3, fine-tuned as ``finetune`` (docs/record/results/recipes.md).

Every run is evaluated every 400 steps and at the end on the in-distribution part of the
held-out file (``valid.jsonl.gz`` without the documents of sources that have no training
document: the Jargon File, half of its text), in rows of 256 real tokens, and once more at the
end on the whole held-out file (``cyb eval --data``). Jobs run as separate processes, ``--per-gpu`` of them
on each GPU; fine-tuning jobs wait for their base. Results go to ``OUT/summary.jsonl`` (one line
per finished run) and, with ``--pack FILE``, into a ``.tar.gz`` of the run folders without
weights after every finished run (so a killed job still returns what finished).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from cyb import methods

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the repository root holds experiments/
    sys.path.insert(0, str(REPO))

from experiments.suite_runner import Job, close, gpu_slots, schedule  # noqa: E402

SPLIT_DOC = 3500  # documents [0, SPLIT_DOC) pretrain the fine-tuning base; the rest fine-tune it

SCALES = {
    # one job of several on an H100/H200: a from-scratch llama on techdocs
    "gpu": dict(hidden=384, layers=6, heads=6, block_len=256, batch=32, pre_steps=1600, epochs_steps=3200,
                base_steps=1000, ft_steps=400, vocab=8192, eval_every=400, warmup=100),
    # SmolLM2-135M fine-tuned on all of techdocs (suite smollm2): 32 x 256 real tokens per step
    "smollm2": dict(block_len=256, batch=32, ft_steps=500, eval_every=250, warmup=50, lr=1e-4,
                    pre_steps=0, vocab=0, compile=1, save_every=250),
    # the same for about one epoch (1,620 steps of 51,825 blocks), checkpointed to resume
    "smollm2-epoch": dict(block_len=256, batch=32, ft_steps=1620, eval_every=405, warmup=50, lr=1e-4,
                          pre_steps=0, vocab=0, compile=1, save_every=405),
    # SmolLM2-135M fine-tuned on 5-digit addition written as text (suite smollm2-arith)
    "smollm2-arith": dict(task="addition", digits=5, batch=64, ft_steps=1500, eval_every=500, warmup=50,
                          lr=1e-4, train_examples=100000, valid_examples=500, pre_steps=0, vocab=0, compile=0),
    # SmolLM2-135M fine-tuned on reasoning-gym tasks (suites reasoning-pilot and reasoning): 600 steps of
    # 64 questions (one epoch of 38,400), 256 held-out questions decoded at once; checkpointed to resume
    "smollm2-reasoning": dict(batch=64, ft_steps=600, eval_every=300, warmup=30, lr=1e-4, train_examples=38400,
                              valid_examples=256, save_every=200, pre_steps=0, vocab=0, compile=0),
    # the same rows on a tiny model in seconds (the CPU smoke test: CYB_SMOLLM2 names the model)
    "reasoning-quick": dict(batch=4, ft_steps=2, eval_every=0, warmup=1, lr=1e-2, train_examples=16,
                            valid_examples=4, save_every=0, pre_steps=0, vocab=0, compile=0),
    # a small model on a 2-core CPU: minutes per run
    "cpu": dict(hidden=128, layers=4, heads=4, block_len=64, batch=16, pre_steps=600, epochs_steps=1200,
                base_steps=600, ft_steps=200, vocab=2048, eval_every=100, warmup=30),
    # a CPU smoke test of the whole pipeline
    "cpu-quick": dict(hidden=32, layers=1, heads=2, block_len=16, batch=4, pre_steps=6, epochs_steps=8,
                      base_steps=6, ft_steps=4, vocab=300, eval_every=3, warmup=2),
}


def data_dir() -> Path:
    """techdocs: ``$CYB_DATA`` or ``../shared/data/techdocs`` beside the repository."""
    env = os.environ.get("CYB_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data" / "techdocs"


# ----------------------------------------------------------------------------------- data


def prepare_data(out: Path, s: dict, scale: str) -> dict:
    """The BPE shared by every run and the two document ranges of the fine-tuning suites."""
    from cyb.data.sources import iter_texts
    from cyb.data.tokenizer import train_bpe_tokenizer

    d = out / "data"
    d.mkdir(parents=True, exist_ok=True)
    split = 40 if scale == "cpu-quick" else SPLIT_DOC
    files = {"train": data_dir() / "train.jsonl.gz", "valid": data_dir() / "valid.jsonl.gz",
             "base": d / "docs-base.jsonl.gz", "ft": d / "docs-finetune.jsonl.gz", "tokenizer": out / "tokenizer"}
    files["valid_in"] = d / "valid-in-distribution.jsonl.gz"
    if not files["ft"].is_file():
        with gzip.open(files["base"], "wt") as a, gzip.open(files["ft"], "wt") as b:
            for i, text in enumerate(iter_texts(files["train"])):
                (a if i < split else b).write(json.dumps({"text": text}) + "\n")
    if not files["valid_in"].is_file():
        write_in_distribution(files["train"], files["valid"], files["valid_in"])
    if s.get("vocab") and not (files["tokenizer"] / "tokenizer.json").is_file():
        docs = list(itertools.islice(iter_texts(files["train"]), 2000))
        train_bpe_tokenizer(docs, s["vocab"], files["tokenizer"])
    # paths as the configs hold them: relative to the working directory (the repository root)
    return {k: os.path.relpath(v) for k, v in files.items()}


def _source_of(record: dict) -> str:
    return str(record.get("source", "")).split("/")[0]


def write_in_distribution(train: Path, valid: Path, out: Path) -> None:
    """The held-out documents whose source (the first part of their ``source`` field) also
    has training documents. techdocs' held-out file is half one document (the Jargon File)
    of a source that training never sees; scored alone, the whole file mostly measures transfer
    to it."""
    with gzip.open(train, "rt") as f:
        seen = {_source_of(json.loads(line)) for line in f if line.strip()}
    with gzip.open(valid, "rt") as f, gzip.open(out, "wt") as g:
        for line in f:
            if line.strip() and _source_of(json.loads(line)) in seen:
                g.write(line)


# ----------------------------------------------------------------------------------- jobs


def config(s: dict, files: dict, out: Path, name: str, seed: int, method: dict, *, source: str = "train",
           steps: int | None = None, base: str | None = None) -> dict:
    model = ({"name_or_path": base} if base else
             {"arch": "llama", "hidden_size": s["hidden"], "num_layers": s["layers"], "num_heads": s["heads"],
              "max_position_embeddings": 8 * s["block_len"] * 4})
    data = {"source": files[source], "valid_source": files["valid_in"], "block_len": s["block_len"], "shuffle": "corpus"}
    if not base:
        data["tokenizer"] = files["tokenizer"]
    return {
        "model": model,
        "method": method,
        "data": data,
        "optim": {"lr": 3.0e-4 if base else 1.0e-3, "warmup_steps": s["warmup"]},
        "train": {"out_dir": str(out / name), "steps": steps or s["pre_steps"], "batch_size": s["batch"],
                  "eval_every": s["eval_every"], "eval_batches": 0, "save_every": 0, "log_every": 20,
                  "seed": seed, "progress": False},
    }


def method(name: str, pauses: int = 3, **extra) -> dict:
    return {"name": name, "num_steps": pauses + 1, **extra}


def plural(p: int) -> str:
    return f"{p} pause{'s' * (p > 1)}"


def smollm2_model() -> str:
    """The SmolLM2-135M folder of the smollm2 suite: ``$CYB_SMOLLM2``, else the short name
    (fetched on first use)."""
    return os.environ.get("CYB_SMOLLM2", "smollm2-135m")


def visibility_suffix(m: dict) -> str:
    """``-private`` or ``-gated`` in the run names of methods whose pauses are not shared."""
    visibility = m.get("pause_visibility", "shared")
    return "" if visibility == "shared" else f"-{visibility}"


def sweep_suffix(m: dict) -> str:
    """``-dk0.5`` (a dk prior other than the default), ``-tau-0.2`` (a ponder cost other than
    the recipe's -0.05) or ``-adapters16`` (pause-step adapters of that rank) in run names."""
    suffix = f"-dk{m['psi_dk']:g}" if "psi_dk" in m else ""
    if m["name"] == "cyb_ponder" and m.get("ponder_cost", -0.05) != -0.05:
        suffix += f"-tau{m['ponder_cost']:g}"
    if m.get("pause_adapter_rank"):
        suffix += f"-adapters{m['pause_adapter_rank']}"
    return suffix


def smollm2_config(s: dict, run: Path, seed: int, m: dict, data: dict, *, lr: float, save_every: int,
                   log_every: int) -> dict:
    """The config of one SmolLM2-135M fine-tuning run of scale ``s`` into the folder ``run``."""
    return {"model": {"name_or_path": smollm2_model()}, "method": m, "data": data,
            "optim": {"lr": lr, "warmup_steps": s["warmup"]},
            "train": {"out_dir": str(run), "steps": s["ft_steps"], "batch_size": s["batch"],
                      "eval_every": s["eval_every"], "eval_batches": 0, "save_every": save_every, "keep_last": 1,
                      "log_every": log_every, "seed": seed, "progress": False, "compile": bool(s["compile"])}}


def smollm2_jobs(seed: int, s: dict, files: dict, out: Path) -> list[Job]:
    """SmolLM2-135M fine-tuned on techdocs with and without pauses, shared and private, fully
    and with LoRA adapters (rank 16, lr 1e-3)."""
    lora = {"rank": 16, "alpha": 32.0}
    rows = [("Baseline", method("baseline"), None, 0.3),
            ("CYB 3 pauses, private", method("cyb", pause_visibility="private"), None, 1.0),
            ("CYB 3 pauses, shared", method("cyb"), None, 1.0),
            ("TBYS 3 pauses, private", method("tbys", pause_visibility="private"), None, 1.0),
            ("CYB-decoupled 3 pauses, private", method("cyb_decoupled", pause_visibility="private"), None, 1.0),
            ("TBYS 3 pauses, shared", method("tbys"), None, 1.0),
            ("CYB 1 pause, private", method("cyb", 1, pause_visibility="private"), None, 0.5),
            ("CYB 2 pauses, private", method("cyb", 2, pause_visibility="private"), None, 0.75),
            ("Baseline, LoRA", method("baseline"), lora, 0.3),
            ("CYB 3 pauses, private, LoRA", method("cyb", pause_visibility="private"), lora, 1.0),
            ("CYB 1 pause, shared", method("cyb", 1), None, 0.5),
            ("CYB 2 pauses, shared", method("cyb", 2), None, 0.75),
            ("Baseline 4xseq", method("baseline_nx", seq_multiplier=4), None, 1.0),
            ("CYB-ponder tau=-0.05, private", method("cyb_ponder", ponder_cost=-0.05, pause_visibility="private"),
             None, 1.0),
            ("CYB 3 pauses, gated", method("cyb", pause_visibility="gated"), None, 1.0),
            # the quality-compute sweep: private CYB pausing more or less than the paper's prior
            ("CYB 3 pauses, private, dk prior 0.5", method("cyb", psi_dk=0.5, pause_visibility="private"),
             None, 1.0),
            ("CYB 3 pauses, private, dk prior 0.99", method("cyb", psi_dk=0.99, pause_visibility="private"),
             None, 1.0),
            ("CYB-ponder tau=-0.2, private", method("cyb_ponder", ponder_cost=-0.2, pause_visibility="private"),
             None, 1.0),
            ("CYB-ponder tau=-0.5, private", method("cyb_ponder", ponder_cost=-0.5, pause_visibility="private"),
             None, 1.0),
            # pause-step adapters (rank 16, the rest fully fine-tuned), for the one-epoch rows
            ("CYB 3 pauses, private, pause adapters r16", method("cyb", pause_visibility="private",
                                                                 pause_adapter_rank=16, pause_adapter_alpha=32.0),
             None, 1.1)]
    jobs = []
    for rank, (label, m, adapters, cost) in enumerate(rows):
        name = f"sm-{'lora-' if adapters else ''}{m['name']}-p{m['num_steps'] - 1}{sweep_suffix(m)}" \
               f"{visibility_suffix(m)}-s{seed}"
        data = {"source": files["train"], "valid_source": files["valid_in"], "block_len": s["block_len"],
                "shuffle": "corpus"}
        cfg = smollm2_config(s, out / name, seed, m, data, lr=1e-3 if adapters else s["lr"],
                             save_every=s["save_every"], log_every=20)
        if adapters:
            cfg["lora"] = adapters
        # seed 0 of every row first, then the baseline and private CYB of the other seeds
        priority = 100 - rank if seed == 0 else (50 - rank if rank < 2 else 10 - rank)
        # pause statistics and H2's calibration: seed 0 of every row with dk, every seed of the sweep
        analyse = methods.spec(m["name"]).has_dk and not adapters and (seed == 0 or bool(sweep_suffix(m)))
        jobs.append(Job(name, "smollm2", label, seed, cfg, cost=cost, priority=priority, analyse=analyse))
    return jobs


def arithmetic_jobs(seed: int, s: dict, out: Path) -> list[Job]:
    """SmolLM2-135M fine-tuned on an arithmetic task written as text (``s["task"]``), scored by
    exact match of teacher-forced greedy answers and of free-running fixed and adaptive decoding
    (``experiments/task_decoding.py``)."""
    rows = [("Baseline", method("baseline")),
            ("TBYS 3 pauses, private", method("tbys", pause_visibility="private")),
            ("TBYS 3 pauses, shared", method("tbys")),
            ("CYB 3 pauses, private", method("cyb", pause_visibility="private")),
            ("CYB 3 pauses, shared", method("cyb")),
            ("CYB-decoupled 3 pauses, private", method("cyb_decoupled", pause_visibility="private")),
            ("TBYS 3 pauses, gated", method("tbys", pause_visibility="gated")),
            ("CYB 3 pauses, gated", method("cyb", pause_visibility="gated")),
            ("CYB-decoupled 3 pauses, gated", method("cyb_decoupled", pause_visibility="gated")),
            # an ablation: the pause tokens' embedding rows kept as they start (no extra parameters)
            ("CYB 3 pauses, private, pause rows frozen", method("cyb", pause_visibility="private",
                                                                pause_rows="frozen"))]
    jobs = []
    for label, m in rows:
        frozen = "-frozenrows" if m.get("pause_rows") == "frozen" else ""
        name = f"ar-{m['name']}-p{m['num_steps'] - 1}{visibility_suffix(m)}{frozen}-s{seed}"
        data = {"task": s["task"], "task_kwargs": {"digits": s["digits"]},
                "num_train_examples": s["train_examples"], "num_valid_examples": s["valid_examples"]}
        cfg = smollm2_config(s, out / name, seed, m, data, lr=s["lr"], save_every=0, log_every=50)
        jobs.append(Job(name, "smollm2-arith", label, seed, cfg, cost=0.5, task=True))
    # the baseline given the pause rows' training compute (M = 4 positions per real token): 4x the
    # steps over the same sums, and 4x the steps over 4x as many (the generator has no end)
    for label, short, data_times in [("Baseline, 4x the steps (compute-matched)", "4xsteps", 1),
                                     ("Baseline, 4x the steps and the data (compute-matched)", "4xdata", 4)]:
        name = f"ar-baseline-{short}-s{seed}"
        scaled = dict(s, ft_steps=4 * s["ft_steps"], eval_every=4 * s["eval_every"])
        data = {"task": s["task"], "task_kwargs": {"digits": s["digits"]},
                "num_train_examples": data_times * s["train_examples"], "num_valid_examples": s["valid_examples"]}
        # checkpointed every quarter: longer than a GPU call, they resume in the next one
        cfg = smollm2_config(scaled, out / name, seed, method("baseline"), data, lr=s["lr"],
                             save_every=s["ft_steps"], log_every=50)
        jobs.append(Job(name, "smollm2-arith", label, seed, cfg, cost=2.0, priority=-1, task=True))
    return jobs


def reasoning_jobs(seed: int, s: dict, out: Path, *, pilot: bool = False) -> list[Job]:
    """SmolLM2-135M fine-tuned on reasoning-gym tasks (``experiments/reasoning_suite.py``): every
    row on the tasks of ``s["tasks"]``, or with ``pilot`` the seed-0 baseline on every candidate."""
    from experiments import reasoning_suite as rs

    tasks = list(rs.TASKS) if pilot else s["tasks"]
    jobs = []
    for task in tasks:
        for rank, (label, short, m, cost, times, data_times) in enumerate(rs.rows()):
            if pilot and short != "baseline":
                continue
            name = rs.run_name(task, short, seed)
            scaled = dict(s, ft_steps=s["ft_steps"] * times, eval_every=s["eval_every"] * times,
                          save_every=s["save_every"] * times)
            cfg = smollm2_config(scaled, out / name, seed, method(**m), rs.task_config(task, s, data_times),
                                 lr=s["lr"], save_every=scaled["save_every"], log_every=50)
            # every row's seed 0 first, then seed 1, ...; the compute-matched baselines last
            order = 100 * (times > 1) + 10 * seed + rank
            jobs.append(Job(name, "reasoning-pilot" if pilot else "reasoning", f"{label} [{task}]", seed, cfg,
                            cost=cost, priority=-order, reasoning=True, row={"task": task}))
    return jobs


def stability_jobs(seed: int, s: dict, files: dict, out: Path) -> list[Job]:
    """CYB pretrained from scratch as in ``pretrain``, beside the baseline, with the candidates
    that hold up its early pauses: private pauses and a four times longer warmup (and a lower
    peak learning rate)."""
    rows = [("Baseline", "base", method("baseline"), {}, 1.0),
            ("CYB 3 pauses", "cyb", method("cyb"), {}, 1.4),
            ("CYB 3 pauses, private", "cyb-private", method("cyb", pause_visibility="private"), {}, 1.4),
            ("CYB 3 pauses, warmup 400", "cyb-warmup400", method("cyb"), {"warmup_steps": 400}, 1.4),
            ("CYB 3 pauses, lr 5e-4", "cyb-lr5e-4", method("cyb"), {"lr": 5e-4}, 1.4),
            ("Baseline, warmup 400", "base-warmup400", method("baseline"), {"warmup_steps": 400}, 1.0)]
    jobs = []
    for rank, (label, short, m, optim, cost) in enumerate(rows):
        name = f"st-{short}-s{seed}"
        cfg = config(s, files, out, name, seed, m)
        cfg["optim"].update(optim)
        jobs.append(Job(name, "stability", label, seed, cfg, cost=cost, priority=-rank))
    return jobs


def suite_jobs(suite: str, seed: int, s: dict, files: dict, out: Path) -> list[Job]:
    jobs = []
    if suite == "smollm2":
        return smollm2_jobs(seed, s, files, out)
    if suite == "smollm2-arith":
        return arithmetic_jobs(seed, s, out)
    if suite in ("reasoning", "reasoning-pilot"):
        return reasoning_jobs(seed, s, out, pilot=suite == "reasoning-pilot")
    if suite == "stability":
        return stability_jobs(seed, s, files, out)
    if suite in ("pretrain", "epochs"):
        steps = s["pre_steps"] if suite == "pretrain" else s["epochs_steps"]
        tag = "" if suite == "pretrain" else "-2ep"
        for label, m, cost in [("Baseline", method("baseline"), 1.0), ("TBYS 3 pauses", method("tbys"), 1.4),
                               ("CYB 3 pauses", method("cyb"), 1.4)]:
            name = f"pre-{m['name']}{tag}-s{seed}"
            jobs.append(Job(name, suite, label, seed, config(s, files, out, name, seed, m, steps=steps),
                            analyse=m["name"] == "cyb" and seed == 0, cost=cost * steps / s["pre_steps"]))
        return jobs
    base = f"base-s{seed}"
    base_dir = str(out / base / "final")  # relative to the repository root, as every path
    if suite == "recipes":  # training recipes beyond the paper against the paper's methods
        plan = [("Baseline", method("baseline"), 0.25), ("TBYS 3 pauses", method("tbys"), 0.56),
                ("CYB 3 pauses", method("cyb"), 0.56),
                ("CYB-anytime w=0.1", method("cyb_anytime", aux_weight=0.1), 0.56),
                ("CYB-anytime w=0.3", method("cyb_anytime", aux_weight=0.3), 0.56),
                ("CYB-decoupled", method("cyb_decoupled"), 0.56),
                ("CYB-ponder tau=-0.05", method("cyb_ponder", ponder_cost=-0.05), 0.56),
                ("CYB-VA rho=geometric(1/2)", method("cyb_va", rho=[0.5, 0.25, 0.125, 0.125]), 0.56),
                ("CYB gamma0=0.9", method("cyb", gamma0=0.9), 0.56),
                ("CYB gamma0=0.9 annealed over half", method("cyb", gamma0=0.9, gamma0_anneal_steps=s["ft_steps"] // 2), 0.56),
                ("CYB-ponder tau=-0.02", method("cyb_ponder", ponder_cost=-0.02), 0.56)]
    elif suite == "finetune":
        jobs.append(Job(base, suite, "Pretrained base, not fine-tuned", seed,
                        config(s, files, out, base, seed, method("baseline"), source="base", steps=s["base_steps"]),
                        cost=0.7, first=True))
        plan = [("Baseline", method("baseline"), 0.25), ("Baseline 4xseq", method("baseline_nx", seq_multiplier=4), 1.0)]
        plan += [(f"TBYS {plural(p)}", method("tbys", p), 0.2 + 0.12 * p) for p in (1, 2, 3)]
        plan += [(f"CYB {plural(p)}", method("cyb", p), 0.2 + 0.12 * p) for p in (1, 2, 3)]
    elif suite == "visibility":  # shared against private pauses, fine-tuned as finetune
        plan = [("Baseline", method("baseline"), 0.25),
                ("TBYS 3 pauses, shared", method("tbys"), 0.56),
                ("TBYS 3 pauses, private", method("tbys", pause_visibility="private"), 0.56),
                ("CYB 3 pauses, shared", method("cyb"), 0.56),
                ("CYB 3 pauses, private", method("cyb", pause_visibility="private"), 0.56)]
    else:
        plan = [("CYB w=1:1:1:1", method("cyb", omega=[1, 1, 1, 1]), 0.56),
                ("CYB w=4:1:1:4", method("cyb", omega=[4, 1, 1, 4]), 0.56),
                ("CYB gamma0=0.99", method("cyb", gamma0=0.99), 0.56),
                ("CYB-VA rho=1:1:1:1", method("cyb_va", rho=[1, 1, 1, 1]), 0.56),
                ("CYB-DP a=0.01 rho=1:1:1:1", method("cyb_dp", rho=[1, 1, 1, 1], alpha=0.01), 0.56)]
    for label, m, cost in plan:
        short = {"baseline": "base", "baseline_nx": "base4x"}.get(m["name"], m["name"])
        if suite == "recipes":
            short = "rc-" + short
        if suite == "visibility":
            short = "vis-" + short
        suffix = "".join(f"-{k}{'_'.join(map(str, v)) if isinstance(v, list) else v}"
                         for k, v in m.items() if k not in ("name", "num_steps", "seq_multiplier",
                                                            "pause_visibility"))
        suffix += visibility_suffix(m)
        name = f"ft-{short}-p{m['num_steps'] - 1}{suffix}-s{seed}"
        jobs.append(Job(name, suite, label, seed,
                        config(s, files, out, name, seed, m, source="ft", steps=s["ft_steps"], base=base_dir),
                        needs=base, cost=cost,
                        analyse=seed == 0 and methods.spec(m["name"]).has_dk and m["num_steps"] == 4))
    return jobs


def select(jobs: list[Job], parts: list[str]) -> list[Job]:
    """The jobs whose names contain one of ``parts``, and the bases they fine-tune; the jobs of
    an earlier part start before those of a later one."""
    first = {j.name: min(i for i, part in enumerate(parts) if part in j.name)
             for j in jobs if any(part in j.name for part in parts)}
    keep = set(first) | {j.needs for j in jobs if j.name in first and j.needs}
    return [replace(j, priority=j.priority + 1000 * (len(parts) - first[j.name]))
            if j.name in first else j for j in jobs if j.name in keep]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suites", nargs="+", choices=("pretrain", "finetune", "hparams", "epochs", "recipes",
                                                 "visibility", "smollm2", "smollm2-arith",
                                                 "stability", "reasoning-pilot", "reasoning"))
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--scale", default="gpu", choices=sorted(SCALES))
    p.add_argument("--seeds", default="0", help="comma-separated seeds")
    p.add_argument("--gpus", default="0", help="comma-separated GPU indices, or cpu")
    p.add_argument("--per-gpu", type=int, default=1, help="jobs at a time on each GPU")
    p.add_argument("--deadline", type=float, default=None, help="seconds from now after which running jobs "
                   "are killed and no new job starts")
    p.add_argument("--grace", type=float, default=0.0, help="seconds past --deadline that a job scoring its "
                   "trained model is given to finish (a kill there loses the scores of a whole training)")
    p.add_argument("--unit-seconds", type=float, default=0.0,
                   help="expected seconds of a cost-1 job (a one-epoch baseline) under this load: jobs "
                        "that would end after the deadline are not started")
    p.add_argument("--pack", type=Path, default=None, help="write a .tar.gz of the results after every run")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scale parameter, e.g. --set pre_steps=800")
    p.add_argument("--tasks", default=None, metavar="A,B,C",
                   help="reasoning: the reasoning-gym tasks (candidates of experiments/reasoning_suite.py); "
                        "default: the pilot's choice in OUT/reasoning-choice.json")
    p.add_argument("--again", nargs="+", default=(), metavar="PART",
                   help="run the jobs whose names contain one of these parts again though they finished "
                        "elsewhere (their models are not in --out), e.g. to time their decoding on this machine")
    p.add_argument("--only", nargs="+", default=None, metavar="PART",
                   help="run only the jobs whose name contains one of these parts (and the bases "
                        "they fine-tune), e.g. --only rc-cyb-p3 ponder_cost-0.02")
    args = p.parse_args()
    s = dict(SCALES[args.scale])
    for item in args.set:
        k, v = item.split("=", 1)
        s[k] = type(s[k])(v)
    out = Path(os.path.relpath(args.out.resolve()))
    out.mkdir(parents=True, exist_ok=True)
    if {"reasoning", "reasoning-pilot"} & set(args.suites):  # SmolLM2 on generated tasks: no text data
        from experiments import reasoning_suite

        files = {}
        s["tasks"] = reasoning_suite.tasks_of(out, args.tasks)
    else:
        files = prepare_data(out, s, args.scale)
    seeds = [int(x) for x in args.seeds.split(",")]
    jobs = [j for suite in args.suites for seed in (seeds[:1] if suite == "epochs" else seeds)
            for j in suite_jobs(suite, seed, s, files, out)]  # two epochs: the first seed shows the trend
    if {"hparams", "recipes", "visibility"} & set(args.suites) and "finetune" not in args.suites:  # they need the bases
        jobs += [j for seed in seeds for j in suite_jobs("finetune", seed, s, files, out) if j.name.startswith("base-")]
    if args.only:
        jobs = select(jobs, args.only)
    slots = gpu_slots(args.gpus, args.per_gpu)
    (out / "scale.json").write_text(json.dumps({"scale": args.scale, **s}, indent=2))
    deadline = time.time() + args.deadline if args.deadline else float("inf")
    rows = schedule(jobs, out, slots, deadline, args.pack, args.unit_seconds, files.get("valid", ""), args.scale,
                    tuple(args.again), args.grace)
    if "reasoning-pilot" in args.suites:
        from experiments import reasoning_suite

        choice = reasoning_suite.write_choice(out, rows)
        print(f"pilot: {json.dumps(choice)}" if choice else "pilot: not every candidate has a score yet")
    close(rows, {j.name for j in jobs}, out, args.pack, "runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
