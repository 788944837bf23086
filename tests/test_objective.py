"""The objective of every method: layout, training loss and metric sums of a fixed batch.

``golden/objective.json`` holds the loss and metric sums of a fixed tiny model on a fixed batch
for every method, as exact float hex strings: refactoring must leave them bitwise unchanged.
Regenerate deliberately with ``CYB_WRITE_GOLDEN=1 pytest tests/test_objective.py``; on the machine
that wrote them, ``CYB_GOLDEN_EXACT=1`` compares bit for bit (elsewhere to 1e-6: other CPUs may
round differently).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from cyb.build import build_model
from cyb.config import RunConfig
from cyb.objective import Objective
from cyb.run_data import synthetic_sets

GOLDEN = Path(__file__).parent / "golden" / "objective.json"
M = 3

CASES = {
    "baseline": {"name": "baseline"},
    "tbys": {"name": "tbys"},
    "tbys_omega": {"name": "tbys", "omega": [1, 1, 2]},
    "tbys_recipe2": {"name": "tbys", "recipe": 2, "omega": [1, 1, 1]},
    "tbys_original_random": {"name": "tbys_original", "random_pause_fraction": 0.3},
    "tbys_original_append": {"name": "tbys_original", "tbys_scheme": "append"},
    "cyb": {"name": "cyb"},
    "cyb_gamma0": {"name": "cyb", "gamma0": 0.9},
    "cyb_omega": {"name": "cyb", "omega": [1, 0, 3]},
    "cyb_recipe2": {"name": "cyb", "recipe": 2, "omega": [1, 2, 1]},
    "cyb_no_prior": {"name": "cyb", "psi_dk": None},
    "cyb_va": {"name": "cyb_va", "rho": [1, 2, 1]},
    "cyb_dp": {"name": "cyb_dp", "rho": [0, 1, 1], "alpha": 0.1, "gamma": [1, 0.9, 0.5]},
    "cyb_anytime": {"name": "cyb_anytime", "aux_weight": 0.3},
    "cyb_decoupled": {"name": "cyb_decoupled", "omega": [1, 1, 2]},
    "cyb_ponder": {"name": "cyb_ponder", "ponder_cost": -0.05, "gamma0": 0.9},
    "cyb_anytime_recipe2": {"name": "cyb_anytime", "recipe": 2, "omega": [1, 2, 1]},
}


def _config(method: dict) -> RunConfig:
    return RunConfig.from_dict({
        "model": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "max_position_embeddings": 256},
        "method": {"num_steps": M, **method},
        "data": {"task": "addition", "task_kwargs": {"digits": 2}, "num_train_examples": 8,
                 "num_valid_examples": 8},
        "train": {"device": "cpu", "seed": 0},
    }).validate()


def _hex(x) -> str | list:
    if isinstance(x, torch.Tensor):
        x = x.detach().double()
        return [float(v).hex() for v in x.flatten().tolist()] if x.dim() else float(x).hex()
    return float(x).hex() if isinstance(x, float) else x


def compute(case: str, impl: str) -> dict:
    cfg = _config(CASES[case])
    torch.manual_seed(0)
    train, _ = synthetic_sets(cfg)
    from cyb.data.synthetic import CharTokenizer

    model = build_model(cfg, CharTokenizer().to_hf()).eval()
    batch = {"ids": train.ids[:4], "attention_mask": train.attention_mask[:4], "loss_mask": train.loss_mask[:4]}
    objective = Objective(cfg.method, model.vocab, model.dk_bias, impl)
    with torch.no_grad():
        out = objective(model, batch, seeds=[11, 12, 13, 14])
    return {"loss_sum": _hex(out.loss_sum), "num_targets": out.num_targets,
            **{k: _hex(v) for k, v in sorted(out.sums.items())}}


def _all() -> dict:
    return {f"{case}/{impl}": compute(case, impl) for case in CASES for impl in ("naive", "fused")}


def test_golden_losses_and_metrics_are_unchanged():
    torch.set_num_threads(1)
    got = _all()
    if os.environ.get("CYB_WRITE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        pytest.skip("golden values written")
    want = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(want)
    exact = bool(os.environ.get("CYB_GOLDEN_EXACT"))  # bitwise on the machine that wrote them
    for key in want:
        assert sorted(got[key]) == sorted(want[key]), key
        for name, value in want[key].items():
            if exact or not isinstance(value, (str, list)):
                assert got[key][name] == value, (key, name)
            else:
                as_float = lambda v: [float.fromhex(x) for x in v] if isinstance(v, list) else [float.fromhex(v)]  # noqa: E731
                assert as_float(got[key][name]) == pytest.approx(as_float(value), rel=1e-6, abs=1e-9), (key, name)


@pytest.mark.parametrize("case", ["tbys", "cyb", "cyb_va", "cyb_dp", "cyb_recipe2", "cyb_anytime", "cyb_decoupled",
                                  "cyb_ponder"])
def test_fused_and_naive_readouts_agree(case):
    naive, fused = compute(case, "naive"), compute(case, "fused")
    for key in ("loss_sum", "objective", "nll"):
        assert float.fromhex(fused[key]) == pytest.approx(float.fromhex(naive[key]), rel=1e-5), key
    assert naive["num_targets"] == fused["num_targets"] > 0


def test_every_method_has_finite_losses_and_counts_targets():
    for case in CASES:
        out = compute(case, "naive")
        assert out["num_targets"] == out["targets"] > 0
        assert all(abs(float.fromhex(out[k])) < 1e6 for k in ("loss_sum", "objective", "nll")), case
        if case.startswith("cyb"):
            dist = [float.fromhex(v) for v in out["stop_dist"]]
            assert len(dist) == M and sum(dist) == pytest.approx(out["targets"], rel=1e-5)


def test_prepared_batches_move_whole_to_a_device():
    """Recipe 2's layout travels with the batch (its gather indices must sit beside the model's
    outputs on the GPU)."""
    import dataclasses

    from cyb.config import MethodConfig
    from cyb.layout import PauseVocab

    obj = Objective(MethodConfig(name="cyb", num_steps=3, recipe=2, omega=[1, 1, 1]),
                    PauseVocab(num_steps=3, pause_ids=(10, 11), dk_id=12, vocab_size=13))
    moved = obj.prepare({"ids": torch.randint(0, 9, (2, 5))}, seeds=[1, 2]).to("meta")
    assert moved.input_ids.device.type == "meta"
    ex = moved.variable
    assert all(getattr(ex, f.name).device.type == "meta" for f in dataclasses.fields(ex)
               if isinstance(getattr(ex, f.name), torch.Tensor))
    assert ex.num_steps == 3
