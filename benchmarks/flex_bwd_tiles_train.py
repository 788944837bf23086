"""``cyb`` with FlexAttention's backward tiles set to 32 / 64 / 64 / 32 (``bwd_BLOCK_M1 / N1 / M2 /
N2``, 4 warps, 3 stages) on top of the library's 64 x 64 forward tiles
(``cyb.model.attention.KERNEL_OPTIONS``), to time a training step with them before the library
takes them::

    python benchmarks/flex_bwd_tiles_train.py bench train --case 32768:4 --real-tokens 2048 \\
        --variants cyb_private --modes compile

Every argument goes to the ``cyb`` command line as is.  docs/benchmarks.md (``flex-options/``)
has what it measured.
"""

from __future__ import annotations

import sys

BACKWARD_TILES = {"bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 32,
                  "bwd_num_warps": 4, "bwd_num_stages": 3}


def main() -> int:
    import cyb.model.attention as attention
    from cyb.cli import main as cyb_main

    attention.KERNEL_OPTIONS.update(BACKWARD_TILES)  # read at every call of the kernel
    return cyb_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
