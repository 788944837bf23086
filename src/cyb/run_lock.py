"""One training process per run folder: a lock file in ``train.out_dir``.

:func:`acquire` takes an exclusive ``flock`` on ``out_dir/train.lock`` and writes who holds it
(pid, host, start time, command).  A second ``cyb train`` into the same folder finds the lock
held and stops with one line naming that process; the kernel releases the lock of a process that
dies (``kill -9``), so the next run takes the file over, with a note.  :meth:`RunLock.release`
removes the file.  Under ``torchrun`` only the first process locks (the trainer shares the
outcome with the others), and every process checks that it sees the lock file the first one
wrote (:func:`check_shared`: nodes must share ``out_dir``).  Platforms without ``fcntl`` fall
back to the file's pid: a lock whose process no longer runs on this host is taken over.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import weakref
from pathlib import Path

LOCK_FILE = "train.lock"

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux or macOS
    fcntl = None


class RunLocked(ValueError):
    """Another live process holds the run folder's lock (one line: who, and what to do)."""


def _holder() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime()),
            "command": " ".join(sys.argv)[:500]}


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe(holder: dict) -> str:
    """``pid 1234 on host h, started 2026-01-02 03:04:05`` from a lock file's contents."""
    if not holder:
        return "an unknown process (its lock file is unreadable)"
    return (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, started "
            f"{holder.get('started', '?')}")


def _pid_alive(holder: dict) -> bool:
    """Whether the process a lock file names still runs (only knowable on this host)."""
    if holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(holder.get("pid", -1)), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, OverflowError):
        return True
    return True


class RunLock:
    """A held lock on a run folder; :meth:`release` (or garbage collection) lets it go."""

    def __init__(self, path: Path, fd: int | None):
        self.path = path
        self._finalizer = weakref.finalize(self, RunLock._let_go, path, fd)

    @staticmethod
    def _let_go(path: Path, fd: int | None) -> None:
        try:
            if _read(path).get("pid") == os.getpid():
                path.unlink()
        except OSError:
            pass
        if fd is not None:
            try:
                os.close(fd)  # closing releases the flock
            except OSError:
                pass

    def release(self) -> None:
        """Remove the lock file and release the lock (idempotent)."""
        self._finalizer()

    @property
    def held(self) -> bool:
        return self._finalizer.alive


def acquire(run_dir: str | os.PathLike, *, note=None) -> RunLock:
    """Lock ``run_dir`` (created if needed) for this process.

    Raises :class:`RunLocked` naming the process that holds it.  ``note(text)`` (default: print
    to stderr) is told when a lock left by a process that no longer runs is taken over.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    say = note if note is not None else (lambda text: print(text, file=sys.stderr, flush=True))
    if fcntl is None:  # pragma: no cover
        return _acquire_by_pid(path, say)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RunLocked(_busy(run_dir, path, _read(path))) from None
        try:  # the file may have been removed (released) between our open and our lock
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        break
    left = _read(path)
    if left:
        say(f"note: {path} was left by {describe(left)}, which no longer runs (killed?); taking it over")
    data = json.dumps(_holder(), indent=1).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)
    return RunLock(path, fd)


def lock_run(run_dir: str | os.PathLike, info) -> RunLock | None:
    """:func:`acquire` on the first process of ``info`` (a :class:`~cyb.distributed.DistInfo`);
    every process raises :class:`RunLocked` when it could not.  The others get None."""
    from .distributed import gather_objects

    lock, problem = None, None
    if info.is_main:
        try:
            lock = acquire(run_dir)
        except RunLocked as e:
            problem = str(e)
    problem = gather_objects(problem, info)[0]
    if problem is not None:
        raise RunLocked(problem)
    if info.enabled:
        try:
            check_shared(run_dir, info)
        except NotShared:
            if lock is not None:
                lock.release()
            raise
    return lock


class NotShared(ValueError):
    """Processes of one run see different ``train.out_dir`` folders (nodes without a shared file system)."""


def check_shared(run_dir: str | os.PathLike, info) -> None:
    """Check that every process of ``info`` sees the lock file the first process wrote into
    ``run_dir``: one folder for all of them (every process reads the checkpoints and the tokenizer
    the first one writes).  A collective; raises :class:`NotShared` on every process, naming the
    first process (and its host) that does not see it."""
    from .distributed import gather_objects

    path = Path(run_dir) / LOCK_FILE
    written = gather_objects(_read(path) if info.is_main else None, info)[0] or {}
    seen = _read(path)
    same = bool(seen) and all(seen.get(k) == written.get(k) for k in ("pid", "host", "started"))
    views = gather_objects((same, socket.gethostname()), info)
    blind = [(rank, host) for rank, (ok, host) in enumerate(views) if not ok]
    if blind:
        rank, host = blind[0]
        raise NotShared(f"train.out_dir ({run_dir}) is not one folder for every process: process {rank} on host "
                        f"{host} does not see {path}, which process 0 on host {written.get('host', '?')} wrote; put "
                        "out_dir on a file system every node mounts (NFS, Lustre, ...), since every process reads "
                        "the checkpoints and tokenizer the first one writes")


def _busy(run_dir: Path, path: Path, holder: dict) -> str:
    return (f"train.out_dir ({run_dir}) is in use by another cyb train: {describe(holder)} holds {path}; "
            "wait for it to finish or stop it, or give another train.out_dir")


def _acquire_by_pid(path: Path, say) -> RunLock:  # pragma: no cover - platforms without fcntl
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            holder = _read(path)
            if _pid_alive(holder):
                raise RunLocked(_busy(path.parent, path, holder)) from None
            say(f"note: {path} was left by {describe(holder)}, which no longer runs; taking it over")
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(_holder(), indent=1))
        return RunLock(path, None)
    raise RunLocked(_busy(path.parent, path, _read(path)))


__all__ = ["LOCK_FILE", "NotShared", "RunLock", "RunLocked", "acquire", "check_shared", "describe", "lock_run"]
