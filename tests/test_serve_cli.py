"""``cyb serve`` on the command line: one-line errors before anything listens (a missing
extra, a bad option, a model that is not there) and the options it turns into."""

from __future__ import annotations

import sys

import pytest

from cyb.cli import build_parser, main


@pytest.mark.parametrize("package", ["starlette", "uvicorn"])
def test_a_missing_serve_extra_is_one_line_with_the_install_command(monkeypatch, capsys, package):
    monkeypatch.setitem(sys.modules, package, None)
    assert main(["serve", "some/model"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"needs the {package} package" in err and ".[serve]" in err


@pytest.mark.parametrize("args, message", [
    (["serve", "/no/such/model"], "MODEL /no/such/model does not exist"),
    (["serve", "x", "--port", "70000"], "--port must be an integer in [0, 65535]"),
    (["serve", "x", "--max-model-len", "1"], "--max-model-len must be >= 2"),
    (["serve", "x", "--slots", "0"], "--slots must be an integer >= 1, got 0"),
    (["serve", "x", "--http-processes", "0"], "--http-processes must be an integer >= 1, got 0"),
    (["serve", "x", "--cache-memory", "0"], "--cache-memory must be > 0 GiB"),
    (["serve", "x", "--chat-template", "/no/such/file.jinja"], "--chat-template /no/such/file.jinja: no such file"),
    (["serve", "x", "--grace-period", "-1"], "--grace-period must be a finite number of seconds >= 0"),
    (["serve", "x", "--block-size", "24"], "--block-size must be a power of two from 1 to 256"),
    (["serve", "x", "--prefill-rows", "0"], "--prefill-rows must be an integer >= 1, got 0"),
    (["serve", "x", "--host", "nosuch.invalid"], "--host nosuch.invalid: no address of that name ("),
    (["serve", "x", "--chat-template", "latin1.jinja"], "--chat-template latin1.jinja is not UTF-8 text (byte 0xe9: "),
])
def test_bad_options_are_one_line(capsys, tmp_path, monkeypatch, args, message):
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "latin1.jinja").write_bytes("{{ café }}".encode("latin-1"))
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cyb serve: error: ") and message in err and "\n" not in err, err


def test_options_from_the_command_line(monkeypatch, tmp_path):
    from cyb.commands.serve import options_from

    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    monkeypatch.setenv("CYB_API_KEY", "from-env")
    args = build_parser().parse_args(["serve", "m", "--port", "0", "--slots", "8", "--cache-memory", "0.5",
                                      "--chat-template", str(template), "--mode", "fixed"])
    opts = options_from(args)
    assert (opts.host, opts.port, opts.slots, opts.cache_bytes, opts.mode) == ("127.0.0.1", 0, 8, 1 << 29, "fixed")
    assert opts.api_key == "from-env" and opts.chat_template == "{{ messages[0]['content'] }}"
    assert options_from(build_parser().parse_args(["serve", "m", "--api-key", "k"])).api_key == "k"
    assert opts.engine_options == {}
    paged = options_from(build_parser().parse_args(["serve", "m", "--block-size", "32", "--no-prefix-caching",
                                                    "--step-budget", "1024"]))
    assert paged.engine_options == {"block_size": 32, "prefix_caching": False, "step_budget": 1024}
    prefill = options_from(build_parser().parse_args(["serve", "m", "--prefill-chunk", "512", "--prefill-rows", "1"]))
    assert prefill.engine_options == {"prefill_chunk": 512, "prefill_rows": 1}
