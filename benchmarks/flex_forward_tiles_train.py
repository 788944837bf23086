"""``cyb`` with FlexAttention's backward left to the kernel's own tiles, as the library ran it
before it took ``cyb.model.attention.BACKWARD_TILES`` (the 64 x 64 forward tiles stay), to time a
training step against the library's options in one session::

    python benchmarks/flex_forward_tiles_train.py bench train --case 32768:32 --real-tokens 256 \\
        --variants cyb_private cyb_gated --modes compile

Every argument goes to the ``cyb`` command line as is.  docs/record/benchmarks/training.md (``flex-options/``)
has what it measured.
"""

from __future__ import annotations

import sys


def main() -> int:
    import cyb.model.attention as attention
    from cyb.cli import main as cyb_main

    attention.BACKWARD_TILES_MAX_HEAD_DIM = 0  # read at every call of the kernel
    return cyb_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
