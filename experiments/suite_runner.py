"""Running a suite's jobs (:mod:`experiments.run_suite`): each job's ``cyb train`` (then its
scoring) as a process of its own on a slot of a GPU or the CPU, long ones first, each after the
job it fine-tunes; one row per finished or failed job in ``OUT/summary.jsonl`` (a rerun skips
what finished), the rerun command beside each row, and the results packed without weights.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml


@dataclass
class Job:
    name: str
    suite: str
    label: str
    seed: int
    cfg: dict
    needs: str | None = None  # the job whose final model this one starts from
    analyse: bool = False  # also run `cyb eval` (latency, calibration, pause statistics)
    cost: float = 1.0  # run time relative to a one-epoch baseline; long jobs start first
    first: bool = False  # start before every other job (others wait for it)
    priority: int = 0  # higher starts first (before cost decides)
    task: bool = False  # scored by exact match on its task (no held-out text to read)
    reasoning: bool = False  # a reasoning-gym task: cyb eval scores its generated answers
    row: dict = field(default_factory=dict)
    whole_file: bool = True  # text: also score the whole held-out file (cyb eval --data)
    decode: bool = False  # text: also count the positions a token costs through the engine (decode.json)
    command: str | None = None  # the rerun command, where run_suite.py's (rerun_command) is not it


def rerun_command(suite: str, name: str, seed, scale: str = "gpu", out: str | None = None,
                  task: str | None = None) -> str:
    """The command that reruns one row from a fresh clone (given techdocs in ``$CYB_DATA`` or
    ``../shared/data/techdocs``): this script with ``--only`` the row, which writes the data
    splits first and trains the row's base first when it fine-tunes one (``--tasks`` the
    reasoning-gym task of a ``reasoning`` row)."""
    scale_arg = "" if scale == "gpu" else f" --scale {scale}"
    task_arg = f" --tasks {task}" if task and suite == "reasoning" else ""
    return (f"python experiments/run_suite.py {suite} --seeds {seed} --only {name} "
            f"--out {out or f'outputs/{suite}'}{scale_arg}{task_arg}")


def finished(row: dict) -> bool:
    """Whether a row of ``summary.jsonl`` is a finished run: trained, and whatever follows the
    training (scoring, evaluations) ran to its end.  A row whose training finished but whose
    follow-up was cut (a deadline's kill) holds ``trained`` instead of ``final``; rows written
    before that distinction say so by their ``returncode``."""
    return "final" in row and row.get("returncode", 0) == 0


def trained(out: Path, name: str) -> bool:
    """Whether the run ``out/name`` finished its training here (final model and metrics)."""
    return (out / name / "final_metrics.json").is_file() and (out / name / "final" / "model.safetensors").is_file()


def final_row(job: Job, out: Path, scale: str = "gpu") -> dict:
    run = out / job.name
    row = {"name": job.name, "suite": job.suite, "label": job.label, "seed": job.seed, "method": job.cfg["method"],
           "command": job.command or rerun_command(job.suite, job.name, job.seed, scale, str(out), job.row.get("task")),
           "config": f"{out / job.suite / 'configs' / job.name}.yaml"}
    if (run / "final_metrics.json").is_file():
        row["final"] = json.loads((run / "final_metrics.json").read_text())
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
        tps = sorted(r["tokens_per_s"] for r in lines if r.get("split") == "train" and r.get("tokens_per_s"))
        row["tokens_per_s"] = tps[len(tps) // 2] if tps else None
        last = [r for r in lines if r.get("split") == "train"][-1:]
        row["train_ppl"] = last[0].get("ppl") if last else None  # the last logging window's
        row["curve"] = [{k: r.get(k) for k in ("step", "epoch", "ppl", "mean_steps", "targets")}
                        for r in lines if r.get("split") == "valid"]
        if (run / "task.json").is_file():
            row["task"] = json.loads((run / "task.json").read_text())
        judged = run / "eval" / "metrics.json"
        if job.reasoning and judged.is_file():  # the verifier's scores of the generated answers
            metrics = json.loads(judged.read_text())
            row["reasoning_gym"] = metrics.get("reasoning_gym")
            row["task"] = metrics.get("task")
        whole = run / "eval-whole-file" / "metrics.json"
        if whole.is_file():
            w = json.loads(whole.read_text())["perplexity"]
            row["whole_file"] = {"ppl": w["ppl"], "tokens": w["tokens"]}
        decode = run / "decode.json"
        if job.decode and decode.is_file():
            row["decode"] = json.loads(decode.read_text())
        state = run / "final" / "training_state.json"
        if state.is_file():
            row["training_state"] = json.loads(state.read_text())
    return row


def launch(job: Job, out: Path, device: str, log_dir: Path, whole_valid: str) -> subprocess.Popen:
    cfg_dir = out / job.suite / "configs"
    cfg_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = cfg_dir / f"{job.name}.yaml"
    cfg_path.write_text(yaml.safe_dump(job.cfg, sort_keys=False))
    threads = "1" if device == "cpu" else "4"  # CPU jobs: one core each
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=threads, RAYON_NUM_THREADS=threads)
    if device != "cpu":
        env["CUDA_VISIBLE_DEVICES"] = device
    # a run trained here whose scoring was cut is only scored again
    script = "true" if trained(out, job.name) else f"{sys.executable} -m cyb train {cfg_path}"
    if job.task:  # exact match, teacher-forced and free-running
        script += f" && {sys.executable} experiments/task_decoding.py {out / job.name}"
    elif job.reasoning:  # answers generated adaptively, scored by the task's verifier, timed
        script += f" && {sys.executable} -m cyb eval {out / job.name} --no-progress --passages 0"
    else:
        if job.analyse:  # figures and analyses on the run's own held-out rows
            script += f" && {sys.executable} -m cyb eval {out / job.name} --no-progress"
        if job.whole_file:  # and the whole held-out file, Jargon File included
            script += (f" && {sys.executable} -m cyb eval {out / job.name} --data {whole_valid} --tokens 0 "
                       f"--passages 0 --out {out / job.name / 'eval-whole-file'} --no-progress")
        if job.decode:  # the positions a token costs, greedy through the engine, after held-out rows
            script += f" && {sys.executable} {Path(__file__).resolve().parent / 'text_decoding.py'} {out / job.name}"
    log = open(log_dir / f"{job.name}.log", "w")
    return subprocess.Popen(["bash", "-c", script], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


#: A file larger than this is not packed (a pack must come back from a GPU call whole).
PACK_FILE_LIMIT = 8 * 2**20


def _partial(p: Path, out: Path) -> bool:
    """Whether ``p`` lies in a folder or file a killed process left half written
    (``final.tmp-PID``, ``.model.tmp-PID``, ``ckpt-N.tmp-X``: renamed into place only when complete)."""
    return any(".tmp-" in part or part.startswith(".tmp") for part in p.relative_to(out).parts)


def pack(out: Path, target: Path) -> None:
    """Everything under ``out`` but weights, optimiser states, the data copies and the tokenizer
    each saved model carries (3.5 MB for SmolLM2's: a suite's pack would outgrow what a GPU call
    returns), the half-written saves of killed runs, and any other file over
    :data:`PACK_FILE_LIMIT` (named on stderr)."""
    tmp = target.with_name(target.name + ".tmp")
    skip = (".safetensors", ".pt", ".jsonl.gz", "tokenizer.json", "tokenizer.model")
    with tarfile.open(tmp, "w:gz") as tar:
        for p in sorted(out.rglob("*")):
            if not p.is_file() or p.name.endswith(skip) or "/ckpt-" in str(p) or _partial(p, out):
                continue
            if p.stat().st_size > PACK_FILE_LIMIT:
                print(f"pack: left out {p} ({p.stat().st_size / 2**20:.0f} MiB)", file=sys.stderr)
                continue
            tar.add(p, arcname=str(Path(out.name) / p.relative_to(out)))
    tmp.replace(target)


#: How often a job that ran out of GPU memory beside others is queued again.
OOM_RETRIES = 3

#: Seconds a job that ran out of GPU memory beside another driver's jobs waits before it tries again.
OOM_WAIT_S = 60.0

#: What a job's log says when its GPU had too little memory: CUDA's own errors, or ``cyb train``
#: refusing to start (its memory check, beside other runs on the same GPU).
OUT_OF_MEMORY = ("CUDA out of memory", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED", "GiB free; not starting")


def _tail(log: Path, size: int = 20_000) -> str:
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def out_of_memory(log: Path) -> bool:
    """Whether the job's log ends on the GPU running out of memory."""
    tail = _tail(log)
    return any(marker in tail for marker in OUT_OF_MEMORY)


def crowded(log: Path) -> bool:
    """Whether the job's log says other processes held its GPU's memory (CUDA's message names
    them, ``Process 7792 has 7.52 GiB memory in use``; ``cyb train`` refusing to start saw the
    GPU partly taken): worth another try once they are gone."""
    tail = _tail(log)
    return bool(re.search(r"Process \d+ has", tail)) or "GiB free; not starting" in tail


def schedule(jobs: list[Job], out: Path, slots: list[str], deadline: float, pack_to: Path | None,
             unit_seconds: float = 0.0, whole_valid: str = "", scale: str = "gpu",
             again: tuple[str, ...] = (), grace: float = 0.0) -> list[dict]:
    """Run ``jobs`` on ``slots`` (``"GPU/k"``), long ones first, each after the job it needs;
    a job is started only if ``cost x unit_seconds`` fits before ``deadline``.  At the deadline
    running jobs are killed, except those already scoring a trained model, which get up to
    ``grace`` seconds more.  A job that finished before is skipped, unless its name contains one
    of ``again`` and its final model is not in ``out`` (finished elsewhere, e.g. on another
    session's machine).  A job that runs out of GPU memory beside other jobs is queued again (it
    resumes from its checkpoint) and its GPU takes one job fewer at a time from then on; alone on
    its GPU, or after :data:`OOM_RETRIES` such tries, it fails.  A job out of memory beside other
    processes only (another driver's jobs) tries again after :data:`OOM_WAIT_S` seconds."""
    done_names = set()
    summary_path = out / "summary.jsonl"
    if summary_path.is_file():  # a rerun skips what already finished
        done_names = {json.loads(x)["name"] for x in summary_path.read_text().splitlines()
                      if x.strip() and finished(json.loads(x))}
    done_names -= {j.name for j in jobs if any(part in j.name for part in again)
                   and not (out / j.name / "final" / "model.safetensors").is_file()}
    needed = {j.needs for j in jobs if j.needs and j.name not in done_names}
    done_names -= {n for n in needed if not (out / n / "final" / "model.safetensors").is_file()}  # weights gone
    pending = sorted((j for j in jobs if j.name not in done_names),
                     key=lambda j: (not j.first, -j.priority, -j.cost))
    failed: set[str] = set()
    running: dict[str, tuple[Job, subprocess.Popen, float]] = {}  # slot -> (job, process, start)
    gpu_of = {slot: slot.split("/")[0] for slot in slots}
    limit = {g: list(gpu_of.values()).count(g) for g in set(gpu_of.values())}  # jobs at a time per GPU
    oom_tries: dict[str, int] = {}
    not_before: dict[str, float] = {}  # a job out of memory beside another driver's jobs waits

    def busy(gpu: str) -> int:
        return sum(gpu_of[s] == gpu for s in running)

    def stop(signum, _frame):  # the jobs run in sessions of their own: take them down with the driver
        for _, proc, _ in running.values():
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    log_dir = out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    try:
        while pending or running:
            for slot in slots:
                if slot in running or not pending or busy(gpu_of[slot]) >= limit[gpu_of[slot]]:
                    continue
                left = deadline - time.time()
                ready = [j for j in pending if (j.needs is None or j.needs in done_names)
                         and j.cost * unit_seconds < left  # one that cannot finish is not started
                         and not_before.get(j.name, 0) <= time.time()]
                if not ready:
                    break
                job = ready[0]
                pending.remove(job)
                running[slot] = (job, launch(job, out, gpu_of[slot], log_dir, whole_valid), time.time())
                print(f"[{time.time() - start:6.0f} s] start {job.name} on {slot}", flush=True)
            for slot, (job, proc, t0) in list(running.items()):
                if proc.poll() is None:
                    now = time.time()
                    if now > deadline and not (now < deadline + grace and trained(out, job.name)):
                        os.killpg(proc.pid, 9)
                        proc.wait()
                    else:
                        continue
                del running[slot]
                gpu, neighbours, log = gpu_of[slot], busy(gpu_of[slot]), log_dir / f"{job.name}.log"
                if (proc.returncode > 0 and gpu != "cpu" and oom_tries.get(job.name, 0) < OOM_RETRIES
                        and out_of_memory(log) and (neighbours or crowded(log))):
                    oom_tries[job.name] = oom_tries.get(job.name, 0) + 1
                    pending.insert(0, job)
                    if neighbours:
                        limit[gpu] = max(1, min(limit[gpu] - 1, neighbours))
                        then = f"GPU {gpu} now takes at most {limit[gpu]} at a time"
                    else:
                        not_before[job.name] = time.time() + OOM_WAIT_S
                        then = f"tries again in {OOM_WAIT_S:.0f} s"
                    print(f"[{time.time() - start:6.0f} s] {job.name:32s} out of GPU memory beside {neighbours} "
                          f"other runs of this suite: queued again; {then}", flush=True)
                    continue
                row = final_row(job, out, scale)
                row["seconds"] = round(time.time() - t0, 1)
                row["returncode"] = proc.returncode
                if "final" in row and proc.returncode != 0:  # trained, but its scoring was cut
                    row["trained"] = row.pop("final")
                if finished(row):
                    done_names.add(job.name)
                else:
                    failed.add(job.name)
                with summary_path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                ppl = (f"ppl {row['final']['ppl']:.2f}" if "final" in row else
                       f"trained; its scoring was cut (rc={proc.returncode}): scored by the next call"
                       if "trained" in row else f"FAILED rc={proc.returncode}")
                print(f"[{time.time() - start:6.0f} s] {job.name:32s} {ppl} ({row['seconds']} s)", flush=True)
                if pack_to is not None:
                    pack(out, pack_to)
            # drop jobs whose base failed, and those that can no longer finish in time
            pending = [j for j in pending if j.needs not in failed and j.cost * unit_seconds < deadline - time.time()]
            time.sleep(1.0)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return [json.loads(x) for x in summary_path.read_text().splitlines() if x.strip()]


def gpu_slots(gpus: str, per_gpu: int) -> list[str]:
    """The slots ``GPU/INDEX`` that :func:`schedule` runs jobs in: ``per_gpu`` on each GPU of the
    comma-separated ``gpus`` (``"cpu"``: the CPU), first one per GPU, then a second, and so on."""
    return [f"{g}/{i}" for i in range(per_gpu) for g in gpus.split(",")]


def close(rows: list[dict], asked: set[str], out: Path, pack_to: Path | None, what: str) -> None:
    """Print how many of the ``asked`` jobs finished (``what`` they are: ``"runs"``, ``"cells"``)
    and pack ``out`` into ``pack_to`` when given."""
    ok = len({r["name"] for r in rows if finished(r) and r["name"] in asked})
    print(f"{ok} {what} finished of {len(asked)} asked for; summary in {out / 'summary.jsonl'}")
    if pack_to is not None:
        pack(out, pack_to)


__all__ = ["OOM_RETRIES", "OOM_WAIT_S", "OUT_OF_MEMORY", "PACK_FILE_LIMIT", "Job", "close", "crowded", "final_row",
           "finished", "gpu_slots", "launch", "out_of_memory", "pack", "rerun_command", "schedule", "trained"]
