"""``python -m cyb.integrations.lm_eval``: its help says how to use the model, the task folder and
``CYB_EVAL_DATA``; a missing harness, data folder or model folder is one line; a reader that stops
early ends it quietly."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cyb.integrations import harness_cli
from cyb.integrations.tasks import tasks_dir


def _check_usage(text: str) -> None:
    assert "--model cyb" in text and "pretrained=MODEL" in text
    assert f"--include_path TASKS_DIR  cyb's task folder, here {tasks_dir()}" in text
    assert "$CYB_EVAL_DATA" in text and "hellaswag/validation.jsonl" in text
    assert "not shipped with cyb" in text and "cyb_tiny_mc" in text


def test_help_without_the_harness_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    assert harness_cli.main(["--help"]) == 2
    out, err = capsys.readouterr()
    _check_usage(out)
    assert err.strip() == (f"{harness_cli.PROG}: error: {harness_cli.PROG} needs the lm_eval package, which is not "
                           "installed: in the cyb clone, .venv/bin/pip install -e '.[eval]' (or CYB_EXTRAS=eval "
                           "bash scripts/setup.sh); in another environment, pip install lm_eval")


def test_help_as_a_module_then_the_harness_options():
    pytest.importorskip("lm_eval")
    done = subprocess.run([sys.executable, "-m", "cyb.integrations.lm_eval", "--help"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    _check_usage(done.stdout)
    assert done.stdout.index("The options of lm_eval follow.") < done.stdout.index("usage: lm")


def test_help_into_a_reader_that_closes_early_ends_quietly():
    read, write = os.pipe()
    child = subprocess.Popen([sys.executable, "-m", "cyb.integrations.lm_eval", "--help"], stdout=write,
                             stderr=subprocess.PIPE)
    os.close(write)
    os.close(read)  # before anything is written: every write meets a closed pipe
    _, err = child.communicate(timeout=300)
    assert err.decode() == "" and child.returncode == 141


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from cyb.data.synthetic import CharTokenizer
    from cyb.model import PauseModel
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=128)
    model = PauseModel.from_config(config, CharTokenizer().to_hf(), num_steps=2)
    return model.save_pretrained(tmp_path_factory.mktemp("lm") / "model")


@pytest.mark.parametrize("case", ["no_data_dir", "no_model", "unknown_option"])
def test_a_missing_data_folder_or_model_or_a_wrong_option_is_one_line(tiny_model, monkeypatch, capsys, case):
    pytest.importorskip("lm_eval")
    monkeypatch.delenv("CYB_EVAL_DATA", raising=False)
    model = "runs/not-here/final" if case == "no_model" else str(tiny_model)
    extra = ",decodr=eager" if case == "unknown_option" else ""
    code = harness_cli.main(["--model", "cyb", "--model_args", f"pretrained={model},device=cpu{extra}",
                             "--tasks", "hellaswag_local", "--include_path", str(tasks_dir()), "--limit", "1"],
                            model_module="cyb.integrations.lm_eval")
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"{harness_cli.PROG}: error: ")
    if case == "no_data_dir":
        assert "no data folder for the local benchmark tasks: set the environment variable CYB_EVAL_DATA" in err
    elif case == "no_model":
        assert "pretrained=runs/not-here/final does not exist" in err
    else:
        assert err.endswith("model_args: the cyb model takes no option decodr; its options: pretrained, device, "
                            "batch_size, max_batch_size, mode, dtype, max_length, max_gen_toks, add_bos_token, "
                            "num_steps, attn_implementation, seed, decoder")


@pytest.mark.parametrize("include", [False, True])
def test_a_task_the_harness_does_not_know_is_one_line_that_says_where_cybs_tasks_are(tiny_model, capsys, include):
    pytest.importorskip("lm_eval")
    folder = ["--include_path", str(tasks_dir())] if include else []
    code = harness_cli.main(["--model", "cyb", "--model_args", f"pretrained={tiny_model},device=cpu", "--tasks",
                             "nosuch", *folder, "--limit", "1"], model_module="cyb.integrations.lm_eval")
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"{harness_cli.PROG}: error: Tasks not found: nosuch: ")
    where = "neither the harness nor --include_path has" if include else f"--include_path {tasks_dir()}"
    assert where in err and "cyb_tiny_mc" in err


def test_a_task_whose_text_the_model_cannot_read_is_one_line(tiny_model):
    pytest.importorskip("lm_eval")
    done = subprocess.run([sys.executable, "-m", "cyb.integrations.lm_eval", "--model", "cyb", "--model_args",
                           f"pretrained={tiny_model},device=cpu", "--tasks", "cyb_tiny_mc", "--include_path",
                           str(tasks_dir()), "--limit", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "WordLevel error" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{harness_cli.PROG}: error: the context of document 0 of task cyb_tiny_mc has the "
                           "characters '\\n', 'T', 'W' that the model's character tokenizer does not have (it reads "
                           "only '0123")


@pytest.mark.parametrize("kind,args,what", [
    ("loglikelihood", ("héllo 世界", " a"), "the context"),
    ("loglikelihood", ("a", " héllo 世界"), "the continuation"),
    ("loglikelihood_rolling", ("héllo 世界",), "the text"),
    ("generate_until", ("héllo 世界", {"until": ["\n"], "max_gen_toks": 2}), "the context"),
])
def test_every_kind_of_request_names_its_document_and_the_characters(tiny_model, kind, args, what):
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from cyb.data.tokenizer import UnencodableText
    from cyb.integrations.lm_eval import CybLM

    lm = CybLM(str(tiny_model), device="cpu")
    request = Instance(request_type=kind, doc={}, arguments=args, idx=0, metadata=("tiny", 3, 1))
    with pytest.raises(UnencodableText) as e:
        getattr(lm, kind)([request], disable_tqdm=True)
    assert str(e.value) == (f"{what} of document 3 of task tiny has the characters 'é', '世', '界' that the "
                            f"model's character tokenizer does not have (it reads only "
                            "'0123456789abcdefghijklmnopqrstuvwxyz+-*=,.;:?>|() ')")
