"""The small shared modules: cyb.files (atomic writes), cyb.runtime (device, autocast),
cyb.vectors (per-step vectors) and cyb.colours (the pause colour scale)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from cyb.colours import DARK_BLUE, WHITE, is_light, pause_rgb
from cyb.files import jsonable, replace_dir, save_atomic, write_json_atomic, write_text_atomic
from cyb.runtime import autocast, resolve_device
from cyb.vectors import check_step_vector, step_vector_problem


def test_atomic_writes_leave_no_temporary_files(tmp_path):
    p = write_text_atomic(tmp_path / "a" / "b.txt", "one")
    write_text_atomic(p, "two")
    assert p.read_text() == "two"
    q = write_json_atomic(tmp_path / "m.json", {"x": math.nan, "y": [1.5, math.inf], "p": Path("z"), 3: (1, 2)})
    assert json.loads(q.read_text()) == {"x": None, "y": [1.5, None], "p": "z", "3": [1, 2]}
    save_atomic(tmp_path / "t.pt", lambda tmp: torch.save({"a": 1}, tmp))
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "f").write_text("n")
    (tmp_path / "old").mkdir()
    replace_dir(tmp_path / "new", tmp_path / "old")
    assert (tmp_path / "old" / "f").read_text() == "n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a", "m.json", "old", "t.pt"]
    assert jsonable(torch.float32) == "torch.float32"


def test_resolve_device_and_autocast():
    assert resolve_device("auto").type in ("cpu", "cuda")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="train.device: 'gpu0' is not a torch device"):
        resolve_device("gpu0", what="train.device")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="--device: CUDA was asked for"):
            resolve_device("cuda", what="--device")
    cpu = torch.device("cpu")
    with autocast(cpu, "bf16"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    for precision in ("auto", "fp32"):
        with autocast(cpu, precision):
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    with pytest.raises(ValueError, match="precision must be one of"):
        autocast(cpu, "fp8")


@pytest.mark.parametrize("values, discount, problem", [
    ([1, 2, 3], False, None),
    ([1, 2], False, "must have length M = 3"),
    ([1, float("inf"), 1], False, "must be finite"),
    ([1, -1, 1], False, "must be non-negative"),
    ([0, 0, 0], False, "must have a positive entry"),
    ([1, 0.5, 0.25], True, None),
    ([1, 1.5, 0.25], True, r"must lie in \[0, 1\]"),
])
def test_step_vectors(values, discount, problem):
    found = step_vector_problem(values, 3, discount=discount)
    if problem is None:
        assert found is None and check_step_vector("omega", values, 3, discount=discount) == [float(v) for v in values]
    else:
        assert found is not None
        with pytest.raises(ValueError, match="omega " + problem):
            check_step_vector("omega", values, 3, discount=discount)


def test_pause_colour_scale():
    assert pause_rgb(0.0) == WHITE and pause_rgb(1.0) == DARK_BLUE and pause_rgb(math.nan) == WHITE
    assert pause_rgb(-1) == WHITE and pause_rgb(2) == DARK_BLUE
    steps = [pause_rgb(f / 10) for f in range(11)]
    assert all(a >= b for x, y in zip(steps, steps[1:]) for a, b in zip(x, y))
    assert is_light(WHITE) and not is_light(DARK_BLUE)
