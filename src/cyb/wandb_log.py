"""A training run's metrics, configuration and model card in Weights & Biases (``train.wandb``).

:class:`WandbRun` is one W&B run per ``cyb train`` run folder: the run's id is kept in
``out_dir/wandb_run.json``, so a resumed ``cyb train`` continues the same W&B run.  Every metrics
row of ``metrics.jsonl`` is logged as ``train/<key>`` or ``valid/<key>`` against ``step`` (the
optimiser step, cyb's own x-axis: rows that a resumed run writes again after its checkpoint are
logged again, never dropped); vectors (``stop_dist``) become one scalar per entry
(``valid/stop_dist/1`` …).  At the end the final model card (``final/README.md``) is copied into
the run's files and the final held-out metrics into its summary.

With ``WANDB_MODE=offline`` nothing leaves the machine: the run is written under
``out_dir/wandb/offline-run-*`` and ``wandb sync`` uploads it later.
"""

from __future__ import annotations

import json
import secrets
import shutil
from pathlib import Path

from .extras import require
from .files import write_text_atomic

#: Where a run folder keeps the id of its W&B run.
RUN_FILE = "wandb_run.json"


def _scalars(split: str, metrics: dict) -> dict:
    """``{"<split>/<key>": number}`` of a metrics row; lists become ``<split>/<key>/<i>`` (1-based)."""
    out = {}
    for key, value in metrics.items():
        if key == "step" or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            out[f"{split}/{key}"] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
            out.update({f"{split}/{key}/{i + 1}": v for i, v in enumerate(value)})
    return out


class WandbRun:
    """The W&B run of a ``cyb train`` run folder.

    Args:
        run_dir: the run folder (``train.out_dir``): the run's id is kept there and the W&B files
            go to ``run_dir/wandb``.
        config: the run's configuration (``RunConfig.to_dict()``), logged as the W&B config.
        project: the W&B project (``train.wandb_project``).
        name: the W&B run's name (``train.wandb_name``; None = the run folder's name).

    Raises :class:`cyb.extras.MissingPackage` (one line with the install command) without wandb,
    and ValueError (one line) when W&B cannot start the run (not logged in, no network).
    """

    def __init__(self, run_dir, config: dict, *, project: str = "cyb", name: str | None = None):
        wandb = require("wandb", "train.wandb = true")
        self.run_dir = Path(run_dir)
        id_file = self.run_dir / RUN_FILE
        run_id = None
        if id_file.is_file():
            try:
                run_id = json.loads(id_file.read_text()).get("id")
            except (OSError, ValueError):
                run_id = None
        if not run_id:
            run_id = secrets.token_hex(4)
        (self.run_dir / "wandb").mkdir(parents=True, exist_ok=True)
        try:
            self.run = wandb.init(project=project, name=name or self.run_dir.resolve().name, id=run_id,
                                  resume="allow", dir=str(self.run_dir), config=config, job_type="cyb-train")
        except Exception as e:  # not logged in, no network, ...: one line, as every cyb error
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise ValueError(f"train.wandb: Weights & Biases could not start a run ({reason}); log in with "
                             "`wandb login` (or set WANDB_API_KEY), or set WANDB_MODE=offline to keep the run in "
                             f"{self.run_dir / 'wandb'}") from None
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        write_text_atomic(id_file, json.dumps({"id": run_id, "project": project,
                                               "name": self.run.name}, indent=2) + "\n")

    def log(self, split: str, metrics: dict) -> None:
        """Log one metrics row (``split`` is ``train`` or ``valid``; ``metrics`` holds ``step``)."""
        row = _scalars(split, metrics)
        if row:
            self.run.log({"step": int(metrics.get("step", 0)), **row})

    def finish_run(self, final_dir, final_metrics: dict) -> None:
        """Record the end of training: the model card of ``final_dir`` among the run's files and
        the final held-out metrics in the run's summary."""
        card = Path(final_dir) / "README.md"
        if card.is_file():
            shutil.copyfile(card, Path(self.run.dir) / "model_card.md")
        self.run.summary.update(_scalars("final", final_metrics))

    def close(self) -> None:
        """Finish the W&B run (flushes it; idempotent)."""
        if self.run is not None:
            self.run.finish()
            self.run = None


__all__ = ["RUN_FILE", "WandbRun"]
