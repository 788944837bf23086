"""The suite runner's scheduling on a GPU that runs out of memory, and what its packs leave out."""

import json
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import suite_runner  # noqa: E402

# A stand-in for `cyb train`: job "a" runs out of GPU memory on its first try (after 0.3 s), every
# other try and job finishes after its given seconds; each start is logged with its time.
_FAKE = """
import json, sys, time
from pathlib import Path
out, name, seconds, oom = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4] == "1"
starts = out / "starts.jsonl"
tries = sum(1 for x in starts.read_text().splitlines() if json.loads(x)["name"] == name) if starts.is_file() else 0
with starts.open("a") as f:
    f.write(json.dumps({"name": name, "t": time.time()}) + "\\n")
if oom and tries == 0:
    time.sleep(0.3)
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 12.00 MiB.")
    sys.exit(1)
time.sleep(seconds)
(out / name).mkdir(exist_ok=True)
(out / name / "final_metrics.json").write_text(json.dumps({"ppl": 1.5}))
(out / name / "metrics.jsonl").write_text("")
(out / "ends.jsonl").open("a").write(json.dumps({"name": name, "t": time.time()}) + "\\n")
"""


def _run(tmp_path, monkeypatch, jobs: dict[str, tuple[float, bool]], slots: list[str]) -> list[dict]:
    script = tmp_path / "fake.py"
    script.write_text(_FAKE)

    def launch(job, out, device, log_dir, whole_valid):
        seconds, oom = jobs[job.name]
        log = open(log_dir / f"{job.name}.log", "w")
        return subprocess.Popen([sys.executable, str(script), str(out), job.name, str(seconds), "1" if oom else "0"],
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
    rows = _run(tmp_path, monkeypatch, {"a": (0.1, True), "b": (3.0, False)}, ["0/0", "0/1"])
    assert sorted(r["name"] for r in rows) == ["a", "b"]  # no failed row for the first try
    assert all(suite_runner.finished(r) for r in rows)
    starts, ends = _times(tmp_path / "starts.jsonl"), _times(tmp_path / "ends.jsonl")
    assert len(starts["a"]) == 2
    assert starts["a"][1] >= ends["b"][0]  # GPU 0 now takes one job at a time
    assert "out of GPU memory beside 1 other runs: queued again; GPU 0 now takes at most 1" in capsys.readouterr().out


def test_a_job_out_of_memory_alone_fails(tmp_path, monkeypatch):
    rows = _run(tmp_path, monkeypatch, {"a": (0.1, True)}, ["0/0", "0/1"])
    assert [(r["name"], r["returncode"], suite_runner.finished(r)) for r in rows] == [("a", 1, False)]


def test_out_of_memory_is_read_from_the_log(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("step 10\n" * 5000 + "this run needs about 9.1 GiB per GPU but the GPU has 2.0 GiB free; not starting.\n")
    assert suite_runner.out_of_memory(log)
    log.write_text("Traceback ...\nValueError: no\n")
    assert not suite_runner.out_of_memory(log)
    assert not suite_runner.out_of_memory(tmp_path / "missing.log")


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
