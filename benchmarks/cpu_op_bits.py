"""Which of torch's float operations on the CPU give other bits on another CPU model: each
operation's result hashed here and under ``qemu-x86_64 -cpu CPU`` (Debian's qemu-user), with the
CPU's numerics pinned as the ``cyb`` command pins them (:mod:`cyb.cpu_numerics`)::

    python benchmarks/cpu_op_bits.py [--emulate Haswell-v4 EPYC-Rome-v2]

Prints the operations whose bits moved under each emulated CPU (or, with ``--emulate`` empty,
this machine's hashes).  docs/record/benchmarks/cpu.md ("CPU numerics") has what it found.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys

UNARY = ("sqrt", "rsqrt", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "tanh", "erf", "erfc", "erfinv",
         "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "sigmoid", "reciprocal", "lgamma", "digamma")


def hashes() -> dict[str, str]:
    """``{operation: hash of its result}`` on fixed inputs (float32, 16,384 values)."""
    from cyb.cpu_numerics import pin

    pin()
    import torch

    f = torch.nn.functional
    torch.manual_seed(0)
    x = torch.rand(1 << 14) * 0.9 + 0.05
    y = torch.randn(1 << 14)
    rows = y.view(128, -1)
    ops = {name: (lambda name=name: getattr(torch, name)(x)) for name in UNARY}
    ops.update({
        "pow(x, 1.7)": lambda: x.pow(1.7), "pow(x, 0.5)": lambda: x.pow(0.5), "div": lambda: y / x,
        "softmax": lambda: rows.softmax(-1), "log_softmax": lambda: rows.log_softmax(-1),
        "logsumexp": lambda: rows.logsumexp(-1), "gelu": lambda: f.gelu(y), "gelu tanh": lambda: f.gelu(y, approximate="tanh"),
        "silu": lambda: f.silu(y), "softplus": lambda: f.softplus(y), "logsigmoid": lambda: f.logsigmoid(y),
        "norm": lambda: rows.norm(dim=-1), "rms_norm": lambda: f.rms_norm(rows, (128,)),
        "layer_norm": lambda: f.layer_norm(rows, (128,)), "atan2": lambda: torch.atan2(y, x), "hypot": lambda: torch.hypot(y, x),
        "cumsum": lambda: y.cumsum(0), "mean": lambda: rows.mean(-1), "var": lambda: rows.var(-1),
        "xlogy": lambda: torch.xlogy(x, x), "matmul": lambda: rows @ rows.T, "randn": lambda: torch.randn(1 << 14),
    })
    return {name: hashlib.sha1(op().contiguous().numpy().tobytes()).hexdigest()[:12] for name, op in ops.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--emulate", nargs="*", default=["Haswell-v4", "EPYC-Rome-v2"], metavar="CPU",
                   help="qemu CPU models to compare with (qemu-x86_64 -cpu help lists them)")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the child's output
    args = p.parse_args()
    here = hashes()
    if args.json:
        print(json.dumps(here))
        return 0
    if not args.emulate:
        print(json.dumps(here, indent=1))
        return 0
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        sys.exit("needs qemu-x86_64 (Debian: apt-get install qemu-user)")
    print(f"{len(here)} operations")
    for cpu in args.emulate:
        out = subprocess.run([qemu, "-cpu", cpu, sys.executable, __file__, "--json"], capture_output=True, text=True,
                             check=True).stdout
        there = json.loads(out.strip().splitlines()[-1])
        moved = [name for name in here if here[name] != there[name]]
        print(f"{cpu}: {', '.join(moved) if moved else 'no operation'} moved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
