#!/usr/bin/env bash
# FSDP2 scaling of CYB training: the 134 M Llama shape (hidden 768, 12 layers, vocab 32k,
# 2048 real tokens x M = 4), one GPU against N GPUs at the same global batch.
# Usage (repository root on a machine with N GPUs, techdocs in .data/techdocs and a 32k BPE in
# .data/tok32k):  bash experiments/fsdp_scaling.sh N STEPS
set -u
n=${1:-2}; steps=${2:-20}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
out=${OUT:-results}/fsdp; mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/device.txt"
cat > "$out/cfg.yaml" <<YAML
model: {arch: llama, hidden_size: 768, num_layers: 12, num_heads: 12, intermediate_size: 2048,
        tie_embeddings: false, max_position_embeddings: 8192}
method: {name: cyb, num_steps: 4}
data: {source: .data/techdocs/train.jsonl.gz, valid_source: .data/techdocs/valid.jsonl.gz,
       tokenizer: .data/tok32k, block_len: 2048}
optim: {lr: 6.0e-4, warmup_steps: 5}
train: {steps: $steps, batch_size: 8, micro_batch_size: 4, eval_every: 0, eval_batches: 1,
        save_every: 0, log_every: 1, progress: false}
YAML
python3 -m cyb train "$out/cfg.yaml" --set train.out_dir=$out/gpu1 --set train.distributed=none \
  > "$out/gpu1.log" 2>&1; echo "1 GPU: exit $?"
torchrun --standalone --nproc_per_node=$n -m cyb train "$out/cfg.yaml" --set train.out_dir=$out/gpu$n \
  --set train.distributed=fsdp --set train.micro_batch_size=$((8 / n)) > "$out/gpu$n.log" 2>&1; echo "$n GPUs: exit $?"
python3 - "$out" "$n" <<'PY'
import json, sys
from pathlib import Path
out, n = Path(sys.argv[1]), sys.argv[2]
def rows(d):
    p = out / d / "metrics.jsonl"
    return [json.loads(l) for l in p.read_text().splitlines()] if p.is_file() else []
a = {r["step"]: r for r in rows("gpu1") if r["split"] == "train"}
b = {r["step"]: r for r in rows(f"gpu{n}") if r["split"] == "train"}
steps = sorted(set(a) & set(b))
diff = max((abs(a[s]["objective"] - b[s]["objective"]) for s in steps), default=None)
tps = lambda rs: sorted(r["tokens_per_s"] for k, r in rs.items() if k > 3)
ta, tb = tps(a), tps(b)
med = lambda x: x[len(x) // 2] if x else None
res = {"steps_compared": len(steps), "max_abs_loss_diff": diff,
       "losses_1gpu": [a[s]["objective"] for s in steps], f"losses_{n}gpu": [b[s]["objective"] for s in steps],
       "tokens_per_s_1gpu": med(ta), f"tokens_per_s_{n}gpu": med(tb),
       "speedup": (med(tb) / med(ta)) if ta and tb else None}
(out / "scaling.json").write_text(json.dumps(res, indent=2))
print(json.dumps(res, indent=2))
PY
tail -5 "$out/gpu1.log" "$out/gpu$n.log"
