"""Each rank's sign of life, so that a rank that stops answering is named, not the peer that waited for it.

A collective that times out (``cluster.pg_timeout_s``) fails on the ranks that waited, while the rank that
stopped (a SIGSTOP, a frozen host, a thread holding the interpreter) says nothing. Every rank writes the time
into ``pids/rank<R>.beat`` every :data:`BEAT_S` from a thread of its own; the rank whose wait timed out reads
them and names the peers that went silent (:func:`timeout_line`). Its error record lists them, and the
driver's root cause names that rank and its node (:mod:`runner.launch.processes.supervisor`).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from pathlib import Path
from typing import List, Optional, Tuple

from runner.runtime import run_files

BEAT_S = 2.0  # seconds between two signs of life
SILENT_AFTER_S = 2.5 * BEAT_S  # no sign of life for this long: the rank stopped answering
_TIMEOUT = re.compile(r"timed out|timeout|Watchdog caught collective", re.IGNORECASE)


def _beat_file(run_folder: Path, rank: int) -> Path:
    return run_folder / run_files.PIDS / f"rank{rank}.beat"


def start(run_folder: Path, rank: int, node: int) -> None:
    """Write this rank's sign of life (time and node) every :data:`BEAT_S`, from a daemon thread."""
    path = _beat_file(run_folder, rank)
    temporary = path.with_suffix(f".beat.{os.getpid()}")

    def beat() -> None:
        while True:
            with contextlib.suppress(OSError):  # a full or vanished run folder: the job's own error says so
                temporary.write_text(f"{time.time()} {node}")
                os.replace(temporary, path)
            time.sleep(BEAT_S)

    threading.Thread(target=beat, name="runner-heartbeat", daemon=True).start()


def silent_peers(run_folder: Path, world: int, own: int, now: Optional[float] = None) -> List[Tuple[int, int, float]]:
    """The other ranks with no sign of life for :data:`SILENT_AFTER_S`: (rank, node, seconds silent)."""
    now = time.time() if now is None else now
    found = []
    for rank in range(world):
        if rank == own:
            continue
        try:
            stamp, node = _beat_file(run_folder, rank).read_text().split()
        except (OSError, ValueError):
            continue  # never started (its own failure names it) or on a host whose folder is not shared
        if now - float(stamp) > SILENT_AFTER_S:
            found.append((rank, int(node), now - float(stamp)))
    return found


def is_collective_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that waited ``cluster.pg_timeout_s`` for a peer (gloo's or NCCL's)."""
    import torch.distributed as dist

    backend_error = getattr(dist, "DistBackendError", None)
    return (backend_error is not None and isinstance(exc, backend_error)) or bool(_TIMEOUT.search(str(exc)))


def timeout_line(run_folder: Path, world: int, own: int, timeout_s: float) -> Tuple[str, List[Tuple[int, int, float]]]:
    """The error line of this rank's timed-out wait (no library source paths) and the silent peers it names."""
    silent = silent_peers(run_folder, world, own)
    if silent:
        longest = max(age for _, _, age in silent)
        return (f"did not answer within cluster.pg_timeout_s={timeout_s:g} s (no sign of life from it for "
                f"{longest:.0f} s: stopped, frozen, or stuck holding the interpreter); rank {own} waited for it",
                silent)
    return (f"rank {own} waited cluster.pg_timeout_s={timeout_s:g} s for a peer in a collective, and every rank was "
            "still running (one stuck in a long step, or the network between nodes): raise cluster.pg_timeout_s, or "
            "read the ranks' logs", [])
