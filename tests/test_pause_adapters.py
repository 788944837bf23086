"""Pause-step adapters (cyb.model.pause_adapters): low-rank weights that act only where the input
is a pause.  Identity at initialisation in every layout; the real steps of a private model stay
the base model's whatever the adapters hold; gradients reach only what should train (full,
LoRA or frozen base); the saved folder, cyb generate, cyb eval and cyb merge; and decoding with
adapters equals the no-cache reference (tests/test_engine.py) on the engine and the eager
decoder."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from cyb.config import ConfigError, RunConfig
from cyb.layout import expand
from cyb.model import PauseModel
from cyb.model import pause_adapters as P
from generation_helpers import PROMPTS, build, encode

pytestmark = pytest.mark.usefixtures("one_thread")

IDS = torch.tensor([encode("12+34=46"), encode("hello wo")])


def layout(visibility: str, kind: str = "cyb", scheme: str = "shared") -> PauseModel:
    pm = build("llama", kind, init=0.3, dk_scale=0.3, psi_dk=0.5 if kind == "cyb" else None, num_steps=3,
               scheme=scheme)
    if visibility != "shared":
        pm = PauseModel(pm.hf_model, dataclasses.replace(pm.settings, pause_visibility=visibility), pm.tokenizer).eval()
    return pm


def randomise(pm: PauseModel, seed: int = 3, scale: float = 0.2) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in P.adapter_parameters(pm):
            p.copy_(torch.randn(p.shape, generator=g) * scale)


LAYOUTS = [("shared", "cyb", "shared"), ("private", "cyb", "shared"), ("gated", "cyb", "shared"),
           ("private", "tbys", "advance"), ("shared", "tbys", "advance")]


@pytest.mark.parametrize("visibility,kind,scheme", LAYOUTS)
def test_identity_at_init_and_pauses_only(visibility, kind, scheme):
    pm = layout(visibility, kind, scheme)
    want = pm(IDS, return_logits=True).logits
    P.add_pause_adapters(pm, P.PauseAdapterSpec(rank=4))
    assert torch.equal(pm(IDS, return_logits=True).logits, want)  # B = 0: exactly the model without them
    lay = expand(IDS, pm.vocab)
    mask = P.state_of(pm).mask
    assert torch.equal(mask, (lay.steps.step > 0).expand_as(mask))  # the pauses are the steps after the first
    randomise(pm)
    got = pm(IDS, return_logits=True).logits
    assert not torch.allclose(got[:, :, 1:], want[:, :, 1:], atol=1e-3)  # the pause steps changed
    if visibility == "private":  # the real steps never see an adapter nor another token's pauses
        assert torch.equal(got[:, :, 0], want[:, :, 0])
    P.remove_pause_adapters(pm)
    assert torch.equal(pm(IDS, return_logits=True).logits, want)


def test_errors_in_one_line():
    base = {"model": {"name_or_path": "some/model"}}
    for method, match in [({"name": "baseline", "pause_adapter_rank": 4}, "baseline has no pauses"),
                          ({"pause_adapter_rank": -1}, "pause_adapter_rank: must be >= 0"),
                          ({"pause_adapter_rank": 4, "pause_adapter_alpha": 0}, "pause_adapter_alpha"),
                          ({"pause_adapter_rank": 4, "pause_adapter_base": "lora"}, "pause_adapter_base: must be one of"),
                          ({"pause_adapter_base": "freeze"}, "set method.pause_adapter_rank >= 1")]:
        with pytest.raises(ConfigError, match=match) as e:
            RunConfig.from_dict({**base, "method": method}).validate()
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="freeze keeps a pretrained model"):
        RunConfig.from_dict({"method": {"pause_adapter_rank": 2, "pause_adapter_base": "freeze"}}).validate()
    with pytest.raises(ConfigError, match="use train.distributed ddp or none"):
        RunConfig.from_dict({**base, "train": {"distributed": "fsdp"},
                             "method": {"pause_adapter_rank": 2, "pause_adapter_base": "freeze"}}).validate()
    with pytest.raises(ConfigError, match="set lora.rank = 0"):
        RunConfig.from_dict({**base, "lora": {"rank": 4}, "method": {"pause_adapter_rank": 2,
                                                                       "pause_adapter_base": "freeze"}}).validate()
    pm = layout("private")
    with pytest.raises(ValueError, match="no such linear module .* its linear layers are"):
        P.add_pause_adapters(pm, P.PauseAdapterSpec(rank=2, targets=("qkv",)))
    with pytest.raises(ValueError, match="has no pauses"):
        P.add_pause_adapters(build("llama", "baseline"), P.PauseAdapterSpec(rank=2))


# ----------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A 'pretrained' model folder: a tiny random Llama (tied embeddings) with the character
    tokenizer of the synthetic tasks."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from cyb.data.synthetic import CharTokenizer

    tok = CharTokenizer().to_hf()
    folder = tmp_path_factory.mktemp("pretrained")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                                 tie_word_embeddings=True, pad_token_id=0, bos_token_id=1,
                                 eos_token_id=2)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def adapter_cfg(folder, out_dir, *, base="train", lora=0, visibility="private", **train) -> RunConfig:
    return RunConfig.from_dict({
        "model": {"name_or_path": str(folder)},
        "method": {"name": "cyb", "num_steps": 3, "pause_visibility": visibility, "pause_adapter_rank": 4,
                   "pause_adapter_base": base},
        "lora": {"rank": lora},
        "data": {"task": "addition", "task_kwargs": {"digits": 2}, "num_train_examples": 64, "num_valid_examples": 8},
        "optim": {"lr": 1e-2, "warmup_steps": 1},
        "train": {"out_dir": str(out_dir), "steps": 3, "batch_size": 8, "eval_every": 0, "eval_batches": 1,
                  "save_every": 0, "progress": False, **train},
    }).validate()


BASES = [("full", "train", 0), ("lora", "train", 4), ("frozen", "freeze", 0)]


@pytest.mark.parametrize("label,base,lora", BASES, ids=[b[0] for b in BASES])
def test_gradients_reach_only_what_trains(pretrained, tmp_path, label, base, lora):
    if lora:
        pytest.importorskip("peft")
    from cyb.build import build_model, build_tokenizer
    from cyb.distributed import DistInfo
    from cyb.optim import build_optimizer

    cfg = adapter_cfg(pretrained, tmp_path / "run", base=base, lora=lora)
    tok = build_tokenizer(cfg, tmp_path, DistInfo())
    torch.manual_seed(0)
    model = build_model(cfg, tok).train()
    randomise(model, scale=0.05)  # B != 0, so that A gets a gradient too
    before = {n: p.detach().clone() for n, p in model.hf_model.named_parameters()}
    opt = build_optimizer(model, cfg, 1e-2)
    out = model(IDS)
    loss = -(out.log_t.sum() + out.log_not_d[..., 0].sum())
    loss.backward()
    adapters = {id(p) for p in P.adapter_parameters(model)}
    emb = model.hf_model.get_input_embeddings().weight
    rows = sorted(set(model.settings.pause_ids) | {model.settings.dk_id})
    for name, p in model.hf_model.named_parameters():
        if id(p) in adapters:
            assert p.requires_grad and p.grad is not None and p.grad.abs().sum() > 0, name
        elif label == "full":
            assert p.requires_grad and p.grad is not None, name
        elif label == "lora":  # peft's adapters and pause rows; the base weights frozen
            assert p.requires_grad == ("lora_" in name or "trainable_tokens" in name), name
        elif p is emb:  # frozen: the embedding learns its pause and dk rows only
            other = torch.ones(p.shape[0], dtype=torch.bool)
            other[rows] = False
            assert p.grad[rows].abs().sum() > 0 and not p.grad[other].any()
        else:
            assert not p.requires_grad and p.grad is None, name
    opt.step()
    after = dict(model.hf_model.named_parameters())
    if label == "frozen":  # AdamW leaves the base exactly as loaded, embedding rows included
        for name, p in after.items():
            if id(p) in adapters:
                assert not torch.equal(p, before[name])
            elif p is emb:
                keep = [i for i in range(p.shape[0]) if i not in rows]
                assert torch.equal(p[keep], before[name][keep]) and not torch.equal(p[rows], before[name][rows])
            else:
                assert torch.equal(p, before[name]), name


def test_a_run_saves_loads_generates_evaluates_and_resumes(pretrained, tmp_path, capsys):
    from cyb.cli import main
    from cyb.train import train

    import shutil

    run = tmp_path / "run"
    cfg = adapter_cfg(pretrained, run, steps=4, save_every=2, keep_last=5)
    metrics = train(cfg)
    final = run / "final"
    assert (final / P.CONFIG_FILE).is_file() and (final / P.WEIGHTS_FILE).is_file()
    from safetensors import safe_open

    with safe_open(str(final / "model.safetensors"), "pt") as f:  # the base model's weights alone
        assert not any(P.is_adapter_key(k) for k in f.keys())
    model = PauseModel.from_pretrained(final)
    assert P.spec_of(model) == P.PauseAdapterSpec(rank=4)
    saved = {k: v for k, v in P.adapter_state(model).items()}
    assert any(v.abs().sum() > 0 for k, v in saved.items() if k.endswith(P.B_NAME))  # they trained
    want = model(IDS, return_logits=True).logits
    # resuming from the step-2 checkpoint reproduces the uninterrupted run
    shutil.rmtree(run / "ckpt-00000004")
    shutil.rmtree(final)
    resumed = train(cfg)
    assert resumed["loss"] == pytest.approx(metrics["loss"], abs=1e-6)
    again = PauseModel.from_pretrained(final)
    torch.testing.assert_close(again(IDS, return_logits=True).logits, want, atol=1e-6, rtol=1e-6)
    assert main(["generate", str(run), "--prompt", "12+34=", "--max-new-tokens", "4"]) == 0
    printed = capsys.readouterr()
    assert printed.out.startswith("12+34=") and "[4 tokens, mean steps" in printed.err
    assert main(["eval", str(run), "--no-progress", "--passages", "0"]) == 0
    assert "task: exact match" in capsys.readouterr().out


def test_lora_base_merges_with_the_adapters_beside(pretrained, tmp_path, capsys):
    pytest.importorskip("peft")
    from cyb.cli import main
    from cyb.train import train

    run = tmp_path / "run"
    train(adapter_cfg(pretrained, run, lora=4))
    lora_model = PauseModel.from_pretrained(run / "final")
    assert P.spec_of(lora_model) is not None
    want = lora_model(IDS, return_logits=True).logits
    assert main(["merge", str(run), str(tmp_path / "merged")]) == 0
    capsys.readouterr()
    merged = tmp_path / "merged"
    assert (merged / P.WEIGHTS_FILE).is_file() and not (merged / "adapter_config.json").exists()
    plain = PauseModel.from_pretrained(merged)
    torch.testing.assert_close(plain(IDS, return_logits=True).logits, want, atol=1e-5, rtol=1e-5)
    assert json.loads((merged / P.CONFIG_FILE).read_text())["rank"] == 4


# ----------------------------------------------------------------------------- decoding

# (visibility, scheme, mode, sampled): a spread of the engine's and the eager decoder's paths
DECODING = [("shared", "shared", "fixed", False), ("shared", "shared", "adaptive", True),
            ("private", "shared", "adaptive", False), ("private", "advance", "fixed", True),
            ("gated", "shared", "adaptive", False)]


@pytest.mark.parametrize("visibility,scheme,mode,sampled", DECODING)
def test_decoding_with_adapters_equals_the_no_cache_reference(visibility, scheme, mode, sampled):
    from cyb.decision import row_keys
    from cyb.generation import generate
    from test_engine import SAMPLED, Sampling, assert_same, engine_run, layout_model, reference

    s = SAMPLED if sampled else Sampling()
    prompts = [encode(p) for p in PROMPTS]
    keys = row_keys(len(prompts), seed=4)
    pm = layout_model(visibility, scheme=scheme)
    plain = [reference(pm, p, 6, mode, s, keys[i]) for i, p in enumerate(prompts)]
    P.add_pause_adapters(pm, P.PauseAdapterSpec(rank=4))
    randomise(pm)
    want = [reference(pm, p, 6, mode, s, keys[i]) for i, p in enumerate(prompts)]
    assert want != plain  # the adapters change what the model decodes
    got, _ = engine_run(pm, prompts, mode, s, max_new=[6] * len(prompts), keys=keys)
    eager = generate(pm, prompts, mode=mode, max_new_tokens=6, decoder="eager", eos_token_ids=(),
                     sample=s.sample, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=4)
    for i in range(len(prompts)):
        assert_same(got[i], want[i])
        assert_same((eager[i].token_ids, eager[i].steps, eager[i].d), want[i])


@pytest.mark.parametrize("method,kind,scheme", [
    ({"name": "cyb", "num_steps": 3, "recipe": 2, "omega": [1.0, 1.0, 1.0]}, "cyb", "shared"),
    ({"name": "tbys_original", "num_steps": 3, "random_pause_fraction": 0.5}, "tbys", "advance")],
    ids=["recipe2", "inserted"])
def test_the_pauses_of_every_training_layout_are_found(method, kind, scheme):
    """Recipe 2's variable blocks and the original TBYS's inserted pauses: the adapters act
    exactly at the steps after the first of each block."""
    from cyb.config import MethodConfig
    from cyb.objective import Objective

    pm = build("llama", kind, init=0.3, num_steps=3, scheme=scheme, psi_dk=0.5 if kind == "cyb" else None)
    P.add_pause_adapters(pm, P.PauseAdapterSpec(rank=2))
    prep = Objective(MethodConfig(**method), pm.vocab, pm.dk_bias, "naive").prepare({"ids": IDS}, seeds=[1, 2])
    pm.hidden_states(prep.input_ids, prep.position_ids, prep.attention_mask, steps=prep.steps)
    mask = P.state_of(pm).mask
    assert mask.any() and torch.equal(mask, (prep.steps.step > 0).expand_as(mask) & prep.steps.valid.expand_as(mask))


@pytest.mark.parametrize("visibility", ["shared", "private"])
def test_an_adapted_projection_is_the_formula_in_float64(visibility):
    """y = W x + [input is a pause] * (alpha / r) * B (A x) at every position, against the
    formula written out in float64 (a scale that is not a power of two: alpha 8, rank 3)."""
    pm = layout(visibility)
    P.add_pause_adapters(pm, P.PauseAdapterSpec(rank=3, alpha=8.0))
    randomise(pm)
    pm.hf_model.double()
    proj = P.state_of(pm).modules["model.layers.0.self_attn.q_proj"]
    seen = {}
    handle = proj.register_forward_hook(lambda m, args, out: seen.update(x=args[0], y=out))
    pm(IDS, return_logits=True)
    handle.remove()
    x, a, b = seen["x"].double(), proj.pause_adapter_a.double(), proj.pause_adapter_b.double()
    pause = P.state_of(pm).mask.unsqueeze(-1).double()
    want = x @ proj.weight.double().T + (proj.bias.double() if proj.bias is not None else 0) \
        + pause * (8.0 / 3) * (x @ a.T @ b.T)
    assert pause.sum() > 0 and (1 - pause).sum() > 0
    torch.testing.assert_close(seen["y"], want, rtol=1e-12, atol=1e-12)
