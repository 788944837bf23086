#!/usr/bin/env bash
# LoRA on GPUs: what the CPU tests cannot check. Needs 2 GPUs; about 5 minutes.
#
#   PYTHONPATH=$PWD/src bash benchmarks/lora_gpu_check.sh      # from the repository root
#
# Two small random bases (a Llama with its own output projection, a Gemma with a tied one) are
# saved, then fine-tuned with LoRA (rank 8, M = 4, bf16 weights, bf16 autocast, the fused
# Triton readout) for 20 steps (LORA_STEPS) on the synthetic addition task:
#   one      1 GPU, the reference
#   fsdp     2 GPUs, FSDP2 (bf16 mixed precision: float32 adapters under a bf16 param_dtype)
#   ddp      2 GPUs, DDP
#   fsdp32   2 GPUs, FSDP2 with train.precision=fp32 (bf16 base and float32 adapters in one unit)
#   resume   the reference's checkpoint of the middle step resumed on 1 GPU
#   recipe2, tbys   1 GPU, Recipe 2 and TBYS
# and each reference's final/ is merged (cyb merge) and its logits compared with the adapter's.
# Writes to $OUT (default /tmp/lora_gpu_out): summary.md and summary.json (per run: exit status,
# last train loss, largest loss difference from the reference over all logged rows; merge:
# largest logit difference), env.txt and lora_gpu_logs.tar.gz (every run's log and metrics);
# status.txt (exit statuses) and failures.log (the end of each failed run's log) grow as runs
# finish, so a run cut off by an outer time limit still says what failed and why.
set -uo pipefail
OUT=${OUT:-/tmp/lora_gpu_out}
WORK=${LORA_WORK:-/tmp/lora_gpu_work}
mkdir -p "$OUT"
rm -rf "$WORK" && mkdir -p "$WORK"
export PYTHONPATH=${PYTHONPATH:-src}
export TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
STEPS=${LORA_STEPS:-20}          # smaller values and LORA_HIDDEN=32 make a quick CPU dry run
HIDDEN=${LORA_HIDDEN:-512}
HALF=$(printf "%08d" $((STEPS / 2)))
FULL=$(printf "%08d" "$STEPS")

{
    nvidia-smi --query-gpu=name,memory.total --format=csv || true
    "$PY" -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'gpus', torch.cuda.device_count())"
    "$PY" -c "import triton; print('triton', triton.__version__)" || true
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

"$PY" - "$WORK" "$STEPS" "$HIDDEN" <<'EOF'
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from cyb.build import build_tokenizer, hf_config_for
from cyb.config import RunConfig
from cyb.distributed import DistInfo

work, steps, hidden = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
for name, arch, tied in (("llama", "llama", False), ("gemma", "gemma", True)):
    cfg = RunConfig.from_dict({"model": {"arch": arch, "hidden_size": hidden, "num_layers": 4, "num_heads": 8,
                                         "tie_embeddings": tied, "max_position_embeddings": 1024},
                               "data": {"task": "addition"}}).validate()
    tok = build_tokenizer(cfg, work, DistInfo())
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(hf_config_for(cfg, len(tok), tok)).save_pretrained(work / f"base-{name}")
    (work / f"{name}.yaml").write_text(f"""
model: {{name_or_path: {work / f'base-{name}'}, dtype: bfloat16}}
method: {{name: cyb, num_steps: 4}}
lora: {{rank: 8, alpha: 16.0}}
data: {{task: addition, task_kwargs: {{digits: 4}}, num_train_examples: 2000, num_valid_examples: 64}}
optim: {{lr: 1.0e-3, warmup_steps: 2}}
train: {{steps: {steps}, batch_size: 16, micro_batch_size: 4, loss_impl: fused, log_every: 1,
         eval_every: {steps // 2}, eval_batches: 2, save_every: {steps // 2}, keep_last: 5, progress: false}}
""")
print("bases written")
EOF

run() {  # run NAME PROCS CONFIG [--set ...]
    local name=$1 procs=$2 cfg=$3; shift 3
    local sets=(--set "train.out_dir=$WORK/$name")
    for s in "$@"; do sets+=(--set "$s"); done
    local t0=$(date +%s)
    if [ "$procs" = 1 ]; then
        timeout 240 "$PY" -m cyb train "$cfg" "${sets[@]}" > "$WORK/$name.log" 2>&1
    else
        timeout 240 "$PY" -m torch.distributed.run --standalone --nproc_per_node="$procs" -m cyb train "$cfg" "${sets[@]}" > "$WORK/$name.log" 2>&1
    fi
    local rc=$?
    echo "$name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$WORK/status.txt"
    # what comes back even when an outer time limit cuts the script off
    cp "$WORK/status.txt" "$OUT/status.txt"
    if [ "$rc" != 0 ]; then
        { echo "== $name (rc=$rc)"; tail -n 40 "$WORK/$name.log"; } >> "$OUT/failures.log"
    fi
}

for base in llama gemma; do
    cfg="$WORK/$base.yaml"
    run "$base-one" 1 "$cfg"
    run "$base-fsdp" 2 "$cfg" train.distributed=fsdp
    run "$base-ddp" 2 "$cfg" train.distributed=ddp
    run "$base-fsdp32" 2 "$cfg" train.distributed=fsdp train.precision=fp32
    if [ -d "$WORK/$base-one/ckpt-$HALF" ]; then
        cp -r "$WORK/$base-one" "$WORK/$base-resume"
        rm -rf "$WORK/$base-resume/ckpt-$FULL" "$WORK/$base-resume/final"
        run "$base-resume" 1 "$cfg"
    fi
    run "$base-recipe2" 1 "$cfg" method.recipe=2 "method.omega=[1,1,1,1]"
    run "$base-tbys" 1 "$cfg" method.name=tbys
    timeout 120 "$PY" -m cyb merge "$WORK/$base-one" "$WORK/$base-merged" > "$WORK/$base-merge.log" 2>&1
    echo "$base-merge rc=$?" | tee -a "$WORK/status.txt"
done

"$PY" - "$WORK" "$OUT" <<'EOF'
import json
import sys
from pathlib import Path

import torch

from cyb.metrics_log import read_metrics
from cyb.model import PauseModel

work, out = Path(sys.argv[1]), Path(sys.argv[2])
status = dict(line.split(" rc=") for line in (work / "status.txt").read_text().splitlines())
summary = {}
for base in ("llama", "gemma"):
    ref = {(r["split"], r["step"]): r["loss"] for r in read_metrics(work / f"{base}-one")} \
        if (work / f"{base}-one" / "metrics.jsonl").is_file() else {}
    for kind in ("one", "fsdp", "ddp", "fsdp32", "resume", "recipe2", "tbys"):
        name = f"{base}-{kind}"
        row = {"status": status.get(name, "not run")}
        if (work / name / "metrics.jsonl").is_file():
            rows = {(r["split"], r["step"]): r["loss"] for r in read_metrics(work / name)}
            train = [v for (s, _), v in sorted(rows.items(), key=lambda kv: kv[0][1]) if s == "train"]
            row["last_train_loss"] = train[-1] if train else None
            if kind in ("fsdp", "ddp", "fsdp32", "resume") and ref:
                common = [k for k in rows if k in ref]
                row["max_loss_diff_vs_one"] = max(abs(rows[k] - ref[k]) for k in common) if common else None
        if (work / name / "run.json").is_file():
            info = json.loads((work / name / "run.json").read_text())
            row["trainable"], row["total"] = info.get("trainable_parameters"), info.get("num_parameters")
        summary[name] = row
    final, merged = work / f"{base}-one" / "final", work / f"{base}-merged"
    if final.is_dir() and merged.is_dir():
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        ids = torch.randint(0, 12, (2, 16), generator=torch.Generator().manual_seed(0)).to(dev)
        with torch.no_grad():
            a = PauseModel.from_pretrained(final, torch_dtype=torch.float32).to(dev).eval()(ids, return_logits=True).logits
            b = PauseModel.from_pretrained(merged, torch_dtype=torch.float32).to(dev).eval()(ids, return_logits=True).logits
        summary[f"{base}-merge"] = {"status": status.get(f"{base}-merge"),
                                    "max_logit_diff_fp32": float((a - b).abs().max())}
(out / "summary.json").write_text(json.dumps(summary, indent=2))
lines = ["| run | status | last train loss | max loss diff vs one | trainable / total | merge logit diff |",
         "| --- | --- | --- | --- | --- | --- |"]
for name, r in summary.items():
    f = lambda v: "" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))
    tt = f"{r['trainable']:,} / {r['total']:,}" if r.get("trainable") else ""
    lines.append(f"| {name} | rc={r.get('status')} | {f(r.get('last_train_loss'))} | "
                 f"{f(r.get('max_loss_diff_vs_one'))} | {tt} | {f(r.get('max_logit_diff_fp32'))} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF

tar -czf "$OUT/lora_gpu_logs.tar.gz" -C "$WORK" --exclude='base-*' --exclude='ckpt-*' --exclude='*.safetensors' \
    $(cd "$WORK" && ls -d *.log *-one *-fsdp *-ddp *-fsdp32 *-resume *-recipe2 *-tbys status.txt 2>/dev/null) || true
ls -la "$OUT"
