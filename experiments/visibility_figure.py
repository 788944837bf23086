"""Draw docs/img/visibility_masks.png: the attention masks of shared and private pauses for 4
real tokens with M = 3 (blue: the query may attend to the key)::

    python experiments/visibility_figure.py [OUT.png]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from cyb import visibility
from cyb.report.plots import visibility_masks

TITLES = {"shared": "shared (the paper)", "private": "private"}


def main(out: str = "docs/img/visibility_masks.png", tokens: int = 4, m: int = 3) -> Path:
    steps = visibility.recipe1_steps(torch.ones(1, tokens, dtype=torch.long), m)
    masks = {TITLES[v]: visibility.visible(steps, v)[0].tolist() for v in visibility.VISIBILITIES}
    labels = [f"x{k + 1}" if j == 0 else f"p{j}" for k in range(tokens) for j in range(m)]
    return visibility_masks(out, masks, labels)


if __name__ == "__main__":
    print(main(*sys.argv[1:]))
