"""A Hydra sweep as MLflow sees it: one parent run, each point's run its child, an outcome read from the points.

:class:`SweepParentRun` is the Hydra callback named in ``conf/config.yaml``. When the multirun starts it
creates the parent run (the swept keys and their values as params) and leaves ``sweep.json`` in the sweep
folder, where each point's driver finds the parent's id and the swept keys (to name its run after its
point, e.g. ``xbw=6 reserve=0.15``). When the multirun ends it reads what every point left in its run
folder (``status.json``, ``results.json``), whichever launcher and process ran it, writes the sweep
report, logs what the sweep found, and ends the parent FINISHED, or FAILED naming the points that failed
(the command then exits non-zero).
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from runner.config.errors import TrackingError
from runner.config.modes import MODES
from runner.config.sweepers import RUNNER_SWEEPERS, sweeper_of
from runner.launch.schedulers.host_pool import end_pool, warm_pool
from runner.launch.sweep import stop as sweep_stop
from runner.launch.sweep.sweep_report import write_sweep_report
from runner.runtime import run_files
from runner.runtime.folder_lock import FolderBusy, hold, taking_turns
from runner.track.events import EventLog, EventPump
from runner.track.store import (
    check_store,
    client,
    creation_tags,
    end_run,
    experiment_id,
    is_outage,
    log_params,
    new_record,
    outage_reason,
    start_run,
    tracking_uri,
)
from runner.track.sweep_points import SWEEP_FILE, grid_size, paired_keys, sweep_info, sweep_name, swept_params
from runner.track.sync import PARENT_DIR, end_or_keep, kept_parent, kept_runs
from runner.track.ui_links import compare_url


@dataclass
class PointOutcome:
    job: int
    status: str
    error: Optional[str]


def outcomes(sweep_folder: Path) -> List[PointOutcome]:
    """How each point ended, from its ``status.json``; a point that left none did not end by itself."""
    statuses = [(d, run_files.read_status(d)) for d in run_files.point_dirs(sweep_folder)]
    return [PointOutcome(int(d.name), "FAILED", "ended without recording a status (killed?)") if status is None
            else PointOutcome(int(d.name), status["status"], status.get("error")) for d, status in statuses]


class _Running:
    """This process's sweep while it runs: (store, parent run id, sweep folder); reached through
    :func:`end_stopped_sweep` only."""

    sweep: Optional[tuple] = None
    before: tuple = (None, None)  # sweep.json before this command, the resumed parent's status before it


def end_stopped_sweep(signame: str, failed: Optional[str] = None) -> Optional[Path]:
    """A sweep stopped by ``signame`` (Ctrl-C, SIGTERM) before its end: its parent run and every point's run
    still RUNNING end KILLED; with ``failed`` (the one line of what ended it instead) they end FAILED with it.
    The sweep folder, or None when no sweep was running here."""
    running, _Running.sweep = _Running.sweep, None
    if running is None:
        return None
    uri, run_id, sweep_folder = running
    why, status = (failed, "FAILED") if failed else (f"stopped by {signame}", "KILLED")
    if run_id is None:  # the parent is kept in the folder (the store was away): its ending waits there too
        with contextlib.suppress(OSError):
            run_files.update_json(sweep_folder / PARENT_DIR / run_files.DELIVERED,
                                  final={"status": status, "error": why})
        return sweep_folder
    try:
        store = client(uri)
        children = store.search_runs([store.get_run(run_id).info.experiment_id],
                                     f"tags.mlflow.parentRunId = '{run_id}' and attributes.status = 'RUNNING'")
        for child in children:
            end_run(uri, child.info.run_id, status, why)
        end_run(uri, run_id, status, why)
    except Exception as exc:  # noqa: BLE001 - the store may be the reason; the folder keeps every point's status
        print(f"[runner] warning: the sweep's runs could not be marked {status} ({exc})", file=sys.stderr, flush=True)
    return sweep_folder


def undo_start(line: str) -> None:
    """A sweep refused before any point ran: a resumed one's ``sweep.json`` and parent as they were, else FAILED."""
    (before, status), running = _Running.before, _Running.sweep
    if running is None or before is None or status is None:
        end_stopped_sweep("", failed=line)
        return
    (uri, run_id, sweep_folder), _Running.sweep = running, None
    # a later resume runs the sweep's command, not the refused one
    run_files.write_json(sweep_folder / SWEEP_FILE, before)
    with contextlib.suppress(Exception):  # the store away: the parent stays RUNNING until a later end or sync
        client(uri).update_run(run_id, status=status)


def _resumable_parent(uri: str, experiment: str, sweep_folder: Path) -> Optional[str]:
    """The parent run of an earlier sweep in ``sweep_folder`` (same store and experiment; one it kept while the store
    was away is created now, or found where a sync made it), set RUNNING again; None for a new sweep."""
    path = sweep_folder / SWEEP_FILE
    run_id = sweep_info(str(sweep_folder)).get("parent_run_id") or kept_parent(sweep_folder, uri)
    if not run_id and path.exists():  # sweep.json cut short or garbled: the store knows the folder's parent
        try:
            found = client(uri).search_runs([experiment], f"tags.`runner.kind` = 'sweep' and "
                                            f"tags.`runner.sweep_dir` = '{sweep_folder}'", max_results=1,
                                            order_by=["attributes.start_time DESC"])
        except Exception:  # noqa: BLE001 - the store cannot say: a new parent
            found = []
        run_id = found[0].info.run_id if found else None
        print(f"[runner] warning: {path} cannot be read back; "
              + (f"the sweep's parent run {run_id} found in the store by its folder" if run_id else
                 "no parent run of this folder in the store: a new one") + " (it is written again)", flush=True)
    if not run_id:
        return None
    try:
        run = client(uri).get_run(run_id)
    except Exception:  # noqa: BLE001 - another store (or the run was deleted): a new parent
        return None
    if run.info.experiment_id != experiment or run.info.lifecycle_stage != "active":
        return None
    _Running.before = (_Running.before[0], run.info.status)
    client(uri).update_run(run_id, status="RUNNING")
    return run_id


def end_failed_sweep(line: str, sweep_folder: Path) -> str:
    """A sweep that cannot go on (a full disk): its runs end FAILED with ``line``; the line with where the
    points answered so far are and how to resume, for the user."""
    line += (f"; the points answered so far are kept in {sweep_folder}: resume with python -m runner resume "
             f"{sweep_folder}")
    end_stopped_sweep("", failed=line)
    return line


def stopped_line(sweep_folder: Path, points: List[PointOutcome]) -> str:
    """The last line of a sweep stopped by ``sweep.max_failures``: its failures, their common reason when they
    share one, the points stopped or never run, and the command that runs the rest."""
    failed = sweep_stop.failed_points(sweep_folder)
    reasons = {re.sub(r"rank \d+( on node \d+)? failed: ", "", str(f["error"])) for f in failed}  # any rank's
    common = f", all with: {reasons.pop()}" if len(reasons) == 1 and len(failed) > 1 else (
        f": {failed[0]['error']}" if len(failed) == 1 else "")
    stopped = [p for p in points if p.status == "KILLED"]
    rest = [d for d in range(len(points), int((sweep_info(str(sweep_folder)).get("points") or len(points))))]
    return (f"the sweep stopped after {len(failed)} failed point(s) (jobs {', '.join(str(f['job']) for f in failed)})"
            f"{common}; {len(stopped) + len(rest)} point(s) stopped or not run; fix the cause, then run the rest: "
            f"python -m runner resume {sweep_folder}")


class SweepParentRun(Callback):
    """Hydra callback: one MLflow parent run per multirun; each job's run becomes its child."""

    def __init__(self) -> None:
        self._run_id: Optional[str] = None
        self._kept = False  # the parent is kept in the sweep folder (the store was away as the sweep began)
        self._uri = ""
        self._experiment_id = ""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._uri, _Running.before = tracking_uri(config.tracking.uri), (None, None)
        sweep_folder = Path(config.hydra.sweep.dir)
        sweep_folder.mkdir(parents=True, exist_ok=True)
        try:  # one owner at a time: a second run or resume of this folder is refused here, before it runs a point
            note = hold(sweep_folder)
        except FolderBusy as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        if note:
            print(note, flush=True)
        warm_pool(config.hydra.launcher, MODES[config.mode].warm_imports)  # the pool ends with this process
        sweep_stop.clear(sweep_folder)  # a resumed sweep counts its failures anew
        swept = swept_params(config)
        overrides = " ".join(config.hydra.overrides.task)
        tags = {"runner.kind": "sweep", "runner.overrides": overrides or "(none)",
                "runner.sweep_dir": str(sweep_folder),
                "runner.swept": ",".join(swept), **new_record()}  # the parent is found by it where an answer was lost
        params = {f"sweep.{k}": ",".join(v)[:6000] for k, v in swept.items()}
        try:
            self._open_parent(config, sweep_folder, swept, tags, params)
        except Exception as exc:  # noqa: BLE001 - the store away: the parent is kept in the sweep folder instead
            if not isinstance(exc, TrackingError) and not is_outage(self._uri, exc):
                raise
            self._keep_parent(config, sweep_folder, sweep_name(list(swept), sweep_folder), tags, params, exc)
        grid = sweeper_of(str(OmegaConf.select(config, "hydra.sweeper._target_", default=""))).grid
        paired = paired_keys(config)
        _Running.before = (run_files.read_json(sweep_folder / SWEEP_FILE), _Running.before[1])
        run_files.write_json(sweep_folder / SWEEP_FILE, {  # read by each point's driver, and by a resume
            "parent_run_id": self._run_id, "swept": list(swept), "overrides": list(config.hydra.overrides.task),
            "command": [a for a in sys.argv[1:] if a not in {f"hydra.sweeper._target_={own}"
                                                             for own in RUNNER_SWEEPERS.values()}],
            "points": grid_size(swept, paired) if grid else None, "started": time.time(), "paired": paired})
        _Running.sweep = (self._uri, self._run_id, sweep_folder)  # run id None: the parent is kept in the folder

    def _open_parent(self, config: DictConfig, sweep_folder: Path, swept: Dict[str, List[str]], tags: Dict[str, str],
                     params: Dict[str, str]) -> None:
        """The parent run in the store: a new one, or the resumed sweep's."""
        check_store(self._uri)
        self._experiment_id = experiment_id(self._uri, config.tracking.experiment)
        self._run_id = _resumable_parent(self._uri, self._experiment_id, sweep_folder)
        if self._run_id is None:
            self._run_id = start_run(self._uri, config.tracking.experiment, sweep_name(list(swept), sweep_folder),
                                     None, tags)
            print(f"[runner] sweep parent MLflow run {self._run_id} ({sweep_folder})", flush=True)
        else:
            print(f"[runner] sweep resumed in {sweep_folder}: parent MLflow run {self._run_id} goes on; points "
                  "finished before with the same config are kept", flush=True)
        logged = client(self._uri).get_run(self._run_id).data.params
        log_params(self._uri, self._run_id, {k: v for k, v in params.items() if k not in logged})

    def _keep_parent(self, config: DictConfig, sweep_folder: Path, name: str, tags: Dict[str, str],
                     params: Dict[str, str], exc: BaseException) -> None:
        """The store is away as the sweep starts: the parent run is kept in ``<sweep>/parent/`` (what it is to be
        created with, its params in its event log), as a point keeps its run; ``runner sync <sweep>`` creates it
        and makes every point's run its child."""
        folder = sweep_folder / PARENT_DIR
        folder.mkdir(exist_ok=True)
        info = run_files.read_json(folder / run_files.RUN_INFO)
        if not (isinstance(info, dict) and info.get("pending")):  # a resumed sweep keeps its parent's record
            pending = {"experiment": config.tracking.experiment, "name": name,
                       "tags": creation_tags(name, None, tags)}
            run_files.write_json(folder / run_files.RUN_INFO,
                                 {"tracking_uri": self._uri, "run_id": None, "pending": pending})
            log = EventLog(folder / run_files.EVENTS)
            log.params(params)
            log.close()
        self._run_id, self._kept = None, True
        print(f"[runner] tracking store {self._uri} unreachable ({outage_reason(exc)}): the sweep goes on; its parent "
              f"run and its points' runs are kept in {sweep_folder} for python -m runner sync {sweep_folder}",
              flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        end_pool()  # every point has answered
        _Running.sweep = None
        if not self._run_id and not self._kept:
            return
        sweep_folder = Path(config.hydra.sweep.dir)
        # the parent's last reports go through its own event log (sweep_folder/parent/): a store away now keeps them
        folder = sweep_folder / PARENT_DIR
        folder.mkdir(exist_ok=True)
        if self._run_id:
            run_files.write_json(folder / run_files.RUN_INFO, {"tracking_uri": self._uri, "run_id": self._run_id})
        log = EventLog(folder / run_files.EVENTS)
        log.artifacts([p for p in [sweep_folder / "multirun.yaml"] if p.exists()], None)
        found = self._report(sweep_folder, log)
        points = outcomes(sweep_folder)
        failed = [p for p in points if p.status != "FINISHED"]
        lines = [f"job {p.job}: {p.status.lower()}: {p.error or 'no reason recorded'}" for p in failed]
        log.metrics({"sweep/points": len(points), "sweep/failed_points": len(failed), **found.get("metrics", {})}, 0)
        scheduler = run_files.read_json(sweep_folder / run_files.SCHEDULER) or {}
        tags = {**found.get("tags", {}), **({"runner.scheduler": scheduler["scheduler"],
                                              f"runner.{scheduler['scheduler']}_job_ids":
                                                  ",".join(scheduler.get("job_ids", []))}
                                             if scheduler.get("scheduler") else {})}
        if tags:
            log.tags(tags)
        log.close()
        with taking_turns(folder):  # a runner sync of this sweep may be delivering the parent's reports now
            pump = EventPump(folder / run_files.EVENTS, self._uri, self._run_id) if self._run_id else None
            ended = end_or_keep(folder, pump, self._uri, self._run_id, "FAILED" if failed else "FINISHED",
                                "; ".join(lines) or None, say=False)
        kept = kept_runs(sweep_folder)
        if kept or not ended:
            jobs = ", ".join(d.name for d in kept if d.name != PARENT_DIR)
            print(f"[runner] tracking pending: the store {self._uri} was unreachable; the runs of "
                  f"{len([d for d in kept if d.name != PARENT_DIR])} point(s) (jobs {jobs or 'none'})"
                  f"{'' if ended else ' and the sweep parent'} are kept in {sweep_folder}; deliver them with: "
                  f"python -m runner sync {sweep_folder}", flush=True)
        elif found.get("run_ids"):
            print(f"[runner] sweep done: {len(points)} points; compare them: "
                  f"{compare_url(self._uri, self._experiment_id, found['run_ids'])}", flush=True)
        if failed and sweep_stop.stop_reason(sweep_folder):
            print(f"error: {stopped_line(sweep_folder, points)}", file=sys.stderr, flush=True)
            raise SystemExit(1)
        if failed:
            print(f"error: {len(failed)} of {len(points)} job(s) failed:\n  " + "\n  ".join(lines), file=sys.stderr,
                  flush=True)
            raise SystemExit(1)

    def _report(self, sweep_folder: Path, log: EventLog) -> Dict[str, Any]:
        """Write the report and add it to the parent's reports; what it found (metrics and tags for the parent)."""
        try:
            report, found = write_sweep_report(sweep_folder)
        except Exception as exc:  # a report problem must not hide the sweep's own outcome
            print(f"[runner] warning: sweep report failed: {type(exc).__name__}: {exc}", flush=True)
            return {}
        if report is not None:
            log.artifacts(sorted(report.iterdir()), "report")
            print(f"[runner] sweep report: {report / 'report.md'}", flush=True)
        return found
