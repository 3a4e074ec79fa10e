"""A run's last words when the store may be away: end it, or keep its ending for ``python -m runner sync``.

When the tracking store is unreachable at the end of a job, the job still ends as training decided (its
exit code, ``status.json``); what the store lacks stays in the run folder: the undelivered lines of
``events.jsonl`` (with their original steps and times) and, in ``delivered.json``, the final status.
``python -m runner sync <run or sweep folder> ...`` delivers them later, in order, and ends the run. A sweep's
point run that no run folder names (its job ended between the store creating it and the folder recording it) is
ended KILLED by the sweep's sync: no one else could end it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from runner.config.errors import TrackingError, disk_full
from runner.runtime import run_files
from runner.runtime.folder_lock import taking_turns
from runner.track.events import EventPump
from runner.track.store import RECORD_TAG, adopt_record, client, create_once, end_run, experiment_id, outage_reason
from runner.track.sweep_points import SWEEP_FILE

PARENT_DIR = "parent"  # a sweep folder's record of its parent run's last reports (a run folder of its own)
PARENT_TAG = "mlflow.parentRunId"


def kept_runs(sweep_folder: Path) -> List[Path]:
    """The run folders of a sweep (its points', its parent's) whose run the store does not wholly have: created
    or ended while it was away, kept for ``python -m runner sync``."""
    kept = []
    for run_folder in [*_with_earlier(run_files.point_dirs(sweep_folder)), sweep_folder / PARENT_DIR]:
        info = run_files.read_json(run_folder / run_files.RUN_INFO)
        state = run_files.read_json(run_folder / run_files.DELIVERED)
        if isinstance(info, dict) and info.get("pending") or isinstance(state, dict) and state.get("final"):
            kept.append(run_folder)
    return kept


def _with_earlier(run_folders: List[Path]) -> List[Path]:
    """``run_folders`` each after its earlier jobs' folders (an attempt that failed and ran again, a point run again by
    a resume): a job that ended while the store was away keeps its ending there, moved aside with its files."""
    return [d for run_folder in run_folders for d in (*run_files.earlier_jobs(run_folder), run_folder)]


def open_kept(run_folder: Path, uri: str, pending: Mapping[str, Any], parent: Optional[str] = None) -> str:
    """Create the MLflow run of a job that began while the store was away (``run.json``'s ``pending`` record:
    experiment, name, tags; ``parent``: the sweep's parent run, where the record has none), or find it where an
    earlier try created it; ``run.json`` then names it."""
    experiment = experiment_id(uri, pending["experiment"])
    # the record's run where a try made it (the job's own, its answer lost as the store went; an earlier sync's)
    found = adopt_record(uri, experiment, pending["tags"][RECORD_TAG])
    tags = dict(pending["tags"])
    if parent and PARENT_TAG not in tags:
        tags[PARENT_TAG] = parent
    run_id = found if found else create_once(uri, experiment, tags, pending["name"])
    if found and parent and PARENT_TAG not in pending["tags"]:
        client(uri).set_tag(found, PARENT_TAG, parent)
    run_files.update_json(run_folder / run_files.RUN_INFO, run_id=run_id, pending=None)
    return run_id


def end_or_keep(run_folder: Path, pump: Optional[EventPump], uri: str, run_id: Optional[str], status: str,
                error: Optional[str] = None, say: bool = True) -> bool:
    """Deliver what is left and end the run with ``status``; if the store is unreachable (or the run is
    still to be created: ``run_id`` None), keep the ending in the run folder and say how to deliver it. True
    when the store has the whole run."""
    if run_id is not None and (pump is None or _deliver_but_full(pump)):
        try:
            end_run(uri, run_id, status, error)
            run_files.update_json(run_folder / run_files.DELIVERED, final=None, ended=status)
            return True
        except Exception as exc:  # noqa: BLE001 - the store went away between the two calls
            if disk_full(exc):  # the run folder's disk (delivered.json), not the store: the run did end
                return True
            if pump is not None:
                pump.went_down(exc)
    try:
        run_files.update_json(run_folder / run_files.DELIVERED, final={"status": status, "error": error})
    except OSError as exc:  # a full run folder: what could not be kept is said with the job's line
        if not disk_full(exc):
            raise
    kept = (pump or EventPump(run_folder / run_files.EVENTS, uri, "", say=lambda line: None)).pending()
    if say:
        print(f"[runner] tracking pending: the store {uri} is unreachable; {kept} reports and the final status "
              f"({status}) are kept in {run_folder}; deliver them with: python -m runner sync {run_folder}", flush=True)
    return False


def _deliver_but_full(pump: EventPump) -> bool:
    """Deliver what is left; on a full disk (the artifact store's) say what stays in the run folder and go on to
    end the run (True): the job's own error names the full path."""
    try:
        return pump()
    except OSError as exc:
        full = disk_full(exc)
        if not full:
            raise
        print(f"[runner] warning: disk full: {full}; {pump.pending()} reports not delivered stay in {pump.path}",
              flush=True)
        return True


def _sync_one(run_folder: Path, quiet: bool = False, parent: Optional[str] = None,
              say: Callable[[str], None] = print) -> Optional[str]:
    """Deliver one run folder's kept reports and ending; the one-line reason when it cannot. ``quiet``: say
    nothing of a run that had nothing kept; ``parent``: the sweep's parent run, which the run becomes a child of
    where it has no parent yet (the sweep began while the store was away). Taking turns with any other process
    delivering the folder (another sync, the live job, a resume): everything is read again once it is this one's
    turn, so what the other delivered (the run it created, the offset it reached) is not delivered twice."""
    if not (run_folder / run_files.RUN_INFO).exists():
        return f"{run_folder}: not a run folder of the runner (no {run_files.RUN_INFO})"
    with taking_turns(run_folder, say=say):
        return _deliver_kept(run_folder, quiet, parent)


def _deliver_kept(run_folder: Path, quiet: bool, parent: Optional[str]) -> Optional[str]:
    """:func:`_sync_one`'s work, in the folder's turn."""
    path = run_folder / run_files.RUN_INFO
    info = run_files.read_json(path)
    pending = info.get("pending") if isinstance(info, dict) else None
    named = isinstance(info, dict) and (isinstance(info.get("run_id"), str) and info["run_id"] or not info.get("run_id")
                                        and isinstance(pending, dict))  # an id of another type is no MLflow run's
    if not (named and isinstance(info, dict) and isinstance(info.get("tracking_uri"), str)):
        return (f"{path} cannot be read back (cut short, emptied or garbled), so the MLflow run it names is unknown; "
                f"the run's reports stay in {run_folder / run_files.EVENTS}")
    final = _final(run_folder)
    uri, run_id = info["tracking_uri"], info.get("run_id")
    created = not run_id
    try:
        if created:
            assert pending is not None  # no run id: the record of the run kept while the store was away
            run_id = open_kept(run_folder, uri, pending, parent)
        else:
            run = client(uri).get_run(str(run_id))
            if run.info.lifecycle_stage == "deleted":  # e.g. a point's earlier run, replaced when it ran again
                # nothing kept for the store any more
                run_files.update_json(run_folder / run_files.DELIVERED, final=None)
                print(f"[runner] synced {run_folder}: its MLflow run {run_id} was deleted (a point run again by a "
                      "resume replaces its earlier run): nothing delivered", flush=True)
                return None
            if parent and PARENT_TAG not in run.data.tags:  # created while the sweep ran, before its parent existed
                client(uri).set_tag(str(run_id), PARENT_TAG, parent)
    except Exception as exc:  # noqa: BLE001
        return (f"{run_folder}: the store {uri} is still unreachable ({outage_reason(exc)}); nothing is lost, "
                "run sync again later")
    pump = EventPump(run_folder / run_files.EVENTS, uri, str(run_id), say=lambda line: None, warn=print)
    before = pump.pending()
    if not pump():
        return (f"{run_folder}: the store {uri} is still unreachable ({pump.down}); nothing is lost, run sync again "
                "later")
    if final:
        try:
            end_run(uri, run_id, final["status"], final.get("error"))
        except Exception as exc:  # noqa: BLE001
            return f"{run_folder}: the store {uri} refused the final status ({outage_reason(exc)})"
        run_files.update_json(run_folder / run_files.DELIVERED, final=None, ended=final["status"])
    lost = None if final else _end_lost(run_folder, uri, str(run_id))
    if lost is not None and lost.startswith(str(run_folder)):
        return lost  # the store refused
    ended = f", ended {final['status']}" if final else f", ended KILLED: {lost}" if lost else ""
    if before or final or created or lost or not quiet:
        print(f"[runner] synced {run_folder}: {before} reports delivered to MLflow run {run_id}"
              f"{' (created now)' if created else ''}{ended}", flush=True)
    return None


def _final(run_folder: Path) -> Optional[Dict[str, Any]]:
    """The ending kept for the store (``delivered.json``'s ``final``: a status a job ends with, its error a line or
    None); where that record cannot be read back, the job's own (``status.json``), so that the run is not left
    RUNNING; None where there is none to deliver."""
    def ending(found: Any) -> bool:
        return isinstance(found, dict) and found.get("status") in ("FINISHED", "FAILED", "KILLED") and isinstance(
            found.get("error"), (str, type(None)))
    state = run_files.read_json(run_folder / run_files.DELIVERED)
    if isinstance(state, dict) and state and set(state) <= {"offset", "final", "ended"} and (
            state.get("final") is None or ending(state["final"])):
        return state.get("final")
    if not (run_folder / run_files.DELIVERED).exists():
        return None
    # the delivery record is damaged (a warning says so): the job's own record
    status = run_files.read_status(run_folder)
    return {"status": status["status"], "error": status.get("error")} if status is not None and ending(status) \
        else None


LOST_TAG = "runner.driver_lost"


def end_if_lost(run_folder: Path) -> Optional[str]:
    """The line saying that the job of ``run_folder`` (an earlier job's files, set aside for a new job in the same
    folder) was lost and its run ended KILLED now; None where it was not lost, or the store cannot say."""
    info = run_files.read_json(run_folder / run_files.RUN_INFO)
    if not (isinstance(info, dict) and isinstance(info.get("tracking_uri"), str) and info.get("run_id")):
        return None
    state = run_files.read_json(run_folder / run_files.DELIVERED)
    if isinstance(state, dict) and state.get("final"):
        return None  # it ended; the store was away: runner sync delivers that ending
    why = _end_lost(run_folder, info["tracking_uri"], str(info["run_id"]))
    if why is None or why.startswith(str(run_folder)):
        return None
    return f"[runner] the earlier job in this run folder was lost ({why}): its MLflow run {info['run_id']} ended KILLED"


def _end_lost(run_folder: Path, uri: str, run_id: str) -> Optional[str]:
    """A run the store has as RUNNING whose driver was killed outright (:func:`run_files.driver_gone`): ended KILLED,
    tagged with why and when it was last heard from, ``status.json`` written; the words, or None where the run is
    not such a one. A line starting with the folder where the store refused."""
    if run_files.read_status(run_folder) is not None:
        return None  # the job recorded how it ended: its driver was not killed outright
    why = run_files.driver_gone(run_folder)
    if why is None:
        return None
    try:
        if client(uri).get_run(run_id).info.status != "RUNNING":
            return None
        _end_as_lost(uri, run_id, why)
    except Exception as exc:  # noqa: BLE001
        return f"{run_folder}: the store {uri} refused the ending of a lost job ({outage_reason(exc)})"
    run_files.write_status(run_folder, "KILLED", f"the job was lost: {why}")
    return why


def _end_as_lost(uri: str, run_id: str, why: str) -> None:
    """End ``run_id`` KILLED as a lost job's run, tagged with ``why``."""
    client(uri).set_tag(run_id, LOST_TAG, why)
    end_run(uri, run_id, "KILLED", f"the job was lost: {why}")


def _sweep_parent(sweep_folder: Path, say: Callable[[str], None] = print) -> Tuple[Optional[str], Optional[str]]:
    """The sweep's parent run id, created now where the sweep kept it (the store was away as it began) and
    written into ``sweep.json`` (for a resume); (None, the reason) where the store still cannot be reached
    (the points' runs then wait too: they are to be its children)."""
    folder = sweep_folder / PARENT_DIR
    with taking_turns(folder, say=say):  # two syncs at once: one creates the parent, the other finds it
        info = run_files.read_json(folder / run_files.RUN_INFO)
        if not isinstance(info, dict) or not isinstance(info.get("tracking_uri"), str):
            return None, None  # said by the parent folder's own sync
        if info.get("run_id"):
            return str(info["run_id"]), None
        if not info.get("pending"):
            return None, None
        try:
            run_id = open_kept(folder, info["tracking_uri"], info["pending"])
        except Exception as exc:  # noqa: BLE001
            return None, (f"{sweep_folder}: the store {info['tracking_uri']} is still unreachable "
                          f"({outage_reason(exc)}); nothing is lost, run sync again later")
        sweep_file = sweep_folder / SWEEP_FILE
        found = run_files.read_json(sweep_file)
        if isinstance(found, dict):
            run_files.write_json(sweep_file, {**found, "parent_run_id": run_id})
        return run_id, None


def kept_parent(sweep_folder: Path, uri: str) -> Optional[str]:
    """A resumed sweep's parent run where the sweep kept it in ``<sweep>/parent/`` (the store was away as it began):
    created now in the parent folder's turn, or found where a ``runner sync`` created it meanwhile (``sweep.json``
    may not name it yet), so that a resume and a sync at once make one parent. None where no parent of ``uri``'s
    store is kept; :class:`TrackingError` where the store cannot create it."""
    info = run_files.read_json(sweep_folder / PARENT_DIR / run_files.RUN_INFO)
    if not (isinstance(info, dict) and info.get("tracking_uri") == uri):
        return None
    run_id, error = _sweep_parent(sweep_folder)
    if error:
        raise TrackingError(error)
    return run_id


UNNAMED_AFTER_S = 10.0  # a point run no run folder names this long after it began: its job is gone (a live job
# names its run in run.json within milliseconds of creating it)


def end_unnamed(sweep_folder: Path, run_folders: List[Path], parent: str) -> List[str]:
    """End KILLED each point run of the sweep's ``parent`` still RUNNING that no run folder names, by id or by the
    record it keeps for later (its job was ended between the store creating the run and ``run.json`` naming it, so
    nothing would ever end it); their ids. Runs younger than :data:`UNNAMED_AFTER_S` are left to their jobs."""
    info = run_files.read_json(sweep_folder / PARENT_DIR / run_files.RUN_INFO)
    if not (isinstance(info, dict) and isinstance(info.get("tracking_uri"), str)):
        return []
    uri, named, records = info["tracking_uri"], set(), set()
    for run_folder in run_folders:
        found = run_files.read_json(run_folder / run_files.RUN_INFO)
        if isinstance(found, dict):
            named.add(found.get("run_id"))
            pending = found.get("pending")
            if isinstance(pending, dict):
                records.add((pending.get("tags") or {}).get(RECORD_TAG))
    store = client(uri)
    running = store.search_runs([store.get_run(parent).info.experiment_id],
                                f"tags.`{PARENT_TAG}` = '{parent}' and attributes.status = 'RUNNING'", max_results=1000)
    ended = []
    for run in running:
        if (run.info.run_id in named or run.data.tags.get(RECORD_TAG) in records
                or time.time() * 1000 - run.info.start_time < UNNAMED_AFTER_S * 1000):
            continue
        _end_as_lost(uri, run.info.run_id, "no run folder names this run: its job ended between the store creating "
                     "it and the folder recording it")
        ended.append(run.info.run_id)
    return ended


def sync(args: List[str]) -> int:
    """``python -m runner sync <run or sweep folder> ...``: exit 0 when every run is complete in its store."""
    if not args or any(a.startswith("-") for a in args):
        print("usage: python -m runner sync <run folder or sweep folder> ...", file=sys.stderr)
        return 2
    failed = 0
    said: List[str] = []

    def say_once(line: str) -> None:  # one line however many of the sweep's folders the other process holds
        if not said:
            said.append(line)
            print(line, flush=True)

    for arg in args:
        folder = Path(arg).resolve()
        runs = _with_earlier([folder] if (folder / run_files.RUN_INFO).exists() else run_files.point_dirs(folder))
        parent = None
        if runs and (folder / PARENT_DIR / run_files.RUN_INFO).exists():  # a sweep: its parent's last reports too
            runs.append(folder / PARENT_DIR)
            parent, error = _sweep_parent(folder, say_once)  # first: its points' runs become its children
            if error:  # the store is still away: said once for the sweep
                print(f"error: {error}", file=sys.stderr, flush=True)
                failed += 1
                continue
        errors = [e for e in (_sync_one(run_folder, len(runs) > 1, parent if run_folder.name != PARENT_DIR else None,
                                        say_once) for run_folder in runs or [folder]) if e]
        for error in errors:
            print(f"error: {error}", file=sys.stderr, flush=True)
        if parent and not errors:  # every folder's run known: a point run none names is its lost job's
            try:
                for run_id in end_unnamed(folder, runs, parent):
                    print(f"[runner] synced {folder}: MLflow run {run_id}, which no run folder names (its job ended "
                          "as the store created it), ended KILLED", flush=True)
            except Exception as exc:  # noqa: BLE001 - the store went away meanwhile: a later sync ends them
                print(f"error: {folder}: the store refused the ending of runs no run folder names "
                      f"({outage_reason(exc)})", file=sys.stderr, flush=True)
                failed += 1
        if len(runs) > 1:
            print(f"[runner] synced {folder}: {len(runs) - len(errors)} of {len(runs)} runs complete in the store",
                  flush=True)
        failed += len(errors)
    return 1 if failed else 0
