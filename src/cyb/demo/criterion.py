"""The demo's criterion at one seed, part by part, and what adaptive decoding kept: the verdicts
that ``metrics.json`` stores per method with dk and that the demo prints in words.

A method with ``<don't know>`` meets the criterion when it

1. beats the no-pause baseline in exact match (by more than :data:`MARGIN`),
2. comes within :data:`MARGIN` of TBYS's exact match, or above it, and
3. spends more steps on the hard answer positions than on the easy ones (by at least
   :data:`MORE_STEPS`; :func:`hard_easy_steps`).

Beyond the criterion, adaptive decoding keeps fixed mode's answers when it answers within
:data:`KEEPS` of fixed mode's exact match.  The search over seeds and settings
(``experiments/demo_sweep.py``) asks the same of 4 seeds in 5.
"""

from __future__ import annotations

#: exact match (a fraction) within which two methods count as level
MARGIN = 0.005
#: E[S] by which the hard answer positions must exceed the easy ones
MORE_STEPS = 0.1
#: exact match that adaptive mode may lose and still "keep" fixed mode's answers (a fraction)
KEEPS = 0.02
#: fixed mode's exact match below which a comparison of the two modes says little
FEW = 0.1


def hard_easy_steps(results: dict, method: str) -> tuple[float, float] | None:
    """``method``'s mean E[S] over the hard and over the easy answer positions of one run.

    ``results`` maps method names to their :func:`~cyb.demo.run.score_model` results (``metrics["methods"]``).
    Difficulty is the per-position token accuracy averaged over every method of the run: hard
    positions are below the mean of those accuracies, easy ones at or above it.  ``<eos>`` (the
    last position) counts only when the answer is a single character.  None when the positions
    do not differ in accuracy by at least 2 points (no hard position)."""
    acc = [r["per_position_accuracy"] for r in results.values()]
    n = len(acc[0])
    positions = list(range(n - 1)) if n > 2 else list(range(n))
    mean_acc = {k: sum(a[k] for a in acc) / len(acc) for k in positions}
    if max(mean_acc.values()) - min(mean_acc.values()) < 0.02:
        return None
    level = sum(mean_acc.values()) / len(mean_acc)
    steps = results[method]["per_position_steps"]
    hard = [steps[k] for k in positions if mean_acc[k] < level]
    easy = [steps[k] for k in positions if mean_acc[k] >= level]
    return sum(hard) / len(hard), sum(easy) / len(easy)


def verdict(results: dict, method: str) -> dict:
    """The criterion's parts for ``method`` (a method with dk) in one run, JSON-ready::

        {"meets_criterion": bool | None,
         "beats_baseline": {"holds": bool | None, "exact_match": 0.948, "baseline": 0.005},
         "level_with_tbys": {"holds": ..., "exact_match": 0.948, "tbys": 0.994},
         "more_steps_when_hard": {"holds": ..., "hard": 2.64, "easy": 1.82},
         "adaptive_keeps_answers": {"holds": ..., "fixed": 0.939, "adaptive": 0.943,
                                    "fewer_positions": 2.01}}

    ``holds`` is None where the run cannot say: no baseline or no TBYS in it, fixed mode
    answering under :data:`FEW` (the decoding part; absent without decoding results).  With no
    hard position (:func:`hard_easy_steps` None) ``more_steps_when_hard`` does not hold, its
    steps None.  ``meets_criterion`` is None when a part of the criterion cannot be said, else
    whether all three hold."""
    exact = results[method]["exact_match"]
    out: dict = {}
    for part, other, holds in (("beats_baseline", "baseline", lambda o: exact > o + MARGIN),
                               ("level_with_tbys", "tbys", lambda o: exact >= o - MARGIN)):
        theirs = results[other]["exact_match"] if other in results else None
        out[part] = {"holds": None if theirs is None else holds(theirs), "exact_match": exact, other: theirs}
    he = hard_easy_steps(results, method) if len(results) > 1 else None
    out["more_steps_when_hard"] = {"holds": he is not None and he[0] - he[1] >= MORE_STEPS,
                                   "hard": None if he is None else he[0], "easy": None if he is None else he[1]}
    parts = [out[p]["holds"] for p in ("beats_baseline", "level_with_tbys", "more_steps_when_hard")]
    dec = results[method].get("decoding") or {}
    if "fixed" in dec and "adaptive" in dec:
        f, a = dec["fixed"], dec["adaptive"]
        out["adaptive_keeps_answers"] = {
            "holds": None if f["exact_match"] < FEW else a["exact_match"] >= f["exact_match"] - KEEPS,
            "fixed": f["exact_match"], "adaptive": a["exact_match"],
            "fewer_positions": f["positions_per_token"] / max(a["positions_per_token"], 1e-9)}
    return {"meets_criterion": None if None in parts else all(parts), **out}


def meets_criterion(results: dict, method: str) -> bool:
    """Whether ``method`` meets all three parts of the criterion in one run (:func:`verdict`;
    False where the run has no baseline or no TBYS)."""
    return verdict(results, method)["meets_criterion"] is True


__all__ = ["FEW", "KEEPS", "MARGIN", "MORE_STEPS", "hard_easy_steps", "meets_criterion", "verdict"]
