"""The run folder: one job's files, named in one place.

``outputs/runs/<date>/<time>/`` (a sweep's point: ``outputs/multirun/<date>/<time>/<n>/``) holds:

- ``resolved.yaml``: the config the workers run (composed and resolved once, by the driver);
- ``driver.json``: written by the driver before launch (the rendezvous port, the driver's pid and start time);
  its presence tells rank 0 that a driver owns the MLflow run, and ``python -m runner sync`` whether that driver
  is gone (:func:`driver_gone`);
- ``run.json``: the MLflow store and run id, published by the driver once the run exists;
- ``events.jsonl``: what rank 0 reports for MLflow (metrics, tags, artifacts), one JSON line each, marked with
  the job's writer id (``events_writer.json``: lines of another are passed over);
- ``delivered.json``: how much of it is in the store, and the final status while the store was unreachable
  (``python -m runner sync <run folder>`` delivers the rest);
- ``results.json``: rank 0's results (losses, AUC, throughput; or the plan's estimates in ``mode=plan``);
- ``status.json``: how the job ended (``FINISHED`` / ``FAILED`` with its one-line error / ``KILLED``):
  what a sweep's outcome is computed from;
- ``runner.log``: the libraries' warnings and log lines (driver, agents, workers), full tracebacks;
- ``measured.json``, ``plan/``, ``checkpoints/``; ``pids/rank<R>.pid``; ``errors/`` (each failed rank's
  line and traceback, each agent's report of a killed worker).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from runner.config.errors import disk_full

RESOLVED = "resolved.yaml"
DRIVER = "driver.json"
RUN_INFO = "run.json"
EVENTS = "events.jsonl"
EVENTS_WRITER = "events_writer.json"  # the id each line of events.jsonl is marked with by the job's processes
RESULTS = "results.json"
STATUS = "status.json"
MEASURED = "measured.json"
PLAN = "plan"
CHECKPOINTS = "checkpoints"
PIDS = "pids"
ERRORS = "errors"
DELIVERED = "delivered.json"  # how much of events.jsonl is in the store; the final status while it is not
LOG = "runner.log"  # Hydra's job log (``hydra.job.name`` is ``runner``); agents and workers append to it
SCHEDULER = "scheduler.json"  # a sweep folder's scheduler record: {"scheduler": <its name>, "job_ids": [...]}


def node_error_files(run_folder: Path) -> List[Path]:
    """The other nodes' failure reports of a scheduler's job whose nodes keep their files in folders of its shared
    run folder (``<folder>/errors/*.json``: :meth:`runner.launch.schedulers.Scheduler.node_run_folder`)."""
    return sorted(run_folder.glob(f"*/{ERRORS}/*.json"))


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON atomically: readers see the old file or the whole new one. A write that fails
    names ``path`` (a full disk's error from ``write`` or ``close`` names no file)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, path)
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def update_json(path: Path, **fields: Any) -> None:
    """Set ``fields`` in the JSON object at ``path`` (created when missing), atomically."""
    write_json(path, {**(read_json(path) or {}), **fields})


def read_json(path: Path) -> Optional[Any]:
    """The JSON at ``path``, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_status(run_folder: Path, status: str, error: Optional[str] = None, **extra: Any) -> None:
    """How this job ended (``status.json``; ``error`` is its one line): written by the job's owner
    (:mod:`runner.launch.job.hydra_call`), or by the Slurm launcher for a point that never ran. A status that cannot be
    written is a warning: the job's own outcome matters more (a full disk was already said)."""
    try:
        run_folder.mkdir(parents=True, exist_ok=True)
        write_json(run_folder / STATUS, {"status": status, "error": error, **{k: v for k, v in extra.items()
                                                                          if v is not None}})
    except OSError as exc:
        if not (disk_full(exc) and (error or "").startswith("disk full")):
            print(f"[runner] warning: could not write the job's status in {run_folder}: {exc}", file=sys.stderr)


def read_status(run_folder: Path) -> Optional[Dict[str, Any]]:
    return read_json(run_folder / STATUS)


def write_error(run_folder: Path, name: str, report: Dict[str, Any], traceback_text: Optional[str] = None) -> None:
    """``errors/<name>.json`` (and its traceback beside it): one failed rank's or agent's report."""
    folder = run_folder / ERRORS
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / f"{name}.json", report)
    if traceback_text is not None:
        (folder / f"{name}.traceback.txt").write_text(traceback_text)


def error_reports(run_folder: Path) -> list:
    """Every report in ``errors/``, and in the other nodes' folders (:func:`node_error_files`) of a scheduler's job
    when they share the folder (unreadable ones skipped)."""
    files = sorted(run_folder.glob(f"{ERRORS}/*.json")) + node_error_files(run_folder)
    return [r for r in map(read_json, files) if isinstance(r, dict)]


PREVIOUS = "previous"  # an earlier job's files, when a job runs again in the same folder
_JOB_FILES = (DRIVER, RUN_INFO, EVENTS, EVENTS_WRITER, RESULTS, STATUS, MEASURED, PLAN, PIDS, ERRORS, DELIVERED)


def set_aside_previous(run_folder: Path, names: Sequence[str] = _JOB_FILES) -> Optional[Path]:
    """Move an earlier job's files in ``run_folder`` (those of ``names``) to ``previous/<n>/`` (checkpoints stay,
    for ``train.resume=latest``), so that this job never reads them; the folder moved to, or None."""
    found = [run_folder / name for name in names if (run_folder / name).exists()]
    if not found:
        return None
    n = 1
    while (run_folder / PREVIOUS / str(n)).exists():
        n += 1
    dest = run_folder / PREVIOUS / str(n)
    dest.mkdir(parents=True)
    for path in found:
        os.replace(path, dest / path.name)
    return dest


def earlier_jobs(run_folder: Path) -> List[Path]:
    """The folders an earlier job's files were set aside to in ``run_folder`` (:func:`set_aside_previous`: an attempt
    run again, a resumed point), oldest first, each holding that job's ``run.json``."""
    found = [d for d in (run_folder / PREVIOUS).glob("*") if d.name.isdigit() and (d / RUN_INFO).exists()]
    return sorted(found, key=lambda d: int(d.name))


def point_dirs(sweep_folder: Path) -> List[Path]:
    """A sweep folder's point folders (``0``, ``1``, ...), in job order."""
    if not sweep_folder.is_dir():
        return []
    return sorted((d for d in sweep_folder.iterdir() if d.is_dir() and d.name.isdigit()), key=lambda d: int(d.name))


@contextlib.contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """The block run by one process at a time among those that take ``lock_file`` (others wait)."""
    with open(lock_file, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _start_of(pid: int) -> Optional[Tuple[str, float]]:
    """A process's identity across pid reuse: when this host booted and when the process started (psutil: the
    kernel's start in ticks since boot, added to the boot time), as text and seconds; None where this host
    cannot read them."""
    import psutil

    try:
        return f"{psutil.boot_time():.0f}", psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def driver_fields(port: int) -> Dict[str, Any]:
    """What ``driver.json`` holds: the rendezvous port, and this process's host, pid and start (the host's boot
    time and when it started), which together name this driver even after its pid is reused."""
    import socket

    start = _start_of(os.getpid())
    return {"port": port, "host": socket.gethostname(), "pid": os.getpid(),
            **({"boot": start[0], "started": start[1]} if start else {})}


def driver_gone(run_folder: Path) -> Optional[str]:
    """Where the driver ``driver.json`` names is gone (no such process, or another one under its pid, or the host
    rebooted since): the words saying so, with when the folder last heard from the job; None where it is alive,
    the file names none, this host cannot tell, or the driver ran on another host (a Slurm job's folder read
    from a login node)."""
    import datetime
    import socket

    import psutil

    fields = read_json(run_folder / DRIVER)
    if not isinstance(fields, dict) or not isinstance(fields.get("pid"), int) or fields["pid"] <= 0:
        return None
    if fields.get("host") != socket.gethostname() or not isinstance(fields.get("boot"), str):
        return None
    pid, started = fields["pid"], fields.get("started")
    if psutil.pid_exists(pid):  # another user's process counts as there (hidden or not)
        now = _start_of(pid)
        if now is None or not isinstance(started, (int, float)):
            return None  # one this host cannot read, or the file of an older runner: not judged gone
        if abs(float(now[0]) - float(fields["boot"])) <= 2 and abs(now[1] - started) <= 2:
            return None  # the same process (psutil's times follow the wall clock: a step of it moves them a little)
    heard = max((p.stat().st_mtime for p in (run_folder / EVENTS, run_folder / DRIVER, run_folder / RUN_INFO)
                 if p.exists()),
                default=0.0)
    when = datetime.datetime.fromtimestamp(heard).strftime("%Y-%m-%d %H:%M:%S")
    return f"its driver (pid {pid}) is gone, killed outright; last heard from at {when}"
