"""cyb train on two nodes, simulated on one host: two `torchrun --nnodes 2` launches meeting at
127.0.0.1 (gloo on the CPU). The losses equal one process's on the same data; a run whose second
node is killed resumes from its last checkpoint and ends as the uninterrupted run, under hybrid
sharding (FSDP2 within a node, replicas across nodes); processes that do not share out_dir are
stopped with one line."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from cyb.checkpoint import FAULT_ENV
from cyb.metrics_log import read_metrics

pytestmark = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available")

CONFIG = {
    "model": {"arch": "llama", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "max_position_embeddings": 128},
    "method": {"name": "cyb", "num_steps": 3, "recipe": 2, "omega": [1.0, 1.0, 2.0]},
    "data": {"task": "addition", "task_kwargs": {"digits": 2}, "num_train_examples": 64, "num_valid_examples": 8},
    "optim": {"lr": 1e-2, "warmup_steps": 2},
    # one process: 4 micro-batches of 2; two nodes: 2 micro-batches of 2 on each process
    "train": {"steps": 6, "batch_size": 8, "micro_batch_size": 2, "log_every": 1, "eval_every": 3,
              "eval_batches": 1, "save_every": 3, "keep_last": 10, "progress": False},
}
COMPARED = ("loss", "objective", "mean_steps", "grad_norm")
TIMEOUT = 300


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in (FAULT_ENV, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train_args(cfg: Path, out: Path, overrides) -> list[str]:
    args = ["-m", "cyb", "train", str(cfg), "--set", f"train.out_dir={out}"]
    for item in overrides:
        args += ["--set", item]
    return args


def _start_node(rank: int, port: int, cfg: Path, out: Path, *overrides, procs: int = 1, env=None,
                log: Path) -> subprocess.Popen:
    """One node's `torchrun`, in a session of its own (so that it can be killed as a node is)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={rank}",
           f"--nproc_per_node={procs}", "--master_addr=127.0.0.1", f"--master_port={port}", "--max_restarts=0",
           *_train_args(cfg, out, overrides)]
    return subprocess.Popen(cmd, env=env or _env(), stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _two_nodes(cfg: Path, out: Path, *overrides, procs: int = 1) -> None:
    port = _free_port()
    nodes = [_start_node(r, port, cfg, out, *overrides, procs=procs, log=out.parent / f"{out.name}-node{r}.log")
             for r in (0, 1)]
    for r, node in enumerate(nodes):
        assert node.wait(timeout=TIMEOUT) == 0, (out.parent / f"{out.name}-node{r}.log").read_text()[-3000:]


def _rows(out: Path) -> dict:
    return {(r["split"], r["step"]): r for r in read_metrics(out)}


def _assert_same_losses(out: Path, ref: Path, tol: float = 1e-5) -> None:
    rows, expected = _rows(out), _rows(ref)
    assert rows.keys() == expected.keys()
    for key, row in rows.items():
        assert row["targets"] == expected[key]["targets"], key
        for name in COMPARED:
            if row.get(name) is not None:
                assert row[name] == pytest.approx(expected[key][name], abs=tol, rel=tol), (key, name)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (torchrun starts its workers in sessions of their own)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _kill_node(node: subprocess.Popen) -> None:
    """SIGKILL a node: its torchrun agent and every worker it started, at once."""
    for pid in _children(node.pid):
        os.kill(pid, signal.SIGKILL)
    os.killpg(node.pid, signal.SIGKILL)
    node.wait()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The configuration and one process's run of it."""
    root = tmp_path_factory.mktemp("nodes")
    cfg = root / "run.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    one = root / "one"
    done = subprocess.run([sys.executable, *_train_args(cfg, one, [])], env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return cfg, root, one


def test_two_nodes_give_one_process_losses(reference):
    cfg, root, one = reference
    nodes = root / "two-nodes"
    _two_nodes(cfg, nodes)
    _assert_same_losses(nodes, one)
    assert "cpu x 2 process(es)" in (root / "two-nodes-node0.log").read_text()


def test_a_killed_node_resumes_from_the_last_checkpoint(reference):
    """Hybrid sharding (train.distributed=hsdp: a 2 x 1 mesh, one replica per node). Both nodes
    train slowly (0.3 s per step); once checkpoint 3 is written, node 1 (agent and worker) is
    killed, and node 0 fails at its next collective. Launching both again resumes at step 3 and
    ends with the losses and held-out metrics of one process's uninterrupted run."""
    pytest.importorskip("torch.distributed.fsdp")
    cfg, root, one = reference
    out = root / "killed"
    port = _free_port()
    slow = _env(**{FAULT_ENV: "step_delay=0.3"})
    nodes = [_start_node(r, port, cfg, out, "train.distributed=hsdp", env=slow, log=root / f"killed-node{r}.log")
             for r in (0, 1)]
    start = time.monotonic()
    while not (out / "ckpt-00000003").is_dir():
        assert time.monotonic() - start < TIMEOUT and nodes[0].poll() is None, \
            (root / "killed-node0.log").read_text()[-3000:]
        time.sleep(0.05)
    _kill_node(nodes[1])
    assert nodes[0].wait(timeout=TIMEOUT) != 0
    assert not (out / "final").exists()
    _two_nodes(cfg, out, "train.distributed=hsdp")
    assert "resumed at step 3" in (root / "killed-node0.log").read_text()
    _assert_same_losses(out, one)


@pytest.mark.slow
def test_hybrid_sharding_over_two_nodes_of_two_processes(reference):
    """hsdp on 2 nodes x 2 processes (4 processes: about 20 s on 2 cores): weights sharded over the
    two processes of each node, one replica per node; then one process resumes its checkpoint."""
    pytest.importorskip("torch.distributed.fsdp")
    cfg, root, one = reference
    out = root / "hsdp-2x2"
    _two_nodes(cfg, out, "train.distributed=hsdp", procs=2)
    _assert_same_losses(out, one)
    resumed = root / "hsdp-then-one"
    shutil.copytree(out, resumed)
    shutil.rmtree(resumed / "ckpt-00000006")
    shutil.rmtree(resumed / "final")
    done = subprocess.run([sys.executable, *_train_args(cfg, resumed, [])], env=_env(), capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    _assert_same_losses(resumed, one)


def test_processes_that_see_different_out_dirs_stop_with_one_line(tmp_path, monkeypatch):
    """Nodes without a shared file system: process 1 does not see the lock file process 0 wrote."""
    from cyb import distributed, run_lock
    from cyb.distributed import DistInfo

    seen = tmp_path / "node0"
    run_lock.acquire(seen)
    views = iter([[run_lock._read(seen / run_lock.LOCK_FILE)], [(True, "node-a"), (False, "node-b")]])
    monkeypatch.setattr(distributed, "gather_objects", lambda obj, info: next(views))
    with pytest.raises(run_lock.NotShared) as e:
        run_lock.check_shared(seen, DistInfo(rank=0, world_size=2, mode="ddp"))
    message = str(e.value)
    assert "process 1 on host node-b does not see" in message and "shared" not in message.split(";")[0]
    assert "file system every node mounts" in message and "\n" not in message


def test_hsdp_shards_within_a_node():
    from cyb.distributed import DistInfo

    info = DistInfo(rank=3, world_size=8, local_rank=1, mode="hsdp", local_world_size=4)
    assert info.sharded and info.shard_size == 4
    assert DistInfo(world_size=8, mode="fsdp").shard_size == 8 and not DistInfo(world_size=8, mode="ddp").sharded
