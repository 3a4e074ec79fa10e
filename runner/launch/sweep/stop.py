"""``sweep.max_failures``: a sweep that stops once that many of its points have failed.

A point whose job fails for good (not a fault retried into a success, not a plan-only "no plan fits", which
is an answer) appends itself to the sweep folder's ``failures.jsonl``; the one that reaches the limit writes
``stop.json``, with the reason, and cancels a Slurm array's pending tasks. From then on no point starts (it
writes KILLED, not run) and the points running (other joblib processes, other Slurm tasks) stop their
workers and end KILLED (:func:`raise_if_stopped`, in the driver's supervision loop). The sweep's end names the
failures' common reason and the command that resumes the rest (:mod:`runner.launch.sweep.parent`); a resume starts
with a clean count (:func:`clear`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional

from runner.runtime import run_files
from runner.runtime.signals import Stopped

FAILURES, STOP = "failures.jsonl", "stop.json"


class SweepStopped(Stopped):
    """This point was stopped (or never started) because its sweep reached ``sweep.max_failures``."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason

    @property
    def name(self) -> str:
        return self.reason


def clear(sweep_folder: Path) -> None:
    """A new sweep, or a resumed one: no failure counted, nothing stopped."""
    for name in (FAILURES, STOP):
        (sweep_folder / name).unlink(missing_ok=True)


def failed_points(sweep_folder: Path) -> List[Dict[str, object]]:
    """The points that failed in this session of the sweep, in order (one entry per job)."""
    seen: Dict[object, Dict[str, object]] = {}
    try:
        lines = (sweep_folder / FAILURES).read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line cut short by a full disk
        if isinstance(entry, dict) and "job" in entry:
            seen.setdefault(entry["job"], entry)
    return list(seen.values())


def count_failure(sweep_folder: Path, job: int, line: str, limit: Optional[int]) -> None:
    """Count this point's failure; at ``limit`` failures, stop the sweep (``stop.json``; a Slurm array's pending
    tasks cancelled)."""
    if limit is None:
        return
    with (sweep_folder / FAILURES).open("a") as f:  # one short line per append: whole under concurrent writers
        f.write(json.dumps({"job": job, "error": line}) + "\n")
    found = failed_points(sweep_folder)
    if len(found) >= limit and not (sweep_folder / STOP).exists():
        stop_sweep(sweep_folder, f"sweep.max_failures={limit} ({len(found)} points failed)", limit=limit,
                   failures=len(found))


def stop_sweep(sweep_folder: Path, reason: str, **facts: object) -> None:
    """Stop the sweep in ``sweep_folder``: ``stop.json`` (with ``reason``), which its running points read and stop
    on (:func:`raise_if_stopped`), and a scheduler's points not started yet (a Slurm array's) cancelled."""
    run_files.write_json(sweep_folder / STOP, {"reason": reason, **facts})
    from runner.launch import schedulers

    for scheduler in schedulers.registered().values():
        scheduler.cancel_pending()


def stop_reason(sweep_folder: Path) -> Optional[str]:
    """Why the sweep stopped (``sweep.max_failures`` reached), or None while it goes on."""
    found = run_files.read_json(sweep_folder / STOP)
    return str(found.get("reason")) if isinstance(found, dict) else None


def raise_if_stopped(sweep_folder: Optional[Path]) -> None:
    """Raise :class:`SweepStopped` once this point's sweep has stopped (called while the point runs)."""
    if sweep_folder is not None and (reason := stop_reason(sweep_folder)):
        raise SweepStopped(reason)
