"""Exact match of a model on a synthetic task's held-out examples (``cyb eval`` of a task run).

Teacher-forced greedy readout over the answer tokens (the greedy sequential decision with
``<don't know>``, :func:`cyb.demo.score_model`): an example counts when every answer token and
the end-of-sequence token are right, which is exactly when greedy generation from its prompt
writes the answer.  Works for character rows and for tasks written as text for a pretrained
tokenizer (:mod:`cyb.data.synthetic.text_task`).

With ``generate`` it also generates the answers to the first held-out prompts, free-running,
in fixed mode (every token read out at step M) and in adaptive mode (at the first step that
does not say ``<don't know>``), with the positions per generated token each used
(:func:`cyb.demo.decoding_cost`).  Under shared pauses adaptive generation shows later tokens
contexts that Recipe-1 training never did, so the two can differ; under private pauses adaptive
generation answers exactly the examples the teacher-forced readout gets right.
"""

from __future__ import annotations

import copy

#: Logits of one scoring batch at most (float32 elements): large vocabularies get small batches.
LOGIT_BUDGET = 64 * 2**20


def score_task(model, config, tokenizer, *, max_rows: int | None = None, generate: int = 0) -> dict:
    """``{"exact_match", "token_accuracy", "ppl", "mean_steps", "per_position_accuracy",
    "per_position_steps", "greedy_steps", "num_examples", "answer_tokens_scored"}`` of ``model``
    on the held-out examples of ``config``'s task (the first ``max_rows``): ``ppl`` the answers'
    perplexity under the model's method, ``mean_steps`` E[S] per answer token, per position the
    answer tokens in order and the end-of-sequence token last.  With ``generate > 0`` and a model that can generate
    with pauses (M > 1, shared or private pauses) also ``"generation": {"fixed": ...,
    "adaptive": ...}``, each ``{"exact_match", "positions_per_token", "seconds", "prompts"}``
    over the first ``generate`` prompts."""
    from ..run_data import task_split
    from ..demo import decoding_cost, score_model

    cfg = copy.deepcopy(config)
    if max_rows is not None:  # the first rows of a longer draw are the rows of a shorter one
        cfg.data.num_valid_examples = max(1, min(cfg.data.num_valid_examples, int(max_rows)))
    valid = task_split(cfg, tokenizer, "test")
    per_row = valid.seq_len * model.num_steps * int(model.settings.vocab_size)
    batch = max(1, min(256, LOGIT_BUDGET // max(per_row, 1)))
    out = score_model(model, valid, batch_size=batch)
    scores = {"exact_match": out["exact_match"], "token_accuracy": out["token_accuracy"],
              "ppl": out["ppl"], "mean_steps": out["mean_steps"],
              "per_position_accuracy": out["per_position_accuracy"],
              "per_position_steps": out["per_position_steps"], "greedy_steps": out["greedy_steps"],
              "num_examples": valid.num_examples, "answer_tokens_scored": int(valid.loss_mask.sum())}
    if generate > 0 and model.num_steps > 1:
        prompts = min(int(generate), len(valid.prompts))
        scores["generation"] = {mode: {**v, "prompts": prompts} for mode, v in
                                decoding_cost(model, valid, limit=prompts, batch_size=min(batch, 128)).items()}
    return scores


def format_task(scores: dict) -> str:
    """One summary line, and one per generation mode."""
    lines = [f"task: exact match {scores['exact_match']:.1%} on {scores['num_examples']} held-out examples "
             f"(answer-token accuracy {scores['token_accuracy']:.1%}, greedy readout, "
             f"{scores['greedy_steps']:.2f} steps per answer token)"]
    for mode, g in scores.get("generation", {}).items():
        lines.append(f"  generating the first {g['prompts']} answers in {mode} mode: exact match "
                     f"{g['exact_match']:.1%}, {g['positions_per_token']:.2f} positions per token")
    return "\n".join(lines)


__all__ = ["format_task", "score_task"]
