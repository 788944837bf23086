"""Metrics to JSON lines (optionally TensorBoard and Weights & Biases) and progress display."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from .files import write_text_atomic


def git_commit() -> str | None:
    """The commit of the cyb source tree, if it is a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _parse(line: str) -> dict | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row if isinstance(row, dict) else None


class MetricsLogger:
    """Appends ``{"split": ..., "time": ..., **metrics}`` lines to ``run_dir/metrics.jsonl``.

    Each line is written with one ``write`` call and flushed, so a killed process leaves at
    most one partial last line, which :meth:`truncate_after` removes on resume.  Every row also
    goes to TensorBoard (``tensorboard``) and to a :class:`cyb.wandb_log.WandbRun` (``wandb``),
    which :meth:`close` finishes.
    """

    def __init__(self, run_dir: str | Path, *, enabled: bool = True, tensorboard: bool = False, wandb=None):
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self.wandb = wandb if enabled else None
        self._tb = None
        if enabled and tensorboard:
            from .extras import require

            require("tensorboard", "train.tensorboard = true")
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def log(self, split: str, metrics: dict) -> None:
        """Append one row (``split`` is ``"train"`` or ``"valid"``; metrics hold ``step``)."""
        if not self.enabled:
            return
        row = {"split": split, "time": time.time(), **metrics}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            step = metrics.get("step", 0)
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                    self._tb.add_scalar(f"{split}/{k}", v, step)
        if self.wandb is not None:
            self.wandb.log(split, metrics)

    def truncate_after(self, step: int) -> None:
        """Drop rows logged after ``step`` and any partial line (a resumed run writes them
        again).  The file is replaced atomically."""
        if not self.enabled or not self.path.is_file():
            return
        keep = []
        for line in self.path.read_text().splitlines():
            row = _parse(line) if line.strip() else None
            if row is not None and row.get("step", 0) <= step:
                keep.append(line)
        write_text_atomic(self.path, "".join(line + "\n" for line in keep))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self.wandb is not None:
            self.wandb.close()


def read_metrics(run_dir: str | Path, split: str | None = None) -> list[dict]:
    """Rows of ``metrics.jsonl`` (optionally of one split); unreadable lines are skipped."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [_parse(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r is not None and (split is None or r.get("split") == split)]


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def format_metrics(metrics: dict) -> str:
    """``loss 3.210 | ppl 24.8 | E[S] 2.31 | epoch 0.42 | 12,345 tok/s`` from a metrics row."""
    parts = []
    if "loss" in metrics:
        parts.append(f"loss {metrics['loss']:.4f}")
    if "objective" in metrics and abs(metrics["objective"] - metrics.get("loss", 0.0)) > 1e-9:
        parts.append(f"objective {metrics['objective']:.4f}")
    if "ppl" in metrics:
        parts.append(f"ppl {metrics['ppl']:.2f}")
    if "mean_steps" in metrics:
        parts.append(f"E[S] {metrics['mean_steps']:.2f}")
    if metrics.get("epoch") is not None:
        parts.append(f"epoch {metrics['epoch']:.2f}")
    if metrics.get("tokens_per_s"):
        parts.append(f"{metrics['tokens_per_s']:,.0f} tok/s")
    return " | ".join(parts)


class Progress:
    """Training progress: a tqdm bar on a terminal, else one plain line per logged step.

    Both show the step, loss, ``E[S]`` (methods with dk), real tokens per second and the
    estimated time left.  ``enabled=False`` shows nothing (processes other than the first);
    ``bar=False`` shows neither bar nor step lines, but still the lines given to :meth:`write`
    (the run's header, held-out results, notes).
    """

    def __init__(self, total: int, initial: int, desc: str, *, enabled: bool = True, bar: bool = True,
                 stream=None):
        self.total, self.step, self.desc = total, initial, desc
        self.enabled = enabled
        self.steps_shown = enabled and bar
        self.stream = stream if stream is not None else sys.stderr
        self._start, self._start_step = time.perf_counter(), initial
        self._bar = None
        if self.steps_shown and getattr(self.stream, "isatty", lambda: False)():
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit="step",
                             dynamic_ncols=True, file=self.stream)

    def _eta(self) -> str:
        done = self.step - self._start_step
        if done <= 0:
            return "?"
        rate = (time.perf_counter() - self._start) / done
        return _duration(rate * (self.total - self.step))

    def update(self, step: int, metrics: dict | None = None) -> None:
        """Advance to ``step``; ``metrics`` (a logged row) refreshes the figures shown."""
        if not self.steps_shown:
            return
        if self._bar is not None:
            self._bar.update(step - self.step)
            self.step = step
            if metrics:
                self._bar.set_postfix_str(format_metrics(metrics), refresh=True)
            return
        self.step = step
        if metrics:
            print(f"{self.desc} step {step}/{self.total} | {format_metrics(metrics)} | eta {self._eta()}",
                  file=self.stream, flush=True)

    def write(self, text: str) -> None:
        """Print a line without breaking the bar."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
