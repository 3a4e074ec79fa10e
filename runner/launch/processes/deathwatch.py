"""Which of an agent's workers died by a signal, and when: the root cause a peer's error only echoes.

When a worker is killed (SIGKILL from the OOM killer or a user, a segfault), it records nothing; its peers
then fail with "Connection closed by peer" and torch elastic reports whichever failure it polled first.
The agent therefore watches its own children: a thread per worker waits for it to exit with
``waitid(WNOWAIT)`` (which reads the exit status without reaping it, so torch elastic still gets it) and
notes the signal and the time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Dict, List, Set

TICK_S = 0.1  # how soon a new worker is watched


def _children() -> Set[int]:
    pids: Set[int] = set()
    for task in Path("/proc/self/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(p) for p in task.read_text().split())
    return pids


class DeathWatch:
    """Started before the workers; :meth:`killed` lists the workers that died by a signal."""

    def __init__(self) -> None:
        self._deaths: List[Dict[str, object]] = []
        self._watched: Set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._scan, name="deathwatch", daemon=True).start()

    def _scan(self) -> None:
        while not self._stop.is_set():
            for pid in _children() - self._watched:
                self._watched.add(pid)
                threading.Thread(target=self._wait, args=(pid,), name=f"deathwatch-{pid}", daemon=True).start()
            time.sleep(TICK_S)

    def _wait(self, pid: int) -> None:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        except (ChildProcessError, OSError):  # reaped before we looked
            return
        if info is not None and info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
            with self._lock:
                self._deaths.append({"pid": pid, "signal": signal.Signals(info.si_status).name, "time": time.time()})

    def killed(self) -> List[Dict[str, object]]:
        """``{pid, signal, time}`` of each child that died by a signal, earliest first."""
        self._stop.set()
        with self._lock:
            return sorted(self._deaths, key=lambda d: float(str(d["time"])))
