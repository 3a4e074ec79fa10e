"""How far a sweep is: one line per finished point, with the count, the failures and the time left.

Each point's job prints it once its outcome is recorded (:mod:`runner.launch.job.hydra_call`), whichever launcher and
process ran it: the counts are read from the points' ``status.json`` files in the sweep folder, the total
from ``sweep.json`` (a grid's points), the pace from the points finished since the sweep (or its resume)
began, so that points run in parallel count as they do.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from runner.runtime import run_files
from runner.track.sweep_points import SWEEP_FILE


def _left(seconds: float) -> str:
    if seconds < 90:
        return f"about {max(seconds, 1):.0f} s left"
    if seconds < 90 * 60:
        return f"about {seconds / 60:.0f} min left"
    return f"about {seconds / 3600:.1f} h left"


def progress_line(sweep_folder: Path, now: Optional[float] = None) -> Optional[str]:
    """``[runner] sweep: 7 of 25 done, 0 failed, about 2 min left`` for the sweep in ``sweep_folder``; None
    outside a sweep."""
    info = run_files.read_json(sweep_folder / SWEEP_FILE)
    if not isinstance(info, dict):
        return None
    now = time.time() if now is None else now
    started = float(info.get("started") or now)
    done = failed = this_session = 0
    for point in run_files.point_dirs(sweep_folder):
        status = run_files.read_status(point)
        try:
            now_done = bool(status) and (point / run_files.STATUS).stat().st_mtime >= started
        except OSError:
            now_done = False
        if not status or not (now_done or status.get("status") == "FINISHED"):
            continue  # not done yet, or failed or stopped in an earlier session of a resumed sweep (it runs again)
        done += 1
        failed += status.get("status") == "FAILED"
        this_session += now_done
    total = info.get("points")
    of = f" of {total}" if total else ""
    line = f"[runner] sweep: {done}{of} done, {failed} failed"
    if total and done < total and this_session:
        line += ", " + _left((now - started) / this_session * (total - done))
    return line
