"""E[S] and the pause statistics in a Trainer's logs.

The trainer's ``compute_loss`` adds each batch's metric sums (:class:`cyb.objective.LossOutput`)
to a :class:`PauseMetrics` window; :class:`PauseMetricsCallback` turns the window into per-token
metrics whenever the Trainer logs, summed over processes exactly as ``cyb train`` does
(:func:`cyb.distributed.reduce_sums`), and writes them into the logged row before any reporting
callback (TensorBoard, Weights & Biases, …) reads it.
"""

from __future__ import annotations

import torch

from ...distributed import DistInfo, reduce_sums
from ...objective import merge_sums, summarise

try:  # the callback base class (plain object without transformers' trainer machinery)
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover - transformers is a dependency
    TrainerCallback = object


def dist_info() -> DistInfo:
    """This process's place in the process group torchrun / accelerate started (one process when none)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return DistInfo()
    return DistInfo(dist.get_rank(), dist.get_world_size(), 0, "ddp")


class PauseMetrics:
    """Metric sums since the last log, for ``train`` and ``eval`` apart.

    Args:
        num_steps: ``M`` of the laid-out rows (the length of ``stop_dist``).
        has_dk: the method has a ``<don't know>`` output (then ``E[S]`` and ``Pr(S=i)`` are kept).
    """

    def __init__(self, num_steps: int, has_dk: bool):
        self.num_steps, self.has_dk = num_steps, has_dk
        self.windows: dict[str, dict] = {"train": {}, "eval": {}}

    def add(self, split: str, sums: dict) -> None:
        """Add one micro-batch's sums (detached tensors or numbers) to ``split``'s window."""
        merge_sums(self.windows[split], {k: v for k, v in sums.items() if k != "real"})

    def _zero(self) -> dict:
        zero = {"objective": 0.0, "nll": 0.0, "targets": 0}
        if self.has_dk:
            zero.update(stop_step=0.0, stop_step_sq=0.0, stop_dist=[0.0] * self.num_steps)
        return zero

    def pop(self, split: str, device) -> dict:
        """Per-token metrics of ``split``'s window over every process, and an empty window.

        A collective under several processes: every process must call it (each Trainer log does).
        Returns ``{}`` when no process saw a target token.  Keys: ``objective`` (mean training
        loss), ``nll`` and ``ppl`` (the perplexity the method reports), ``targets`` and, with dk,
        ``mean_steps`` (E[S]), ``steps_std`` and ``stop_dist_1 .. stop_dist_M`` (mean Pr(S=i)).
        """
        window = merge_sums(self._zero(), self.windows[split])
        self.windows[split] = {}
        total = reduce_sums(window, dist_info(), device)
        if not total.get("targets"):
            return {}
        m = summarise(total)
        out = {"objective": m["objective"], "nll": m["loss"], "ppl": m["ppl"], "targets": m["targets"]}
        if "mean_steps" in m:
            out["mean_steps"] = m["mean_steps"]
            out["steps_std"] = m.get("steps_std", 0.0)
            out.update({f"stop_dist_{i + 1}": p for i, p in enumerate(m["stop_dist"])})
        return out


class PauseMetricsCallback(TrainerCallback):
    """Adds the pause metrics of a :class:`PauseMetrics` window to every row the Trainer logs.

    A training row (it has ``loss``) gets ``objective``, ``nll``, ``ppl``, ``targets`` and, with
    dk, ``mean_steps`` (E[S]), ``steps_std`` and ``stop_dist_i``, averaged over the target tokens of
    the steps since the last row.  An evaluation row (``eval_*`` keys) gets the same with the
    ``eval_`` prefix, and its ``eval_loss`` becomes the exact mean of the objective over the
    evaluation's target tokens (the Trainer's own average weighs batches by rows).  The row the
    Trainer keeps in ``state.log_history`` gets the same keys.  It must run
    before the reporting callbacks: :class:`~cyb.integrations.transformers.PauseTrainerMixin`
    puts it first.
    """

    def __init__(self, metrics: PauseMetrics, device=None):
        self.metrics = metrics
        self.device = device

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None:
            return
        device = self.device if self.device is not None else getattr(args, "device", "cpu")
        added = {}
        if any(k.startswith("eval_") for k in logs):
            m = self.metrics.pop("eval", device)
            if m:
                added = {f"eval_{k}": v for k, v in m.items()}
                added["eval_loss"] = m["objective"]
        elif "loss" in logs:
            added = self.metrics.pop("train", device)
        logs.update(added)
        history = getattr(state, "log_history", None)
        if added and history and all(history[-1].get(k) == v for k, v in logs.items() if k not in added):
            history[-1].update(added)  # the row the Trainer just kept (trainer_state.json) gets them too


__all__ = ["PauseMetrics", "PauseMetricsCallback", "dist_info"]
