"""The memory plan: the analytic estimate (``cyb.memory_estimate``), the refusal of ``cyb train``
(the GPU's free memory faked on the CPU), ``--estimate-memory`` and ``cyb bench memory --quick``.

Estimates are checked for the properties they must have (monotonic in batch and sequence,
gradient checkpointing shrinks activations, LoRA shrinks gradients and AdamW state, FSDP divides
the sharded parts) and their parameter counts against models built from the same configs.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from cyb import families
from cyb import memory_estimate as memory
from cyb.build import hf_config_for
from cyb.cli import main
from cyb.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_thread")

GEMMA_2B = {"arch": "gemma", "hidden_size": 2048, "num_layers": 18, "num_heads": 8, "num_kv_heads": 1,
            "head_dim": 256, "intermediate_size": 16384, "tie_embeddings": True}


def cfg_of(out_dir="runs/x", model=None, train=None, method=None, block_len=2048) -> RunConfig:
    cfg = {"model": {"dtype": "bfloat16", **(model or GEMMA_2B)},
           "method": {"name": "cyb", "num_steps": 4, **(method or {})},
           "data": {"block_len": block_len},
           "train": {"out_dir": str(out_dir), "batch_size": 1, "micro_batch_size": 1, **(train or {})}}
    return RunConfig.from_dict(cfg).validate()


def est(cfg, vocab=256000, **kw):
    return memory.estimate(cfg, memory.run_shape(cfg, vocab - 4), triton=True, **kw)


def test_gemma_2b_shape_and_parameters():
    e = est(cfg_of())
    assert e.positions == 2048 * 4
    assert abs(e.params - 2.506e9) < 0.01e9  # Gemma 1 2B
    assert e.weights == e.params * 2 and e.gradients == e.params * 2 and e.optimizer == e.params * 4
    assert e.peak > e.weights + e.gradients + e.optimizer
    text = e.describe()
    assert "estimated peak memory per GPU" in text and "activations" in text and "GiB" in text


@pytest.mark.parametrize("model", [
    {"arch": "llama", "hidden_size": 48, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
     "intermediate_size": 80, "tie_embeddings": False},
    {"arch": "gemma", "hidden_size": 48, "num_layers": 2, "num_heads": 4, "num_kv_heads": 1,
     "head_dim": 16, "intermediate_size": 80, "tie_embeddings": True},
    {"arch": "gemma3", "hidden_size": 40, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
     "head_dim": 16, "intermediate_size": 64, "tie_embeddings": True},
    {"arch": "qwen2", "hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 64},
])
def test_parameter_count_matches_a_built_model(model):
    from transformers import AutoModelForCausalLM

    cfg = cfg_of(model=model, block_len=8)
    config = hf_config_for(cfg, 100)
    built = AutoModelForCausalLM.from_config(config)
    n = sum(p.numel() for p in {id(p): p for p in built.parameters()}.values())
    assert memory.ModelShape.from_hf_config(config).params() == n


@pytest.mark.parametrize("arch", families.NAMES)
def test_every_family_is_counted_as_built(arch):
    """The family table's quirks (norms, biases) give the parameters of a tiny model of each family."""
    from transformers import AutoModelForCausalLM

    model = {"arch": arch, "hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
             "intermediate_size": 48, "tie_embeddings": False}
    config = hf_config_for(cfg_of(model=model, block_len=8), 100)
    assert config.model_type == families.family(arch).model_type
    built = AutoModelForCausalLM.from_config(config)
    n = sum(p.numel() for p in {id(p): p for p in built.parameters()}.values())
    assert memory.ModelShape.from_hf_config(config).params() == n


def test_monotonic_in_micro_batch_and_sequence():
    peaks = [est(cfg_of(train={"batch_size": b, "micro_batch_size": b})).peak for b in (1, 2, 4)]
    assert peaks[0] < peaks[1] < peaks[2]
    acts = [est(cfg_of(block_len=n)).activations for n in (512, 1024, 2048)]
    assert acts[0] < acts[1] < acts[2]
    # more pauses: more positions per real token
    assert est(cfg_of(method={"num_steps": 2})).peak < est(cfg_of(method={"num_steps": 4})).peak
    assert est(cfg_of(method={"name": "baseline", "num_steps": 1})).positions == 2048


def test_gated_pauses_add_one_mask_per_layer_off_cuda():
    """Through the dense path (the CPU) a gated layout keeps a [B, heads, T, T] additive mask
    (and the bool of other tokens' pauses) per layer for backward, and backward makes the mask's
    gradient."""
    shared = est(cfg_of(block_len=512), device_type="cpu")
    gated = est(cfg_of(block_len=512, method={"pause_visibility": "gated"}), device_type="cpu")
    shape = memory.run_shape(cfg_of(block_len=512), 256000 - 4)
    mask = memory.gated_mask_bytes(1, shape.heads, 2048, 2)
    assert mask == 2048 * 2048 * (8 * 2 + 1)  # Gemma 2B: 8 heads, bf16
    assert gated.activations - shared.activations == shape.layers * mask
    assert gated.peak > shared.peak and any("additive mask" in n for n in gated.notes)


@pytest.mark.parametrize("block_len, method, kernel", [
    (512, {}, "flex"),  # 2,048 positions: FlexAttention
    (1024, {}, "flex"),  # 4,096: the longest row that runs it
    (2048, {}, "split"),  # 8,192: the split attention
    (2048, {"recipe": 2}, "flex"),  # a layout the split attention cannot run
])
def test_gated_pauses_on_cuda_keep_no_mask(block_len, method, kernel):
    """On CUDA a gated layer keeps no T x T mask: FlexAttention keeps its output once more, the
    output over earlier tokens' pauses and their share of the attention; the split attention the
    earlier pauses' output and two log-sum-exps per query head; linear in the positions."""
    from cyb.model.attention import GATED_FLEX_MAX_POSITIONS

    assert GATED_FLEX_MAX_POSITIONS == 4096
    shape = memory.run_shape(cfg_of(block_len=block_len, method=method), 256000 - 4)
    shared = est(cfg_of(block_len=block_len, method=method))
    gated_cfg = cfg_of(block_len=block_len, method={**method, "pause_visibility": "gated"})
    gated = est(gated_cfg)
    assert memory.gated_kernel(gated_cfg, shape, "cuda", 2, gated.positions) == kernel
    if kernel == "split":
        kept, _ = memory.gated_split_bytes(gated.positions, shape, 2)
    else:
        kept = memory.gated_flex_bytes(gated.positions, shape, 2)
    assert gated.activations - shared.activations == shape.layers * kept
    assert any(("split attention" if kernel == "split" else "FlexAttention with the gate") in n for n in gated.notes)
    assert not any("additive mask" in n for n in gated.notes)


def test_private_pauses_keep_one_more_attention_output_per_layer_on_cuda():
    shape = memory.run_shape(cfg_of(block_len=512), 256000 - 4)
    shared, private = (est(cfg_of(block_len=512, method={"pause_visibility": v})) for v in ("shared", "private"))
    assert private.activations - shared.activations == shape.layers * 2048 * shape.q_dim * 2
    assert any("private pauses" in n for n in private.notes)
    on_cpu = [est(cfg_of(block_len=512, method={"pause_visibility": v}), device_type="cpu")
              for v in ("shared", "private")]
    assert on_cpu[0].activations == on_cpu[1].activations


def test_gradient_checkpointing_reduces_activations():
    off, on = est(cfg_of()), est(cfg_of(model={**GEMMA_2B, "gradient_checkpointing": True}))
    assert on.activations < off.activations / 4
    assert on.peak < off.peak
    assert (on.weights, on.gradients, on.optimizer) == (off.weights, off.gradients, off.optimizer)


def test_lora_reduces_gradients_and_optimizer_state():
    full = est(cfg_of())
    cfg = cfg_of()
    cfg.lora = SimpleNamespace(rank=16, alpha=32, dropout=0.0, target_modules=None)  # as the lora section
    lora = est(cfg)
    assert lora.lora_rank == 16 and lora.trainable < full.trainable / 50
    # rank x (in + out) per linear per block, plus the 4 new pause/dk rows (tied head)
    shape = memory.run_shape(cfg, 256000 - 4)
    per_block = sum(16 * (i + o) for i, o in shape.linears().values())
    assert lora.trainable == 18 * per_block + 4 * 2048
    assert lora.optimizer < full.optimizer / 50 and lora.gradients < full.gradients / 50
    assert lora.weights == full.weights and lora.peak < full.peak
    assert "LoRA rank 16" in lora.describe()
    cfg.lora.target_modules = ["q_proj", "v_proj"]
    assert est(cfg).trainable < lora.trainable
    # exact counts from a built model replace the analytic ones
    assert est(cfg_of(), trainable=1000).optimizer == 1000 * 2 * 2


def test_fsdp_divides_the_sharded_parts():
    one = est(cfg_of(train={"batch_size": 4, "micro_batch_size": 1}))
    four = est(cfg_of(train={"batch_size": 4, "micro_batch_size": 1, "distributed": "fsdp"}), world_size=4)
    assert four.sharded and four.world_size == 4 and four.accumulation == 1
    assert one.accumulation == 4
    for part in ("weights", "gradients", "optimizer"):
        assert getattr(four, part) == -(-getattr(one, part) // 4)
    assert four.fsdp_buffers > 0 and four.activations == one.activations
    assert four.peak < one.peak
    ddp = est(cfg_of(train={"batch_size": 4, "micro_batch_size": 1}), world_size=4)
    assert ddp.weights == one.weights and not ddp.sharded


def test_float32_weights_under_autocast_and_the_naive_readout():
    fp32 = est(cfg_of(model={**GEMMA_2B, "dtype": "auto"}))
    assert fp32.param_bytes == 4 and fp32.compute_bytes == 2 and fp32.autocast_copies > 0
    naive = est(cfg_of(train={"loss_impl": "naive"}))
    fused = est(cfg_of())
    assert not naive.fused_readout and fused.fused_readout
    assert naive.readout > 2 * fused.readout  # full logits of 8192 x 256k and their gradient


def test_suggestions_name_the_fixes():
    cfg = cfg_of(train={"batch_size": 8, "micro_batch_size": 4}, model={**GEMMA_2B, "dtype": "auto"})
    tips = " ".join(memory.suggestions(est(cfg), cfg))
    for want in ("model.gradient_checkpointing=true", "train.micro_batch_size=2", "model.dtype=bfloat16",
                 "train.distributed=fsdp"):
        assert want in tips


# ------------------------------------------------------------------------------ cyb train


def tiny_cfg(out_dir, **train) -> RunConfig:
    return RunConfig.from_dict({
        "model": {"arch": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 2,
                  "max_position_embeddings": 256},
        "method": {"name": "cyb", "num_steps": 3},
        "data": {"task": "addition", "task_kwargs": {"digits": 2}, "num_train_examples": 64,
                 "num_valid_examples": 8},
        "train": {"out_dir": str(out_dir), "steps": 2, "batch_size": 4, "eval_every": 0,
                  "save_every": 0, "eval_batches": 1, "progress": False, **train},
    }).validate()


def test_train_refuses_a_run_that_does_not_fit(tmp_path, monkeypatch):
    from cyb.train import Trainer

    monkeypatch.setattr(memory, "device_capacity", lambda device: 64 * 1024)  # 64 KiB "free"
    out = tmp_path / "run"
    with pytest.raises(memory.MemoryPlanError) as err:
        Trainer(tiny_cfg(out))
    text = str(err.value)
    assert "GiB per GPU" in text and "not starting" in text and "activations" in text
    assert "model.gradient_checkpointing=true" in text and "train.memory_check=false" in text
    assert not out.exists()  # nothing left behind
    trainer = Trainer(tiny_cfg(out, memory_check=False))  # the override starts it anyway
    assert trainer.model is not None


def test_train_starts_when_the_estimate_fits(tmp_path, monkeypatch, capsys):
    from cyb.train import Trainer

    monkeypatch.setattr(memory, "device_capacity", lambda device: 2**40)
    Trainer(tiny_cfg(tmp_path / "run"))
    assert "memory estimate:" in capsys.readouterr().err


def test_a_task_run_is_estimated_at_its_longest_example_not_at_block_len(tmp_path, monkeypatch):
    """A task's rows are padded to its longest example (2-digit sums: a few tokens), not to
    data.block_len (256 by default): counting block_len refused runs that fit many times over."""
    from cyb.run_data import row_tokens
    from cyb.train import Trainer

    seen = []
    estimate = memory.estimate
    monkeypatch.setattr(memory, "device_capacity", lambda device: 2**40)
    monkeypatch.setattr(memory, "estimate", lambda *a, **k: seen.append(k.get("real_tokens")) or estimate(*a, **k))
    trainer = Trainer(tiny_cfg(tmp_path / "run"))
    width = row_tokens(trainer.train_data)
    assert seen == [width] and 2 < width < 16
    cfg, shape = tiny_cfg(tmp_path / "x"), memory.ModelShape.from_hf_config(trainer.model.config)
    assert memory.positions_per_row(cfg, width) == 3 * width and memory.positions_per_row(cfg) == 3 * 256
    assert memory.estimate(cfg, shape, real_tokens=width).peak < memory.estimate(cfg, shape).peak


def test_estimate_memory_flag(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    tiny_cfg(tmp_path / "run").dump(path)
    assert main(["train", str(path), "--estimate-memory", "--world-size", "2",
                 "--set", "train.distributed=fsdp"]) == 0
    out = capsys.readouterr().out
    assert "estimated peak memory per GPU" in out and "FSDP over 2 processes" in out
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------ the benchmark


def test_bench_memory_quick(tmp_path, capsys):
    out, md = tmp_path / "m.jsonl", tmp_path / "m.md"
    assert main(["bench", "memory", "--quick", "--configs", "full", "--out", str(out),
                 "--markdown", str(md)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["status"] == "ok", rows
    r = rows[0]
    assert r["shape"] == "tiny" and r["real_tokens_per_s"] > 0 and r["estimate_gib"] > 0
    assert r["params"] == r["estimate"]["params"]  # the analytic count is exact
    assert "| tiny |" in md.read_text()


def test_memory_table_marks_oom_and_skipped():
    from cyb.bench.memory import memory_table

    rows = [{"shape": "llama3-8b", "config": "full", "status": "oom", "estimate_gib": 110.3},
            {"shape": "gemma1-2b", "config": "full-ckpt", "status": "ok", "estimate_gib": 21.1,
             "peak_allocated_gib": 20.0, "peak_reserved_gib": 22.5, "real_tokens_per_s": 12345.0,
             "params": 2.5e9, "trainable": 2.5e9},
            {"shape": "gemma1-2b", "config": "lora", "status": "skipped"}]
    table = memory_table(rows)
    lines = table.splitlines()
    assert lines[2].startswith("| gemma1-2b | 2.50 B | full |") and "12,345" in lines[2]
    assert "not run" in lines[3] and "OOM" in lines[4] and "| no |" in lines[4]


def test_fill_doc_and_rows_from_a_file(tmp_path, capsys):
    from cyb.bench.memory import fill_doc

    rows = tmp_path / "m.jsonl"
    rows.write_text(json.dumps({"shape": "gemma1-2b", "config": "full", "status": "oom", "estimate_gib": 45.8,
                                "device_name": "GPU X", "gpu_memory_gib": 79.2, "torch": "2.11",
                                "transformers": "5.17"}) + "\n")
    doc = tmp_path / "doc.md"
    doc.write_text("# t\n\n<!-- table:memory -->\nold\n<!-- end table -->\n\nafter\n")
    assert main(["bench", "memory", "--from", str(rows), "--fill-doc", str(doc)]) == 0
    text = doc.read_text()
    assert "old" not in text and "GPU X (79.2 GiB)" in text and "| gemma1-2b |" in text
    assert text.endswith("<!-- end table -->\n\nafter\n")
    with pytest.raises(ValueError):
        fill_doc(tmp_path / "m.jsonl", "x")


def test_device_capacity_is_none_off_cuda():
    assert memory.device_capacity(torch.device("cpu")) is None


def _saved_bytes(arch: str, layers: int, float32: bool, **model):
    """Bytes autograd saves in the decoder's forward under bf16 autocast (parameters and their
    autocast copies left out), and the positions."""
    from transformers import AutoModelForCausalLM

    from cyb.model import PauseModel
    from cyb.objective import Objective

    # (no activation of 128 positions has the 2-D shape of a weight, whose bf16 copies are left out)
    m = {"arch": arch, "hidden_size": 48, "num_layers": layers, "num_heads": 4, "num_kv_heads": 1,
         "intermediate_size": 96, "dtype": "auto" if float32 else "bfloat16", **model}
    cfg = cfg_of(model=m, block_len=32)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(hf_config_for(cfg, 300), attn_implementation="sdpa",
                                          dtype=torch.float32 if float32 else torch.bfloat16)
    pm = PauseModel.from_hf(hf, num_steps=4)
    prep = Objective(cfg.method, pm.vocab, pm.dk_bias, "naive").prepare({"ids": torch.randint(3, 290, (1, 32))})
    params = {p.untyped_storage().data_ptr() for p in pm.parameters()}
    shapes = {tuple(p.shape) for p in pm.parameters() if p.dim() == 2}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        weight_copy = t.dtype == torch.bfloat16 and float32 and tuple(t.shape) in shapes
        if st.data_ptr() not in params and not weight_copy:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        pm.hidden_states(prep.input_ids, prep.position_ids, prep.attention_mask)
    return sum(seen.values()), prep.input_ids.numel(), cfg


@pytest.mark.parametrize("float32", [False, True], ids=["bf16-weights", "fp32-weights-autocast"])
@pytest.mark.parametrize("arch,model", [("llama", {}), ("llama", {"num_kv_heads": 4}),
                                        ("gemma", {"head_dim": 16}), ("gemma3", {"head_dim": 16})])
def test_activations_match_what_autograd_saves(arch, model, float32):
    one, n, cfg = _saved_bytes(arch, 1, float32, **model)
    three, _, _ = _saved_bytes(arch, 3, float32, **model)
    shape = memory.run_shape(cfg, 300)
    per_layer = (three - one) / 2 / n
    formula = memory.activation_bytes_per_token(shape, 4 if float32 else 2, 2)
    assert formula == pytest.approx(per_layer, rel=0.03)
    # the whole decoder: blocks plus what lies outside them
    e = memory.estimate(cfg, shape, device_type="cuda", triton=True)
    outside = e.activations - shape.layers * n * formula
    assert outside == pytest.approx(one - per_layer * n, rel=0.05)
