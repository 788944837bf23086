"""Metrics to JSON lines (and optionally TensorBoard)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path


def git_commit() -> str | None:
    """The commit of the cyb source tree, if it is a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


class MetricsLogger:
    """Appends ``{"split": ..., "time": ..., **metrics}`` lines to ``run_dir/metrics.jsonl``."""

    def __init__(self, run_dir: str | Path, *, enabled: bool = True, tensorboard: bool = False):
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self._tb = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise RuntimeError("train.tensorboard=true needs the tensorboard package "
                                   "(pip install 'cyb[tensorboard]')") from e
            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def log(self, split: str, metrics: dict) -> None:
        if not self.enabled:
            return
        row = {"split": split, "time": time.time(), **metrics}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            step = metrics.get("step", 0)
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and v is not None and k != "step":
                    self._tb.add_scalar(f"{split}/{k}", v, step)

    def truncate_after(self, step: int) -> None:
        """Drop rows logged after ``step`` (a resumed run writes them again)."""
        if not self.enabled or not self.path.is_file():
            return
        keep = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in keep))
        tmp.replace(self.path)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: str | Path, split: str | None = None) -> list[dict]:
    """Rows of ``metrics.jsonl`` (optionally of one split)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if split is None or r.get("split") == split]
