"""The run folder's lock: one training process per out_dir, a dead holder's lock taken over."""

from __future__ import annotations

import json
import os
import socket

import pytest

from cyb.distributed import DistInfo
from cyb.run_lock import LOCK_FILE, RunLocked, acquire, lock_run


def test_a_held_lock_names_its_holder_and_release_removes_it(tmp_path):
    run = tmp_path / "run"
    lock = acquire(run)  # creates the folder
    holder = json.loads((run / LOCK_FILE).read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    with pytest.raises(RunLocked, match=rf"train.out_dir \({run}\) is in use by another cyb train: pid "
                                        rf"{os.getpid()} on host .*, started \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d holds"):
        acquire(run)
    lock.release()
    lock.release()  # idempotent
    assert not (run / LOCK_FILE).exists()
    acquire(run).release()


def test_a_lock_left_by_a_dead_process_is_taken_over_with_a_note(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_FILE).write_text(json.dumps({"pid": 2**22 + 12345, "host": socket.gethostname(),
                                             "started": "2020-01-01 00:00:00"}))
    notes = []
    lock = acquire(run, note=notes.append)
    assert len(notes) == 1 and f"{run / LOCK_FILE} was left by pid {2**22 + 12345}" in notes[0]
    assert "taking it over" in notes[0]
    assert json.loads((run / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()


def test_only_the_first_process_locks(tmp_path):
    assert lock_run(tmp_path / "a", DistInfo(rank=1)) is None
    assert not (tmp_path / "a" / LOCK_FILE).exists()
    lock = lock_run(tmp_path / "a", DistInfo())
    assert lock is not None and (tmp_path / "a" / LOCK_FILE).exists()
    lock.release()


def test_a_trainer_that_is_dropped_lets_the_folder_go(tmp_path):
    import gc

    lock = acquire(tmp_path / "r")
    del lock
    gc.collect()
    acquire(tmp_path / "r").release()
