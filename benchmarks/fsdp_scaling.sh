#!/usr/bin/env bash
# FSDP2 scaling of CYB training (2048 real tokens x M = 4 per row) at a fixed global batch:
# one GPU (gradient accumulation) against N GPUs (FSDP2), then a sharded checkpoint written by
# the largest world size resumed by half as many processes.
#
# Usage (repository root, techdocs in .data/techdocs and a 32k BPE in .data/tok32k):
#   bash benchmarks/fsdp_scaling.sh SHAPE "WORLD SIZES" STEPS
#   bash benchmarks/fsdp_scaling.sh 134m "1 2 4" 16
#   bash benchmarks/fsdp_scaling.sh gemma2b "1 2 4" 8
# SHAPE: 134m (Llama, d 768, 12 layers, untied, global batch 8, bf16 autocast) or gemma2b
# (Gemma 1 2B's blocks: d 2048, 18 layers, 8 heads, 1 KV head, MLP 16384, tied; here with the
# 32k vocabulary; bf16 weights, gradient checkpointing, global batch 4). tiny: a CPU smoke test.
# Writes $OUT/fsdp-SHAPE/: one run folder per world size (logs, metrics), scaling.json.
set -u
shape=${1:-134m}; worlds=${2:-"1 2"}; steps=${3:-16}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
out=${OUT:-outputs}/fsdp-$shape; mkdir -p "$out"
(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo cpu) > "$out/device.txt"
block=2048
case $shape in
  tiny) model="{arch: llama, hidden_size: 64, num_layers: 2, num_heads: 4}"; batch=4; micro_max=2; block=64 ;;
  134m) model="{arch: llama, hidden_size: 768, num_layers: 12, num_heads: 12, intermediate_size: 2048,
        tie_embeddings: false, max_position_embeddings: 8192}"; batch=8; micro_max=4 ;;
  gemma2b) model="{arch: gemma, hidden_size: 2048, num_layers: 18, num_heads: 8, num_kv_heads: 1,
        intermediate_size: 16384, max_position_embeddings: 8192, dtype: bfloat16,
        gradient_checkpointing: true}"; batch=4; micro_max=1 ;;
  *) echo "unknown shape $shape (134m | gemma2b | tiny)"; exit 2 ;;
esac
cat > "$out/cfg.yaml" <<YAML
model: $model
method: {name: cyb, num_steps: 4}
data: {source: .data/techdocs/train.jsonl.gz, valid_source: .data/techdocs/valid.jsonl.gz,
       tokenizer: .data/tok32k, block_len: $block}
optim: {lr: 6.0e-4, warmup_steps: 3}
train: {steps: $steps, batch_size: $batch, eval_every: 0, eval_batches: 1,
        save_every: 0, log_every: 1, progress: false}
YAML
micro_for() { local m=$((batch / $1)); [ $m -gt $micro_max ] && m=$micro_max; echo $m; }
launch() {  # launch N LOGNAME args...
  local n=$1 log=$2; shift 2
  if [ "$n" = 1 ]; then python3 -m cyb train "$out/cfg.yaml" --set train.distributed=none "$@" > "$log" 2>&1
  else torchrun --standalone --nproc_per_node=$n -m cyb train "$out/cfg.yaml" --set train.distributed=fsdp "$@" > "$log" 2>&1
  fi
}
for n in $worlds; do
  launch $n "$out/gpu$n.log" --set train.out_dir=$out/gpu$n --set train.micro_batch_size=$(micro_for $n)
  echo "$shape, $n GPU(s): exit $?"
done
# Sharded checkpoint at half-way by the largest world size, resumed by half as many processes.
big=$(echo $worlds | tr ' ' '\n' | sort -n | tail -1); small=$((big / 2)); half=$((steps / 2))
if [ "$big" -ge 2 ]; then
  launch $big "$out/ckpt$big.log" --set train.out_dir=$out/ckpt$big --set train.micro_batch_size=$(micro_for $big) \
    --set train.checkpoint_format=sharded --set train.save_every=$half --set train.steps=$steps
  rm -rf "$out/resume$small"; mkdir -p "$out/resume$small"
  cp -r "$out/ckpt$big"/. "$out/resume$small"/
  rm -rf "$out/resume$small/final"; for c in "$out/resume$small"/ckpt-*; do
    [ "$(basename "$c" | sed 's/ckpt-0*//')" -gt "$half" ] && rm -rf "$c"; done
  launch $small "$out/resume$small.log" --set train.out_dir=$out/resume$small --set train.micro_batch_size=$(micro_for $small) \
    --set train.checkpoint_format=sharded --set train.save_every=$half --set train.steps=$steps
  echo "$shape, sharded checkpoint of $big GPUs resumed on $small: exit $?"
  rm -rf "$out"/ckpt$big/ckpt-* "$out"/resume$small/ckpt-*
fi
find "$out" -name final -type d -prune -exec rm -rf {} +
python3 - "$out" "$worlds" "$big" "$small" "$half" <<'PY'
import json, sys
from pathlib import Path
out, worlds, big, small, half = Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3], sys.argv[4], int(sys.argv[5])
def rows(d):
    p = out / d / "metrics.jsonl"
    return {r["step"]: r for r in map(json.loads, p.read_text().splitlines()) if r.get("split") == "train"} if p.is_file() else {}
med = lambda x: sorted(x)[len(x) // 2] if x else None
runs = {n: rows(f"gpu{n}") for n in worlds}
ref = runs[worlds[0]]
res = {"shape": out.name, "device": (out / "device.txt").read_text().strip(), "worlds": {}}
for n, r in runs.items():
    steps = sorted(set(r) & set(ref))
    tps = med([v["tokens_per_s"] for k, v in r.items() if k > 3])
    res["worlds"][n] = {"steps": len(r), "real_tokens_per_s": tps,
                        "max_abs_loss_diff_vs_first": max((abs(r[s]["objective"] - ref[s]["objective"]) for s in steps), default=None),
                        "losses": [r[s]["objective"] for s in sorted(r)]}
base = res["worlds"][worlds[0]]["real_tokens_per_s"]
for n, w in res["worlds"].items():
    w["speedup"] = (w["real_tokens_per_s"] / base) if base and w["real_tokens_per_s"] else None
if int(big) >= 2:
    a, b = rows(f"ckpt{big}"), rows(f"resume{small}")
    after = sorted(s for s in set(a) & set(b) if s > half)
    res["resume"] = {"written_by": int(big), "resumed_by": int(small), "from_step": half, "steps_compared": len(after),
                     "max_abs_loss_diff": max((abs(a[s]["objective"] - b[s]["objective"]) for s in after), default=None)}
(out / "scaling.json").write_text(json.dumps(res, indent=2))
print(json.dumps({k: v for k, v in res.items()}, indent=1)[:3000])
PY
tail -n 3 "$out"/*.log
