"""Every missing piece is one line on the command line, never a traceback: a model path that does
not exist, a JSON-lines file without the text field, an ``hf:`` source offline, a missing
optional package (with the install command for a clone); ``cyb train --check`` checks paths; output
piped into a reader that stops early (``| head``) ends quietly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from cyb import extras
from cyb.cli import main

CONFIG = {"model": {"arch": "llama", "hidden_size": 32, "num_layers": 1, "num_heads": 2},
          "method": {"name": "cyb", "num_steps": 2},
          "data": {"source": "texts.jsonl", "valid_source": None, "valid_fraction": 0.2, "block_len": 16,
                   "bpe_vocab_size": 300, "bpe_train_docs": 20},
          "train": {"out_dir": "runs/x", "steps": 1, "batch_size": 2, "progress": False}}
HINT = "in the cyb clone, .venv/bin/pip install -e '.[{extra}]' (or CYB_EXTRAS={extra} bash scripts/setup.sh)"


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(CONFIG))
    with open(tmp_path / "texts.jsonl", "w") as f:
        for i in range(20):
            f.write(json.dumps({"text": f"document {i} says something about the weather " * 3}) + "\n")
    (tmp_path / "body.jsonl").write_text("".join(json.dumps({"body": "x y z"}) + "\n" for _ in range(5)))
    return tmp_path


def _one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"cyb {command}: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("setting,message", [
    ("model.name_or_path=runs/nothere/final", "model.name_or_path (runs/nothere/final) does not exist"),
    ("model.name_or_path=nobody-here/no-such-model", "model.name_or_path (nobody-here/no-such-model) is not a "
                                                     "local folder, and as a hub id it cannot be loaded"),
    ("data.tokenizer=./no/tokenizer", "data.tokenizer (./no/tokenizer) does not exist"),
    ("data.source=body.jsonl", "body.jsonl:1: no field 'text' (data.text_field), found ['body']"),
    ("data.source=missing.jsonl", "data source 'missing.jsonl' does not exist"),
])
def test_a_missing_model_or_data_is_one_line_and_leaves_no_folder(work, capsys, setting, message):
    assert main(["train", "run.yaml", "--set", setting]) == 2
    err = _one_line(capsys, "train")
    assert message in err and "local_files_only" not in err
    assert not (work / "runs" / "x").exists()


def test_an_unreachable_hub_data_set_is_one_line(work, capsys, monkeypatch):
    datasets = pytest.importorskip("datasets")

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'someone/corpus' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    assert main(["train", "run.yaml", "--set", "data.source=hf:someone/corpus"]) == 2
    err = _one_line(capsys, "train")
    assert "hf:someone/corpus: the hub data set cannot be opened (Couldn't reach" in err
    assert "which must be reachable" in err


@pytest.mark.parametrize("package,extra,setting", [
    ("datasets", "data", "data.source=hf:someone/corpus"),
    ("tensorboard", "tensorboard", "train.tensorboard=true"),
])
def test_a_missing_optional_package_names_the_install_command(work, capsys, monkeypatch, package, extra, setting):
    monkeypatch.setitem(sys.modules, package, None)
    assert main(["train", "run.yaml", "--set", setting]) == 2
    err = _one_line(capsys, "train")
    assert f"needs the {package} package, which is not installed: {HINT.format(extra=extra)}" in err
    assert "cyb[" not in err
    assert not (work / "runs" / "x").exists()


def test_install_hints_name_the_clone_never_the_package_index():
    for package, extra in extras.EXTRA_OF.items():
        hint = extras.install_hint(package)
        assert HINT.format(extra=extra) in hint and f"pip install {package}" in hint and "cyb[" not in hint
    error = extras.missing("peft", "LoRA")
    assert isinstance(error, ImportError) and str(error).startswith("LoRA needs the peft package")


def test_check_verifies_that_data_and_model_paths_exist(work, capsys, monkeypatch):
    assert main(["train", "run.yaml", "--check"]) == 0
    assert "configuration is valid; the data and model it names exist" in capsys.readouterr().out
    for setting, message in [
        ("data.source=missing.jsonl", "data.source: data source 'missing.jsonl' does not exist"),
        ("data.valid_source=./held/out.jsonl", "data.valid_source: data source './held/out.jsonl' does not exist"),
        ("data.source=builtin:nothing", "data.source: unknown built-in corpus"),
        ("model.name_or_path=runs/gone/final", "model.name_or_path (runs/gone/final) does not exist"),
        ("data.tokenizer=~/no/such/tokenizer", "data.tokenizer (~/no/such/tokenizer) does not exist"),
    ]:
        assert main(["train", "run.yaml", "--check", "--set", setting]) == 2, setting
        err = capsys.readouterr().err.strip()
        assert err.startswith("cyb train: error: invalid configuration: ") and message in err and "\n" not in err, err
    # a hub id (ORG/NAME, or a bare name) is no path: checked when the run starts, with a note
    for name in ("HuggingFaceTB/SmolLM2-135M", "someone/a-model", "gpt-nothing"):
        assert main(["train", "run.yaml", "--check", "--set", f"model.name_or_path={name}"]) == 0
        out = capsys.readouterr().out
        assert "configuration is valid; the local paths it names exist" in out
        assert f"note: model.name_or_path ({name}) is not a local folder: it is read as a hub id" in out
    # a known model's short name is no path either (fetched on first use)
    monkeypatch.setenv("CYB_CACHE", str(work / "empty-cache"))
    assert main(["train", "run.yaml", "--check", "--set", "model.name_or_path=smollm2-135m"]) == 0
    out = capsys.readouterr().out
    assert "note: model.name_or_path (smollm2-135m) is a known model not fetched yet" in out
    assert main(["train", "run.yaml", "--check", "--set", "model.name_or_path=missing.gguf"]) == 2
    assert "model.name_or_path (missing.gguf): the GGUF file does not exist" in capsys.readouterr().err
    assert main(["train", "run.yaml", "--check", "--set", "data.source=builtin:python-docs@train"]) == 0
    assert not (work / "runs").exists() and not (work / "empty-cache" / "models").exists()


def _help_texts():
    """Every command's parser (and each of cyb bench's), with its options' help as printed."""
    import argparse

    from cyb.cli import build_parser

    parser = build_parser()
    todo = [parser]
    while todo:
        p = todo.pop()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
        yield p.prog, p, p.format_help()


def test_help_says_a_default_only_where_it_tells_something():
    import re

    seen = 0
    for prog, parser, text in _help_texts():
        assert "(default: None)" not in text and "(default: False)" not in text, prog
        for action in parser._actions:
            if not action.help or action.help == "==SUPPRESS==":
                continue
            shown = parser.formatter_class(prog)._get_help_string(action) % {**vars(action), "prog": prog}
            assert shown.count("(default") <= 1, (prog, action.dest, shown)
            if not action.option_strings:
                assert "(default" not in shown, (prog, action.dest, shown)
        seen += 1
    assert seen >= 12  # cyb, its 8 commands and cyb bench's 4
    eval_help = dict((prog, text) for prog, _, text in _help_texts())["cyb eval"]
    assert re.search(r"--impl .*\(default: auto\)", " ".join(eval_help.split()))


@pytest.mark.parametrize("args,status", [(["train", "--help-config"], 141), (["train", "--help"], 0)])
def test_a_reader_that_closes_early_ends_the_command_quietly(args, status):
    read, write = os.pipe()
    child = subprocess.Popen([sys.executable, "-m", "cyb", *args], stdout=write, stderr=subprocess.PIPE)
    os.close(write)
    os.close(read)  # before the command writes anything: every write meets a closed pipe
    _, err = child.communicate(timeout=120)
    assert err.decode() == ""
    assert child.returncode == status  # argparse swallows its own failed write of --help


@pytest.mark.parametrize("args,command,unknown", [
    (["generate", "runs/x", "--promt", "hi"], "cyb generate", "--promt hi"),
    (["bench", "serve", "runs/x"], "cyb bench serve", "runs/x"),
    (["--nosuch"], "cyb", "--nosuch"),
])
def test_a_misspelled_option_is_named_by_the_command_it_was_given_to(capsys, args, command, unknown):
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {command} ")
    assert err.strip().splitlines()[-1] == f"{command}: error: unrecognized arguments: {unknown}"


def test_a_path_that_cannot_be_written_is_one_line(work, capsys):
    (work / "afile").write_text("x")
    assert main(["train", "run.yaml", "--set", "train.out_dir=afile"]) == 2
    assert _one_line(capsys, "train") == "cyb train: error: afile: File exists"
    assert (work / "afile").read_text() == "x"


@pytest.mark.parametrize("args,message", [
    (["generate", "x", "--prompt", "a", "--json", "afile/x.json"], "--json afile/x.json: afile is a file, not a folder"),
    (["generate", "x", "--prompt", "a", "--json", "adir"], "--json adir: adir is a folder"),
    (["eval", "x", "--out", "afile/deeper"], "--out afile/deeper: afile is a file, not a folder"),
    (["report", "x", "--out", "afile"], "--out afile: afile is a file, not a folder"),
    (["demo", "--out", "afile"], "--out afile: afile is a file, not a folder"),
    (["bench", "loss", "--quick", "--out", "adir"], "--out adir: adir is a folder"),
])
def test_an_output_path_that_cannot_be_written_is_refused_before_the_work(work, capsys, args, message):
    (work / "afile").write_text("x")
    (work / "adir").mkdir()
    assert main(args) == 2  # model x does not exist: the output is checked first
    assert _one_line(capsys, args[0]) == f"cyb {args[0]}: error: {message}"


def test_an_output_folder_without_permission_is_named(work, monkeypatch):
    from cyb.files import unwritable

    (work / "locked").mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: os.path.basename(path) != "locked")
    assert unwritable("locked/new/run.json") == "no permission to write in locked"
    assert unwritable("locked", folder=True) == "no permission to write in locked"
    assert unwritable("elsewhere/run.json") is None and unwritable("x.json") is None


def test_a_file_that_is_not_utf8_is_named(work, capsys):
    (work / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    assert main(["train", "latin1.txt"]) == 2
    assert _one_line(capsys, "train") == ("cyb train: error: invalid configuration: latin1.txt is not UTF-8 text "
                                          "(byte 0xe9: invalid continuation byte)")
    assert main(["generate", "runs/none", "--file", "latin1.txt"]) == 2
    assert _one_line(capsys, "generate").endswith(": error: --file latin1.txt is not UTF-8 text (byte 0xe9: "
                                                  "invalid continuation byte)")
    assert main(["train", "run.yaml", "--set", "data.source=latin1.txt"]) == 2
    assert _one_line(capsys, "train").endswith("latin1.txt is not UTF-8 text (byte 0xe9: invalid continuation byte)")
    assert not (work / "runs" / "x").exists()


def test_a_folder_given_as_the_config_is_named(work, capsys):
    assert main(["train", "."]) == 2
    assert _one_line(capsys, "train") == ("cyb train: error: invalid configuration: . is a folder; give a YAML file "
                                          "(see configs/)")

def test_world_size_goes_with_estimate_memory(work, capsys):
    assert main(["train", "run.yaml", "--world-size", "2"]) == 2
    assert "--world-size goes with --estimate-memory" in _one_line(capsys, "train")
    assert not (work / "runs" / "x").exists()


@pytest.mark.parametrize("args", [["train"], ["train", "run.yaml", "--world-size", "2"], ["eval", "x", "--tokens", "-1"],
                                  ["bench"]])
def test_every_refusal_says_error_after_the_command(work, capsys, args):
    assert main(args) == 2
    assert _one_line(capsys, args[0]).startswith(f"cyb {args[0]}: error: ")
