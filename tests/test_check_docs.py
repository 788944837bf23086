"""scripts/check_docs.py: what it reads on the pages, how it compares, what --write changes. (The
full check runs the examples and takes half an hour: bash scripts/check_docs.sh, by hand.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest


def _load():
    """scripts/check_docs.py, loaded from its path (scripts/ is no package)."""
    import importlib.util
    import sys

    path = Path(__file__).resolve().parent.parent / "scripts" / "check_docs.py"
    spec = importlib.util.spec_from_file_location("check_docs", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_docs"] = module
    spec.loader.exec_module(module)
    return module


cd = _load()


def test_every_mark_fact_and_claim_of_the_pages_is_known_and_found():
    for page in cd.PAGES:
        found = list(cd.findings(page, None))  # raises on a mark that names no block
        missing = [f.what for f in found if f.shown == "(not found on the page)"]
        assert not missing, f"{page}: facts whose phrase the page no longer has: {missing}"
    marks = {m.group(1) for page in cd.PAGES for m in cd._MARK.finditer((cd.REPO / page).read_text())}
    assert marks == set(cd.BLOCKS), "a block of check_docs.py that no page marks, or the reverse"


def test_the_pages_show_runs_made_with_one_thread():
    assert cd.THREADS == "1"
    from cyb import threads

    assert threads.DEFAULT == 1


class FakeContext:
    def __init__(self, work: Path):
        self.work = work
        self.commands = []

    def run(self, name):
        self.commands.append(f"run {name}")
        return ""

    def shell(self, command, merged=False):
        self.commands.append(command)
        return ("answer 42\n[3 tokens, 0.5 s]\n", "")


PAGE = """# A page

<!-- check: numbers -->
```
old numbers
```

Then:

```
$ cyb generate /tmp/add/final --prompt "1+1="
answer 41
[3 tokens, 9.9 s]
```

and the run ended at perplexity 12 here.
"""


@pytest.fixture
def page(tmp_path, monkeypatch):
    (tmp_path / "page.md").write_text(PAGE)
    monkeypatch.setattr(cd, "REPO", tmp_path)
    monkeypatch.setattr(cd, "BLOCKS", {"numbers": cd.Block(lambda ctx: "new numbers\nin two lines\n")})
    monkeypatch.setattr(cd, "FACTS", [cd.Fact("page.md", r"ended at perplexity \d+", "ended at perplexity {ppl}",
                                              lambda ctx: {"ppl": "11"})])
    monkeypatch.setattr(cd, "CLAIMS", [("page.md", "the run ended", lambda ctx: (False, "it did not"))])
    return tmp_path / "page.md"


def test_blocks_commands_facts_and_claims_are_compared_timings_left_out(page, tmp_path):
    ctx = FakeContext(tmp_path / "work")
    found = list(cd.findings("page.md", ctx))
    kinds = [(f.what.split(" ")[0], f.same()) for f in found]
    assert kinds == [("block", False), ("$", False), ("fact", False), ("claim", False)]
    command = found[1]
    assert command.shown == "answer 41\n[3 tokens, 9.9 s]\n" and command.line == 12
    assert "run add" in ctx.commands  # the run the command names is made first
    assert f"cyb generate {tmp_path / 'work'}/add/final" in ctx.commands[-1]  # /tmp/ is the work folder
    command.got = "answer 41\n[3 tokens, 0.1 s]\n"
    assert command.same()  # a timing alone does not count
    assert "does not hold: it did not" in found[3].got


def test_write_puts_what_ran_into_the_page_and_leaves_claims(page, tmp_path):
    ctx = FakeContext(tmp_path / "work")
    assert cd.write("page.md", list(cd.findings("page.md", ctx))) == 3
    text = page.read_text()
    assert "```\nnew numbers\nin two lines\n```" in text
    assert "answer 42\n[3 tokens, 0.5 s]\n```" in text and "answer 41" not in text
    assert "ended at perplexity 11 here" in text
    again = list(cd.findings("page.md", ctx))
    assert [f.same() for f in again] == [True, True, True, False]  # the claim is for a person to rewrite


def test_the_work_folder_is_shown_as_tmp(tmp_path):
    ctx = cd.Context(tmp_path / "w", None, fresh=False, verbose=False)
    assert ctx.public(f"written to {tmp_path / 'w'}/add/eval") == "written to /tmp/add/eval"
    assert ctx.env["CYB_NUM_THREADS"] == "1" and ctx.env["HF_HUB_OFFLINE"] == "1"
    out, err = ctx.shell("echo $CYB_NUM_THREADS; pwd")
    assert out.splitlines() == ["1", "/tmp"]
    assert re.fullmatch(r"\d+ s", "12 s") and cd.TIMING.search("took 12.5 s")


def test_the_readme_command_table_names_every_command_and_bench_part():
    import argparse

    from cyb.cli import build_parser
    from cyb.commands import NAMES

    readme = (cd.REPO / "README.md").read_text()
    table = "\n".join(line for line in readme.splitlines() if line.startswith("| `"))
    for name in NAMES:
        assert f"`cyb {name}" in table, name
    bench = build_parser()._subparsers._group_actions[0].choices["bench"]
    parts = next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert "`cyb bench " + "\\|".join(parts) + "`" in table


def test_the_demo_numbers_are_read_from_what_the_demo_prints(monkeypatch):
    """The phrases of demo.md are made from the demo's report as :mod:`cyb.demo.present` prints it."""
    from cyb.demo.present import summary_lines

    def method(exact, steps, decoding=None):
        r = {"num_steps": 1 if steps == [1] * 5 else 4, "exact_match": exact, "token_accuracy": 0.9, "ppl": 1.1,
             "mean_steps": sum(steps) / 5, "greedy_steps": 1.0, "train_seconds": 60.0, "recipe": 1,
             "per_position_accuracy": [1.0, 1.0, 0.5, 0.5, 1.0], "per_position_steps": steps}
        if decoding:
            r["decoding"] = {mode: {"exact_match": e, "positions_per_token": p, "seconds": 0.2}
                             for mode, (e, p) in zip(("fixed", "adaptive"), decoding)}
        return r

    metrics = {"methods": {"baseline": method(0.005, [1] * 5), "tbys": method(0.994, [4] * 5),
                           "cyb": method(0.842, [1.0, 1.0, 1.0, 1.02, 1.0], [(0.83, 4.0), (0.0, 1.0)]),
                           "cyb_decoupled": method(0.948, [1.82, 1.82, 2.64, 2.64, 1.0], [(0.939, 4.0), (0.943, 1.99)])},
               "total_seconds": 286.0}
    report = "\n".join(summary_lines(Path("runs/demo"), metrics))
    monkeypatch.setattr(cd, "demo_report", lambda ctx: cd._lines_between(report, "| method"))
    assert cd.demo_numbers(None) == {"dec_exact": "94.8%", "dec_hard": "2.64", "dec_easy": "1.82",
                                     "dec_adaptive": "94.3%", "dec_positions": "1.99", "cyb_es": "1.00",
                                     "tbys_exact": "99.4%", "dec_fixed": "93.9%", "cyb_fixed": "83.0%",
                                     "cyb_adaptive": "0.0%"}
    assert cd._decoupled_misses(None) == (True, "cyb_decoupled 94.8% against TBYS 99.4%")


def _event(text, steps, finish=None, id_="cmpl-1"):
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "steps": steps}
    return "data: " + json.dumps({"id": id_, "object": "text_completion", "created": 7, "model": "m",
                                  "choices": [choice]}, separators=(",", ":")) + "\n"


def test_a_stream_is_compared_by_its_text_steps_and_ending_not_by_how_it_falls_into_events():
    block = cd.BLOCKS["serve-stream"]
    five = "".join([_event("1", [1]), _event("6", [4]), _event("8", [4]), _event("7", [4]),
                    _event("", [1], "stop")]) + "data: [DONE]\n"
    four = "".join([_event("1", [1]), _event("6", [4]), _event("8", [4]), _event("7", [4, 1], "stop")]) + \
        "data: [DONE]\n"

    def same(shown, got):
        return cd.Finding("p", 1, "block", shown, got, block.volatile, None, block.compared).same()

    assert same(five, four)
    assert same(five, five.replace("cmpl-1", "cmpl-2").replace('"created":7', '"created":8'))
    assert not same(five, four.replace('"7"', '"9"'))  # the text
    assert not same(five, four.replace("[4,1]", "[4,2]"))  # the steps
    assert not same(five, four.replace('"stop"', '"length"'))  # how it ends
    assert not same(five, five.replace(_event("8", [4]), _event("8", [4], "stop")))
    assert not same(five, five.removesuffix("data: [DONE]\n"))
    assert not same(five, five.replace('"model":"m"', '"model":"n"', 1))  # a field of one event
