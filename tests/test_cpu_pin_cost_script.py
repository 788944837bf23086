"""benchmarks/cpu_pin_cost.py: each command run pinned and native, and its table."""

import json

from benchmarks import cpu_pin_cost as script


def test_pin_cost_runs_each_setting_and_prints_its_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(script, "COMMANDS", {"demo": ("cyb demo --help", ["demo", "--help"], "--out")})
    out = tmp_path / "cost.json"
    script.main(["--runs", "2", "--only", "demo", "--out", str(out)])
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "| command | pinned | native | pinned / native |"
    assert table[2].startswith("| `cyb demo --help` | ") and table[2].endswith("x |")
    runs = json.loads(out.read_text())["demo"]
    assert len(runs["pinned"]) == len(runs["native"]) == 2 and min(runs["pinned"] + runs["native"]) > 0
