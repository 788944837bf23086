"""What pinning the CPU's numerics costs: the CPU seconds (user and system) of the same ``cyb``
command pinned and with ``CYB_CPU_NUMERICS=native``, alternating, each run in an output folder of
its own::

    python benchmarks/cpu_pin_cost.py [--runs 2] [--only demo tiny smollm2] [--out FILE.json]

The ``smollm2`` command needs the model in the cache (``cyb fetch smollm2-135m``).  Prints a
markdown table (docs/record/benchmarks/cpu.md, "CPU numerics") and writes every run's seconds to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

NO_SAVES = ["--set", "train.eval_every=0", "--set", "train.save_every=0"]
COMMANDS = {
    "demo": ("cyb demo --steps 300", ["demo", "--steps", "300", "--no-progress", "--fresh"], "--out"),
    "tiny": ("cyb train configs/cpu-tiny.yaml --set train.steps=40",
             ["train", "configs/cpu-tiny.yaml", "--set", "train.steps=40", *NO_SAVES], "train.out_dir"),
    "smollm2": ("cyb train configs/smollm2-135m.yaml --set train.steps=4",
                ["train", "configs/smollm2-135m.yaml", "--set", "train.steps=4", *NO_SAVES], "train.out_dir"),
}


def cpu_seconds(args: list[str], out_flag: str, numerics: str) -> float:
    """User plus system CPU seconds of ``cyb ARGS`` run to completion under ``CYB_CPU_NUMERICS``."""
    with tempfile.TemporaryDirectory() as out:
        where = [out_flag, out] if out_flag.startswith("--") else ["--set", f"{out_flag}={out}"]
        env = {**os.environ, "CYB_CPU_NUMERICS": numerics}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-m", "cyb", *args, *where], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="runs of each setting (default: 2)")
    parser.add_argument("--only", nargs="+", choices=sorted(COMMANDS), default=list(COMMANDS))
    parser.add_argument("--out", help="write every run's CPU seconds here as JSON")
    a = parser.parse_args(argv)
    rows = {}
    for name in a.only:
        label, args, out_flag = COMMANDS[name]
        seconds = {"pinned": [], "native": []}
        for run in range(a.runs):
            for numerics in ("pinned", "native"):
                seconds[numerics].append(cpu_seconds(args, out_flag, numerics))
                print(f"{name} run {run + 1} {numerics}: {seconds[numerics][-1]:.1f} s", file=sys.stderr, flush=True)
        rows[name] = {"command": label, **seconds}
    print("| command | pinned | native | pinned / native |\n| --- | --- | --- | --- |")
    for row in rows.values():
        ratio = statistics.mean(row["pinned"]) / statistics.mean(row["native"])
        fmt = lambda xs: ", ".join(f"{x:.1f}" for x in xs) + " s"
        print(f"| `{row['command']}` | {fmt(row['pinned'])} | {fmt(row['native'])} | {ratio:.1f}x |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
