"""``cyb generate``: prompts from flags and files, JSON output, shading, batches, decoders, run
folders and errors, on a saved tiny model."""

from __future__ import annotations

import json

import pytest

from cyb.cli import main
from generation_helpers import model

pytestmark = pytest.mark.usefixtures("one_thread")

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    model("llama").save_pretrained(path)
    return path


def test_cli_generate(saved, tmp_path, capsys):
    out_json = tmp_path / "out.json"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("xyz\n\nab 1\n")
    code = main(["generate", str(saved), "--prompt", "12+", "--file", str(prompts),
                 "--max-new-tokens", "5", "--ignore-eos", "--json", str(out_json), "--device", "cpu"])
    assert code == 0
    out = capsys.readouterr().out
    assert "12+" in out and "xyz" in out and "ab 1" in out
    data = json.loads(out_json.read_text())
    assert data["num_steps"] == 3 and data["config"]["mode"] == "fixed"
    assert len(data["results"]) == 3
    assert all(len(r["token_ids"]) == 5 and len(r["d"]) == 5 for r in data["results"])


def test_cli_generate_shaded_adaptive_batch(saved, capsys):
    code = main(["generate", str(saved), "--prompt", "12+", "--prompt", "hello", "--mode", "adaptive",
                 "--shade", "--batch-size", "2", "--sample", "--seed", "0", "--max-new-tokens", "5"])
    assert code == 0
    out = capsys.readouterr().out
    assert "steps used per token" in out
    assert "\x1b[48;" in out and "12+" in out and "hello" in out


def test_cli_errors(saved, tmp_path, capsys):
    assert main(["generate", str(tmp_path / "missing"), "--prompt", "a"]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{}")
    assert main(["generate", str(tmp_path), "--prompt", "a"]) == 2
    assert "not a saved cyb model: expected cyb_pause.json" in capsys.readouterr().err
    assert main(["generate", str(saved), "--prompt", "a", "--temperature", "0.5"]) == 2
    assert "--temperature only applies with --sample" in capsys.readouterr().err
    assert main(["generate", str(saved), "--prompt", "a", "--top-k", "3", "--seed", "1"]) == 2
    assert "--top-k and --seed only apply with --sample" in capsys.readouterr().err
    assert main(["generate", str(saved), "--prompt", "a", "--sample", "--top-p", "2"]) == 2
    assert "--top-p must lie in (0, 1]" in capsys.readouterr().err
    assert main(["generate", str(saved), "--prompt", "a", "--max-new-tokens", "0"]) == 2
    assert "--max-new-tokens must be >= 1" in capsys.readouterr().err
    assert main(["generate", str(saved)]) == 2
    assert "no prompt given" in capsys.readouterr().err
    assert main(["generate", str(saved), "--prompt", "a", "--decoder", "graph", "--device", "cpu"]) == 2
    assert "--decoder graph: " in capsys.readouterr().err


def test_cli_generate_decoders_agree(saved, tmp_path, capsys):
    texts = {}
    for decoder in ("eager", "static"):
        out_json = tmp_path / f"{decoder}.json"
        assert main(["generate", str(saved), "--prompt", "12+", "--prompt", "hello", "--batch-size", "2",
                     "--max-new-tokens", "6", "--decoder", decoder, "--json", str(out_json),
                     "--device", "cpu"]) == 0
        data = json.loads(out_json.read_text())
        assert data["decoder_used"] == decoder and data["config"]["decoder"] == decoder
        texts[decoder] = [r["token_ids"] for r in data["results"]]
    assert texts["eager"] == texts["static"]
    assert "auto = graph on CUDA" in " ".join(_help_lines(capsys))


def _help_lines(capsys) -> list[str]:
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    return capsys.readouterr().out.split()


def test_cli_generate_accepts_a_run_folder(saved, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("method: {name: cyb}\n")
    assert main(["generate", str(run), "--prompt", "a"]) == 2
    assert "training has not finished" in capsys.readouterr().err
    shutil.copytree(saved, run / "final")
    assert main(["generate", str(run), "--prompt", "12+", "--max-new-tokens", "3", "--device", "cpu"]) == 0
    assert "12+" in capsys.readouterr().out


def test_cyb_generate_compiles_fused_kernels_only_for_long_jobs():
    """A one-off job of fewer decoding steps than FUSED_MIN_STEPS runs the plain model (no
    seconds of compiling for a few hundred steps); a long one keeps the engine's default."""
    from cyb.commands.generate import FUSED_MIN_STEPS, engine_options_for

    assert engine_options_for(1, 64, 1).fused is False
    assert engine_options_for(100, 256, 100).fused is False  # one batch: 256 steps
    assert engine_options_for(FUSED_MIN_STEPS // 64, 64, 1).fused is None  # one at a time
    assert engine_options_for(3, FUSED_MIN_STEPS, 2).fused is None
