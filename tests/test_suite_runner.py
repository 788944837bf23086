"""The suite runner's scheduling on a GPU that runs out of memory, and what its packs leave out."""

import json
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import suite_runner  # noqa: E402

# A stand-in for `cyb train`: a job given "1" runs out of GPU memory on its first try (after 0.3 s;
# "2": beside another process), every other try and job finishes after its given seconds; each
# start is logged with its time.
_FAKE = """
import json, sys, time
from pathlib import Path
out, name, seconds, oom = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
starts = out / "starts.jsonl"
tries = sum(1 for x in starts.read_text().splitlines() if json.loads(x)["name"] == name) if starts.is_file() else 0
with starts.open("a") as f:
    f.write(json.dumps({"name": name, "t": time.time()}) + "\\n")
if oom != "0" and tries == 0:
    time.sleep(0.3)
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 12.00 MiB."
          + (" Process 7792 has 7.52 GiB memory in use." if oom == "2" else ""))
    sys.exit(1)
time.sleep(seconds)
(out / name).mkdir(exist_ok=True)
(out / name / "final_metrics.json").write_text(json.dumps({"ppl": 1.5}))
(out / name / "metrics.jsonl").write_text("")
(out / "ends.jsonl").open("a").write(json.dumps({"name": name, "t": time.time()}) + "\\n")
"""


def _run(tmp_path, monkeypatch, jobs: dict[str, tuple[float, int]], slots: list[str]) -> list[dict]:
    script = tmp_path / "fake.py"
    script.write_text(_FAKE)

    def launch(job, out, device, log_dir, whole_valid):
        seconds, oom = jobs[job.name]
        log = open(log_dir / f"{job.name}.log", "w")
        return subprocess.Popen([sys.executable, str(script), str(out), job.name, str(seconds), str(oom)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    monkeypatch.setattr(suite_runner, "launch", launch)
    batch = [suite_runner.Job(name, "s", name.upper(), 0, {"method": "baseline"}) for name in jobs]
    return suite_runner.schedule(batch, tmp_path, slots, float("inf"), None)


def _times(path: Path) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        times.setdefault(r["name"], []).append(r["t"])
    return times


def test_a_job_out_of_memory_beside_others_runs_again_with_fewer_neighbours(tmp_path, monkeypatch, capsys):
    rows = _run(tmp_path, monkeypatch, {"a": (0.1, 1), "b": (3.0, 0)}, ["0/0", "0/1"])
    assert sorted(r["name"] for r in rows) == ["a", "b"]  # no failed row for the first try
    assert all(suite_runner.finished(r) for r in rows)
    starts, ends = _times(tmp_path / "starts.jsonl"), _times(tmp_path / "ends.jsonl")
    assert len(starts["a"]) == 2
    assert starts["a"][1] >= ends["b"][0]  # GPU 0 now takes one job at a time
    assert "beside 1 other runs of this suite: queued again; GPU 0 now takes at most 1" in capsys.readouterr().out


def test_a_job_out_of_memory_alone_fails(tmp_path, monkeypatch):
    rows = _run(tmp_path, monkeypatch, {"a": (0.1, 1)}, ["0/0", "0/1"])
    assert [(r["name"], r["returncode"], suite_runner.finished(r)) for r in rows] == [("a", 1, False)]


def test_a_job_out_of_memory_beside_another_drivers_jobs_waits_and_tries_again(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(suite_runner, "OOM_WAIT_S", 1.5)
    rows = _run(tmp_path, monkeypatch, {"a": (0.1, 2)}, ["0/0"])
    assert [(r["name"], suite_runner.finished(r)) for r in rows] == [("a", True)]
    first, second = _times(tmp_path / "starts.jsonl")["a"]
    assert second - first >= 1.5
    assert "tries again in 2 s" in capsys.readouterr().out


def test_out_of_memory_is_read_from_the_log(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("step 10\n" * 5000
                   + "this run needs about 9.1 GiB per GPU but the GPU has 2.0 GiB free; not starting.\n")
    assert suite_runner.out_of_memory(log)
    log.write_text("Traceback ...\nValueError: no\n")
    assert not suite_runner.out_of_memory(log)
    assert not suite_runner.out_of_memory(tmp_path / "missing.log")
    log.write_text("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`\n")
    assert suite_runner.out_of_memory(log) and not suite_runner.crowded(log)
    log.write_text("CUDA out of memory. GPU 0 has a total capacity of 79.18 GiB of which 9.06 MiB is free. "
                   "Process 7792 has 7.52 GiB memory in use.\n")
    assert suite_runner.crowded(log)


def test_the_pack_leaves_out_half_written_saves_and_large_files(tmp_path, monkeypatch, capsys):
    run = tmp_path / "out" / "rg-x-cyb-s0"
    for name in ("final.tmp-7814/.tmpBiIj37", ".final.tmp-12/config.json", "ckpt-00000200.tmp-9/x.json",
                 "eval/metrics.json", "eval/big.json"):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text("{}")
    (run / "eval" / "big.json").write_text("x" * 2000)
    monkeypatch.setattr(suite_runner, "PACK_FILE_LIMIT", 1000)
    suite_runner.pack(tmp_path / "out", tmp_path / "r.tar.gz")
    with tarfile.open(tmp_path / "r.tar.gz") as tar:
        assert [n.split("rg-x-cyb-s0/")[1] for n in tar.getnames()] == ["eval/metrics.json"]
    assert "left out" in capsys.readouterr().err
