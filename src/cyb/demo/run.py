"""The demo's recipe: the same initial weights for every method, training with
:func:`cyb.train.train`, scoring greedy answers (:func:`score_model`) and free-running decoding
(:func:`decoding_cost`), and the whole run (:func:`run_demo`); what it prints and writes is
:mod:`cyb.demo.present`."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable

import torch

from .. import methods
from . import present
from .criterion import verdict
from .settings import DemoSettings, run_config


def write_initial_models(s: DemoSettings, directory: Path) -> dict[str, Path]:
    """Save one randomly initialised model per method, all with the same weights.

    One from-scratch Hugging Face model is drawn (seeded by ``s.seed``) with rows for the
    characters, the ``M-1`` pauses and ``<don't know>``, every row drawn by the model's own
    initialiser (so the pauses start as distinct random vectors).  Each method wraps it with
    its own pause settings (the baseline and TBYS simply never use the rows they do not need)
    and saves it under ``directory/<method>``, so the runs differ only in the method, not in
    their starting point.
    """
    from transformers import AutoModelForCausalLM

    from ..build import hf_config_for
    from ..data.synthetic import CharTokenizer
    from ..model import PauseModel, PauseSettings

    tokenizer = CharTokenizer().to_hf()
    first = len(tokenizer)
    m = s.num_steps
    pause_ids = tuple(range(first, first + m - 1))
    dk_id = first + m - 1
    rows = first + m
    hf_config = hf_config_for(run_config(s, "cyb"), rows, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(s.seed)
        hf_model = AutoModelForCausalLM.from_config(hf_config, attn_implementation="sdpa")
    paths = {}
    for method in s.methods:
        spec = methods.spec(method)
        psi_dk = (s.method_options.get(method) or {}).get("psi_dk", s.psi_dk)
        settings = PauseSettings(
            num_steps=spec.model_steps(m), pause_ids=pause_ids if spec.uses_pauses else (), vocab_size=rows,
            dk_id=dk_id if spec.has_dk else None,
            psi_dk=psi_dk if spec.has_dk else None, position_scheme="shared", method=method)
        paths[method] = PauseModel(hf_model, settings).save_pretrained(directory / method)
    return paths


# ------------------------------------------------------------------------------- scoring


def _answer_aligned(x: torch.Tensor, fill) -> torch.Tensor:
    """``[N, L]`` per-block values moved to the column of the token each block predicts."""
    out = torch.full_like(x, fill)
    out[:, 1:] = x[:, :-1]
    return out


@torch.no_grad()
def score_model(model, dataset, *, batch_size: int = 256) -> dict:
    """Greedy answers of ``model`` (a :class:`~cyb.model.PauseModel`) on ``dataset``.

    ``dataset`` is a :class:`~cyb.data.synthetic.SyntheticDataset`; its scored tokens are the
    answer characters and ``<eos>`` (``loss_mask``).  Returns a dict of Python numbers/lists:

    * ``exact_match``: fraction of examples whose whole answer (and ``<eos>``) is right.
    * ``token_accuracy``: fraction of answer tokens right.
    * ``ppl``: exp of the mean per-answer-token loss, the perplexity of the model's method
      (:meth:`~cyb.methods.MethodSpec.perplexity_loss`: CYB with gamma=1 and its own stopping,
      TBYS cross-entropy at step M, baseline plain cross-entropy).
    * ``mean_steps``: mean ``E[S]`` per answer token (1..M; M for TBYS, 1 for the baseline).
    * ``greedy_steps``: mean steps the greedy decision used per answer token.
    * ``per_position_accuracy``, ``per_position_steps``: by answer position (``<eos>`` last).
    * ``expected_steps``: ``[N, L]`` float tensor of ``E[S]`` aligned with ``dataset.ids``
      (0 where nothing is scored), and ``predictions``: ``[N, L]`` long greedy ids, aligned.
    """
    from ..decision import greedy_decision
    from ..losses import expected_stop_step

    was_training = model.training
    model.eval()
    device = model.device
    dk_id = model.settings.dk_id
    perplexity_loss = methods.of_model(model.settings).perplexity_loss(model.num_steps)
    preds, greedy, expected, nll = [], [], [], []
    for batch in dataset.batches(batch_size, device=device):
        out = model(batch["ids"], batch["attention_mask"], batch["loss_mask"], return_logits=True)
        token, steps = greedy_decision(out.logits, dk_id=dk_id, dk_bias=model.dk_bias)
        if dk_id is not None:
            e_s = expected_stop_step(out.log_d, out.log_not_d)
        else:
            e_s = torch.full(token.shape, float(model.num_steps), device=device)
        loss = perplexity_loss(out.log_t, out.log_d, out.log_not_d)
        preds.append(_answer_aligned(token, -1).cpu())
        greedy.append(_answer_aligned(steps.float(), 0.0).cpu())
        expected.append(_answer_aligned(e_s.float(), 0.0).cpu())
        nll.append(_answer_aligned(loss.float(), 0.0).cpu())
    model.train(was_training)

    pred = torch.cat(preds)
    mask = dataset.loss_mask.bool()
    hit = (pred == dataset.ids) & mask
    position = mask.long().cumsum(1) - 1  # k-th scored token of its row
    width = int(position[mask].max()) + 1
    count = torch.bincount(position[mask], minlength=width).clamp(min=1).double()

    def by_position(values: torch.Tensor) -> list:
        sums = torch.zeros(width, dtype=torch.float64).index_add_(0, position[mask], values[mask].double())
        return (sums / count).tolist()

    e_s = torch.cat(expected)
    return {
        "exact_match": float((hit.sum(1) == mask.sum(1)).double().mean()),
        "token_accuracy": float(hit.sum()) / float(mask.sum()),
        "ppl": math.exp(min(float(torch.cat(nll)[mask].double().mean()), 50.0)),
        "mean_steps": float(e_s[mask].double().mean()),
        "greedy_steps": float(torch.cat(greedy)[mask].double().mean()),
        "per_position_accuracy": by_position(hit.double()),
        "per_position_steps": by_position(e_s),
        "expected_steps": e_s.masked_fill(~mask, 0.0),
        "predictions": pred,
    }


def decoding_cost(model, dataset, *, limit: int = 512, batch_size: int = 128) -> dict:
    """Free-running greedy answers to the first ``limit`` prompts of ``dataset``, in fixed and
    in adaptive mode (:mod:`cyb.generation`).

    Returns ``{mode: {"exact_match", "positions_per_token", "seconds"}}``, where positions per
    token counts the positions of the generated tokens that went through the network: ``M`` in
    fixed mode, the steps actually taken in adaptive mode (``<eos>`` included, the prompt not).
    """
    from ..generation import generate

    prompts = dataset.prompts[:limit]
    answers = dataset.answers[:limit]
    longest = max(len(a) for a in answers) + 1
    out = {}
    for mode in ("fixed", "adaptive"):
        t0 = time.perf_counter()
        results = generate(model, prompts, mode=mode, max_new_tokens=longest, max_batch=batch_size)
        seconds = time.perf_counter() - t0
        tokens = sum(len(r.steps) for r in results)
        used = sum(len(r.steps) * model.num_steps if mode == "fixed" else sum(r.steps) for r in results)
        right = sum(r.text.strip() == a.strip() for r, a in zip(results, answers))
        out[mode] = {"exact_match": right / max(len(results), 1), "positions_per_token": used / max(tokens, 1),
                     "seconds": seconds}
    return out


# ------------------------------------------------------------------------------ pipeline


def _quiet_transformers() -> None:
    """No weight-loading/saving bars from transformers inside the demo's own bars."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - very old transformers
        pass


def clear_runs(s: DemoSettings) -> list[Path]:
    """Remove what an earlier demo in ``s.out_dir`` trained for ``s.methods`` (its runs and their
    shared initial weights), so that the next one starts afresh; returns the folders removed.
    A run that a live process is training is left alone (:class:`~cyb.run_lock.RunLocked`)."""
    import shutil

    from ..run_lock import acquire

    out = Path(s.out_dir)
    runs = [out / "runs" / m for m in s.methods if (out / "runs" / m).is_dir()]
    locks = [acquire(run) for run in runs]  # all or none: raises while another process trains one
    removed = []
    for run, lock in zip(runs, locks):
        shutil.rmtree(run)
        lock.release()
        removed.append(run)
    if (out / "init").is_dir():
        shutil.rmtree(out / "init")
        removed.append(out / "init")
    return removed


def _finished(run_dir: Path, steps: int) -> bool:
    """Whether a demo run already trained to ``steps`` (its checkpoint of that step exists)."""
    from ..checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir) if run_dir.is_dir() else None
    return ckpt is not None and ckpt.step == steps and (run_dir / "final").is_dir()


def _earlier_train_seconds(out: Path) -> dict:
    """Training seconds per run folder from the report of an earlier demo in ``out``."""
    import json

    try:
        earlier = json.loads((out / "metrics.json").read_text())
        return {r["run_dir"]: r["train_seconds"] for r in earlier["methods"].values()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def run_demo(s: DemoSettings, *, fresh: bool = False, echo: Callable[[str], None] = print) -> dict:
    """Train, score and report every method of ``s``; returns the metrics written to
    ``metrics.json`` (``{"methods": {name: {...}}, "total_seconds": ..., ...}``).

    The runs of an earlier demo in ``s.out_dir`` go on: one that finished is scored again (its
    training time is the earlier report's), one that was interrupted resumes from its last
    checkpoint.  ``fresh`` removes them first (:func:`clear_runs`).  Runs of other settings
    (another seed, model or task) are refused with an error that says how to start afresh.
    """
    from ..model import PauseModel, gates
    from ..run_data import task_split
    from ..train import CannotResume, train

    s.validate()
    _quiet_transformers()
    out = Path(s.out_dir)
    if fresh:
        for folder in clear_runs(s):
            echo(f"removed {folder} (--fresh)")
    out.mkdir(parents=True, exist_ok=True)
    earlier = _earlier_train_seconds(out)
    from ..data.synthetic import make_task

    task = make_task(s.task, **s.task_kwargs)
    for line in present.header_lines(s, task.describe()):
        echo(line)
    start = time.perf_counter()
    initial = write_initial_models(s, out / "init")
    results: dict = {}
    details: dict = {}
    configs = {}
    test = None
    for i, method in enumerate(s.methods, 1):
        cfg = run_config(s, method)
        cfg.model.name_or_path = str(initial[method])
        configs[method] = cfg.with_local_paths().to_dict()  # as the run folder has it
        run_dir = configs[method]["train"]["out_dir"]
        reused = _finished(Path(cfg.train.out_dir), cfg.train.steps)
        echo(present.training_line(i, len(s.methods), method, cfg.train.out_dir if reused else None))
        t0 = time.perf_counter()
        try:
            train(cfg)
        except CannotResume as e:
            raise CannotResume(f"{e}. The demo reuses the runs in {out}/runs, which were made with other "
                               f"settings: add --fresh to train them afresh, or give another --out") from None
        train_s = time.perf_counter() - t0
        if reused and run_dir in earlier:
            train_s = earlier[run_dir]
        model = PauseModel.from_pretrained(Path(cfg.train.out_dir) / "final")
        if s.device != "cpu" and torch.cuda.is_available():
            model = model.to("cuda")
        if test is None:
            test = task_split(cfg, split="test")
        with gates.foreign_attention(model.hf_model) as through:
            score = score_model(model, test)
        details[method] = {k: score.pop(k) for k in ("expected_steps", "predictions")}
        results[method] = {**score, "train_seconds": train_s,
                           "num_parameters": model.num_parameters(),
                           "num_steps": model.num_steps, "recipe": cfg.method.recipe,
                           "pause_visibility": model.pause_visibility,
                           "run_dir": configs[method]["train"]["out_dir"]}
        echo(present.score_line(method, score, train_s))
        if through is not None:
            results[method]["pause_gates"] = gates.gate_values(model.hf_model).tolist()
            results[method]["foreign_attention"] = through.per_layer()
        if methods.spec(method).has_dk:
            results[method]["decoding"] = decoding_cost(model, test)
    for method in results:  # the criterion's parts, which need every method's scores
        if methods.spec(method).has_dk:
            results[method]["criterion"] = verdict(results, method)
    metrics = {"task": s.task, "task_kwargs": s.task_kwargs, "task_description": task.describe(),
               "num_test_examples": len(test), "methods": results,
               "total_seconds": time.perf_counter() - start}
    present.write_report(out, s, metrics, configs, test, details)
    for line in present.summary_lines(out, metrics):
        echo(line)
    return metrics
