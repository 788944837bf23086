"""The experiments behind docs/results.md, docs/recipes.md and docs/demo.md: scripts, run from the
repository root as ``python experiments/NAME.py ...`` (or ``bash experiments/NAME.sh``), and
importable as ``experiments.NAME`` (the tests do).  What they made is in ``results/experiments/``.
"""
