"""Speed and memory measurements beside ``cyb bench``: scripts, run from the repository root as
``python benchmarks/NAME.py ...`` (or ``bash benchmarks/NAME.sh``), and importable as
``benchmarks.NAME`` (the tests do).  What they made is in ``results/benchmarks/``.
"""
