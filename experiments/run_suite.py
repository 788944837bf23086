"""Small-scale reproductions of the paper's experiments, one suite at a time.

Every run is a plain ``cyb train`` of a config written next to its outputs, so each row of
``docs/results.md`` can be rerun with the command recorded in ``summary.json``.

    python experiments/run_suite.py pretrain --out results/pretrain --scale gpu
    python experiments/run_suite.py finetune --out results/finetune --scale gpu
    python experiments/run_suite.py hparams  --out results/hparams  --scale gpu
    python experiments/run_suite.py pretrain --out /tmp/p --scale cpu-quick    # smoke test

Suites (paper analogues):

* ``pretrain`` (Table B.3): baseline, TBYS 3 pauses, CYB 3 pauses from scratch.
* ``finetune`` (Table B.2): a base model pretrained without pauses, then fine-tuned as
  baseline, baseline 4x seq, TBYS 1/2/3 pauses and CYB 1/2/3 pauses.
* ``hparams`` (Fig. 5 and appendix D): CYB with omega 1:1:1:1 and 4:1:1:4, gamma0 = 0.99,
  CYB-VA with three rho, CYB-DP with alpha 0.1 / 0.01 and three rho, all fine-tuned from the base.
* ``pretrain_init``: TBYS and CYB of ``pretrain`` with randomly drawn pause rows (an ablation
  of ``model.pause_init``, whose default sets them to the mean of the other rows).

The synthetic tasks at GPU scale are run by ``experiments/demo_sweep.py gpu``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

SCALES = {
    # one H100/H200: from-scratch llama on techdocs
    "gpu": dict(hidden=384, layers=6, heads=6, block_len=256, batch=32, pre_steps=1200,
                ft_steps=400, base_steps=1200, vocab=8192, eval_batches=40,
                warmup=100, eval_tokens=100000, pause_init="mean"),
    # a CPU smoke test of the whole pipeline
    "cpu-quick": dict(hidden=32, layers=1, heads=2, block_len=16, batch=4, pre_steps=6,
                      ft_steps=4, base_steps=6, vocab=300, eval_batches=2, warmup=2,
                      eval_tokens=500, pause_init="mean"),
}


def data_dir() -> Path:
    """techdocs: ``$CYB_DATA`` or ``../shared/data/techdocs`` beside the repository."""
    env = os.environ.get("CYB_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data" / "techdocs"


def base_config(s: dict, out: Path, name: str, seed: int) -> dict:
    d = data_dir()
    return {
        "model": {"arch": "llama", "hidden_size": s["hidden"], "num_layers": s["layers"],
                  "num_heads": s["heads"], "max_position_embeddings": 8 * s["block_len"] * 4,
                  "pause_init": s["pause_init"]},
        "method": {"name": "baseline", "num_steps": 4},
        "data": {"source": str(d / "train.jsonl.gz"), "valid_source": str(d / "valid.jsonl.gz"),
                 "bpe_vocab_size": s["vocab"], "bpe_train_docs": 2000, "block_len": s["block_len"],
                 "tokenizer": str(out / "tokenizer")},
        "optim": {"lr": 1.0e-3, "warmup_steps": s["warmup"]},
        "train": {"out_dir": str(out / name), "steps": s["pre_steps"], "batch_size": s["batch"],
                  "eval_every": 0, "eval_batches": s["eval_batches"], "save_every": 0,
                  "log_every": 20, "seed": seed, "progress": False},
    }


def method(name: str, pauses: int = 3, **extra) -> dict:
    return {"name": name, "num_steps": pauses + 1, **extra}


def ensure_tokenizer(s: dict, out: Path) -> None:
    """Train the suite's BPE once so every run shares it."""
    tok = out / "tokenizer"
    if (tok / "tokenizer.json").is_file():
        return
    import itertools

    from cyb.data.sources import iter_texts
    from cyb.data.tokenizer import train_bpe_tokenizer

    docs = itertools.islice(iter_texts(data_dir() / "train.jsonl.gz"), 2000)
    train_bpe_tokenizer(docs, s["vocab"], tok)


def run(cfg: dict, out: Path, label: str, summary: list, s: dict, *, analyse: bool = False) -> dict:
    name = Path(cfg["train"]["out_dir"]).name
    cfg_path = out / "configs" / f"{name}.yaml"
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    cmd = [sys.executable, "-m", "cyb", "train", str(cfg_path)]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    row = {"name": name, "label": label, "command": "cyb train " + str(cfg_path.relative_to(out.parent)),
           "seconds": round(time.time() - t0, 1), "returncode": proc.returncode,
           "method": cfg["method"]}
    (out / "logs").mkdir(exist_ok=True)
    (out / "logs" / f"{name}.log").write_text(proc.stdout[-20000:] + proc.stderr[-20000:])
    metrics_file = Path(cfg["train"]["out_dir"]) / "final_metrics.json"
    if proc.returncode == 0 and metrics_file.is_file():
        row["final"] = json.loads(metrics_file.read_text())
        rows = [json.loads(x) for x in (Path(cfg["train"]["out_dir"]) / "metrics.jsonl").read_text().splitlines()]
        tps = [r["tokens_per_s"] for r in rows if r.get("split") == "train" and "tokens_per_s" in r]
        row["tokens_per_s"] = sorted(tps)[len(tps) // 2] if tps else None
        if analyse:
            ev = subprocess.run([sys.executable, "-m", "cyb", "eval", cfg["train"]["out_dir"],
                                 "--out", str(Path(cfg["train"]["out_dir"]) / "eval"),
                                 "--tokens", str(s["eval_tokens"]), "--no-progress"],
                                capture_output=True, text=True)
            row["eval_returncode"] = ev.returncode
            (out / "logs" / f"{name}.eval.log").write_text(ev.stdout[-20000:] + ev.stderr[-20000:])
    summary.append(row)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    status = f"ppl {row['final'].get('ppl'):.3f}" if "final" in row else f"FAILED rc={proc.returncode}"
    print(f"[{time.strftime('%H:%M:%S')}] {label:28s} {status} ({row['seconds']} s)", flush=True)
    return row


def suite_pretrain(s, out, seed, summary):
    for label, m in [("Baseline", method("baseline")), ("TBYS 3 pauses", method("tbys")),
                     ("CYB 3 pauses", method("cyb"))]:
        cfg = base_config(s, out, f"{m['name']}-p{m['num_steps'] - 1}-s{seed}", seed)
        cfg["method"] = m
        run(cfg, out, label, summary, s, analyse=m["name"] == "cyb")


def _pretrain_base(s, out, seed, summary) -> str:
    shared = out.parent / "finetune" / f"base-s{seed}" / "final"
    if (shared / "model.safetensors").is_file():
        return str(shared)  # the fine-tuning suite's base, when it ran in the same job
    cfg = base_config(s, out, f"base-s{seed}", seed)
    cfg["train"]["steps"] = s["base_steps"]
    base_dir = Path(cfg["train"]["out_dir"]) / "final"
    if not (base_dir / "model.safetensors").is_file():
        run(cfg, out, "Pretrained base (no pauses)", summary, s)
    return str(base_dir)


def _finetune(s, out, base: str, name: str, seed: int) -> dict:
    cfg = base_config(s, out, name, seed)
    cfg["model"] = {"name_or_path": base}
    cfg["data"].pop("tokenizer")
    cfg["train"]["steps"] = s["ft_steps"]
    cfg["optim"] = {"lr": 3.0e-4, "warmup_steps": s["warmup"]}
    return cfg


def suite_finetune(s, out, seed, summary):
    base = _pretrain_base(s, out, seed, summary)
    plan = [("Baseline", method("baseline")),
            ("Baseline 4xseq", method("baseline_nx", seq_multiplier=4))]
    plan += [(f"TBYS {p} pause{'s' * (p > 1)}", method("tbys", p)) for p in (1, 2, 3)]
    plan += [(f"CYB {p} pause{'s' * (p > 1)}", method("cyb", p)) for p in (1, 2, 3)]
    for label, m in plan:
        cfg = _finetune(s, out, base, f"ft-{m['name']}-p{m['num_steps'] - 1}-s{seed}", seed)
        cfg["method"] = m
        run(cfg, out, label, summary, s, analyse=m["name"] == "cyb" and m["num_steps"] == 4)


def suite_hparams(s, out, seed, summary):
    base = _pretrain_base(s, out, seed, summary)
    rhos = {"0:0:0:1": [0.01, 0.01, 0.01, 0.97], "1:1:1:1": [1, 1, 1, 1], "4:1:1:4": [4, 1, 1, 4]}
    plan = [("CYB w=0:0:0:1", method("cyb")),
            ("CYB gamma0=0.99", method("cyb", gamma0=0.99)),
            ("CYB w=1:1:1:1", method("cyb", omega=[1, 1, 1, 1])),
            ("CYB w=4:1:1:4", method("cyb", omega=[4, 1, 1, 4]))]
    plan += [(f"CYB-VA rho={k}", method("cyb_va", rho=v)) for k, v in rhos.items()]
    dp_rhos = {"0:0:0:1": [0, 0, 0, 1], "1:1:1:1": [1, 1, 1, 1], "4:1:1:4": [4, 1, 1, 4]}
    plan += [(f"CYB-DP a={a} rho={k}", method("cyb_dp", rho=v, alpha=a))
             for a in (0.1, 0.01) for k, v in dp_rhos.items()]
    for i, (label, m) in enumerate(plan):
        cfg = _finetune(s, out, base, f"hp{i:02d}-{m['name']}-s{seed}", seed)
        cfg["method"] = m
        run(cfg, out, label, summary, s, analyse=i < 4)


def suite_pretrain_init(s, out, seed, summary):
    """TBYS and CYB pretrained with randomly drawn pause rows instead of the mean of the others."""
    for label, m in [("TBYS 3 pauses, random pause rows", method("tbys")),
                     ("CYB 3 pauses, random pause rows", method("cyb"))]:
        cfg = base_config(s, out, f"{m['name']}-p{m['num_steps'] - 1}-randinit-s{seed}", seed)
        cfg["method"] = m
        cfg["model"]["pause_init"] = "random"
        run(cfg, out, label, summary, s)


SUITES = {"pretrain": suite_pretrain, "finetune": suite_finetune, "hparams": suite_hparams,
          "pretrain_init": suite_pretrain_init}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suites", nargs="+", choices=sorted(SUITES))
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--scale", default="gpu", choices=sorted(SCALES))
    p.add_argument("--seeds", default="0", help="comma-separated seeds")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scale parameter, e.g. --set pre_steps=800")
    args = p.parse_args()
    s = dict(SCALES[args.scale])
    for item in args.set:
        k, v = item.split("=", 1)
        s[k] = type(s[k])(v)
    for suite in args.suites:
        out = args.out / suite
        out.mkdir(parents=True, exist_ok=True)
        summary_file = out / "summary.json"
        summary = json.loads(summary_file.read_text()) if summary_file.is_file() else []
        ensure_tokenizer(s, out)
        for seed in (int(x) for x in args.seeds.split(",")):
            SUITES[suite](s, out, seed, summary)
        (out / "scale.json").write_text(json.dumps({"scale": args.scale, **s}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
