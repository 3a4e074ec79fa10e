"""One owner of a sweep folder, or of a run folder, at a time.

A sweep (or its resume) holds an advisory lock (``flock``) on ``<sweep folder>/.runner.lock`` from the moment
its multirun starts until its process ends; the file names the holder (pid and command). A second sweep or
resume on the same folder is refused in one line naming the folder and the holder, instead of running the
folder's points a second time under the same parent run. The kernel releases the lock when its holder dies
(a SIGKILL included), so a lock left by a process that is gone blocks no one: it is taken over, and the line
says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional

LOCK_FILE = ".runner.lock"
DELIVERY_LOCK = ".delivery.lock"
_HELD: Dict[str, int] = {}  # folder -> the lock file's descriptor, open for this process's life


class FolderBusy(Exception):
    """The folder is held by another live process; the message is the one line to show."""


def _holder(text: str) -> Optional[int]:
    try:
        return int(text.split(maxsplit=1)[0])
    except (ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    import psutil

    return bool(psutil.pid_exists(pid))  # another user's process counts as there


def _read_holder(fd: int) -> tuple[str, Optional[int]]:
    """The holder's line and pid. A holder that has just taken the lock writes its line a moment later (the file is
    empty, or still names the holder before it, which is gone): read again for up to a second before giving up."""
    import time

    deadline = time.monotonic() + 1.0
    while True:
        text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        pid = _holder(text)
        live = pid is not None and _alive(pid)
        if live or time.monotonic() > deadline:
            return text, pid if live else None
        time.sleep(0.02)


def _run_of(folder: Path) -> str:
    """The MLflow run a run folder's job recorded (``run.json``), as words for the refusal."""
    import json

    try:
        return f", MLflow run {json.loads((folder / 'run.json').read_text())['run_id']}"
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def hold_run_folder(folder: Path) -> None:
    """A single job's run folder named on the command line (``hydra.run.dir``): taken before Hydra writes into it,
    for the job's life, so that a second job on it is refused before it touches anything of the first's (one whose
    holder is gone is taken over silently)."""
    folder.mkdir(parents=True, exist_ok=True)
    hold(folder, "run")


def hold(folder: Path, kind: str = "sweep") -> Optional[str]:
    """Take ``folder``'s lock for the rest of this process; a note when it was taken over from a process that
    is gone, else None. Raises :class:`FolderBusy` when a live process holds it. ``kind``: ``sweep`` or ``run``
    (the words of the refusal)."""
    key = str(folder.resolve())
    if key in _HELD:
        return None
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        text, pid = _read_holder(fd)
        os.close(fd)
        who = f"process {pid} ({text.split(maxsplit=1)[1] if ' ' in text else 'command unknown'})" if pid else \
            "another process"
        if kind == "run":
            raise FolderBusy(f"the run folder {folder} is in use by {who}{_run_of(folder)}; wait for it to end (or "
                             "stop it), or give this job another hydra.run.dir") from None
        raise FolderBusy(f"the sweep folder {folder} is in use by {who}; wait for it to end (or stop it), then "
                         f"run again or resume it: python -m runner resume {folder}") from None
    before = _holder(os.pread(fd, 4096, 0).decode(errors="replace"))
    with contextlib.suppress(OSError):  # a full disk: the lock holds without its holder's name
        line = f"{os.getpid()} {' '.join(['python -m runner', *sys.argv[1:]])}\n".encode()
        os.pwrite(fd, line, 0)  # written over the old line, then cut: the file never reads empty
        os.ftruncate(fd, len(line))
    _HELD[key] = fd
    if kind == "sweep" and before is not None and before != os.getpid() and not _alive(before):
        return f"[runner] the sweep folder's lock was held by process {before}, which is gone: taken over"
    return None


@contextlib.contextmanager
def taking_turns(folder: Path, wait: bool = True, say: Optional[Callable[[str], None]] = None) -> Iterator[bool]:
    """Hold ``folder``'s delivery lock for the ``with`` block; it yields whether it is held. Another live process
    delivering the same folder's reports: ``wait`` -- wait for it, after ``say`` got one line naming it (a sync
    then finds what that process delivered already done); else yield False at once (a live job's periodic
    delivery: it tries again on its next round, training never waits). A folder where no lock file can be made
    (read-only, a full disk) yields True unlocked: delivering alone is the usual case, and refusing it would keep
    the reports out of the store for good."""
    try:
        fd = os.open(folder / DELIVERY_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            if not wait:
                yield False
                return
            if say is not None:
                text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
                pid = _holder(text)
                who = f"process {pid} ({text.split(maxsplit=1)[1]})" if pid and " " in text else "another process"
                say(f"[runner] {who} is delivering the reports of {folder}; waiting for it to finish (one record "
                    "per run: what it delivers is not delivered again)")
            fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(OSError):  # the holder's name, for the line of the next one who waits
            line = f"{os.getpid()} {' '.join(['python -m runner', *sys.argv[1:]])}\n".encode()
            os.pwrite(fd, line, 0)
            os.ftruncate(fd, len(line))
        yield True
    finally:
        os.close(fd)  # closing the descriptor releases the lock
