"""Exact match of a model on a synthetic task's held-out examples (``cyb eval`` of a task run).

Teacher-forced greedy readout over the answer tokens (the greedy sequential decision with
``<don't know>``, :func:`cyb.demo.score_model`): an example counts when every answer token and
the end-of-sequence token are right, which is exactly when greedy generation from its prompt
writes the answer.  Works for character rows and for tasks written as text for a pretrained
tokenizer (:mod:`cyb.data.synthetic.text_task`).
"""

from __future__ import annotations

import copy

#: Logits of one scoring batch at most (float32 elements): large vocabularies get small batches.
LOGIT_BUDGET = 64 * 2**20


def score_task(model, config, tokenizer, *, max_rows: int | None = None) -> dict:
    """``{"exact_match", "token_accuracy", "per_position_accuracy", "greedy_steps", "num_examples"}``
    of ``model`` on the held-out examples of ``config``'s task (the first ``max_rows``)."""
    from ..run_data import synthetic_sets
    from ..demo import score_model

    cfg = copy.deepcopy(config)
    if max_rows is not None:  # the first rows of a longer draw are the rows of a shorter one
        cfg.data.num_valid_examples = max(1, min(cfg.data.num_valid_examples, int(max_rows)))
    _, valid = synthetic_sets(cfg, tokenizer)
    per_row = valid.seq_len * model.num_steps * int(model.settings.vocab_size)
    batch = max(1, min(256, LOGIT_BUDGET // max(per_row, 1)))
    out = score_model(model, valid, batch_size=batch)
    return {"exact_match": out["exact_match"], "token_accuracy": out["token_accuracy"],
            "per_position_accuracy": out["per_position_accuracy"], "greedy_steps": out["greedy_steps"],
            "num_examples": valid.num_examples, "answer_tokens_scored": int(valid.loss_mask.sum())}


def format_task(scores: dict) -> str:
    """One summary line."""
    return (f"task: exact match {scores['exact_match']:.1%} on {scores['num_examples']} held-out examples "
            f"(answer-token accuracy {scores['token_accuracy']:.1%}, greedy readout, "
            f"{scores['greedy_steps']:.2f} steps per answer token)")


__all__ = ["format_task", "score_task"]
