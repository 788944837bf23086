"""The experiments behind docs/record/ (results/ and demo.md): scripts, run from the
repository root as ``python experiments/NAME.py ...`` (or ``bash experiments/NAME.sh``), and
importable as ``experiments.NAME`` (the tests do).  What they made is in ``results/experiments/``.
"""
