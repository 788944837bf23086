"""``cyb bench decode`` with the graph decoder attending over its whole cache at every batch size
(no attention limits); with ``UNALIGNED=1`` also without rounding the cache to 128 slots.  The
comparison rows of docs/benchmarks.md ("Attention limits"):

    PYTHONPATH=src python experiments/bench_decode_without_limits.py bench decode --batches 32 128 512 \\
        --impls cyb_graph cyb_graph_pos --new-tokens 128 --out whole.json
    UNALIGNED=1 PYTHONPATH=src python experiments/bench_decode_without_limits.py bench decode ...
"""

import importlib.util
import os
import sys
from pathlib import Path

if importlib.util.find_spec("cyb") is None:  # a source checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cyb.cli import main  # noqa: E402
from cyb.generation import static  # noqa: E402

static.ATTENTION_BUCKET_MIN_ROWS = 10**9
if os.environ.get("UNALIGNED"):
    static.CAPACITY_MULTIPLE = 1

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
