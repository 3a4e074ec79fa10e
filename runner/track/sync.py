"""A run's last words when the store may be away: end it, or keep its ending for ``python -m runner sync``.

When the tracking store is unreachable at the end of a job, the job still ends as training decided (its
exit code, ``status.json``); what the store lacks stays in the run folder: the undelivered lines of
``events.jsonl`` (with their original steps and times) and, in ``delivered.json``, the final status.
``python -m runner sync <run or sweep folder> ...`` delivers them later, in order, and ends the run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

from runner.runtime import rundir
from runner.track.events import EventPump
from runner.track.store import end_run, outage_reason


def end_or_keep(run_dir: Path, pump: Optional[EventPump], uri: str, run_id: str, status: str,
                error: Optional[str] = None) -> bool:
    """Deliver what is left and end the run with ``status``; if the store is unreachable, keep the
    ending in the run folder and say how to deliver it. True when the store has the whole run."""
    if pump is None or pump():
        try:
            end_run(uri, run_id, status, error)
            rundir.update_json(run_dir / rundir.DELIVERED, final=None, ended=status)
            return True
        except Exception as exc:  # noqa: BLE001 - the store went away between the two calls
            if pump is not None:
                pump.went_down(exc)
    rundir.update_json(run_dir / rundir.DELIVERED, final={"status": status, "error": error})
    kept = pump.pending() if pump is not None else 0
    print(f"[runner] tracking pending: the store {uri} is unreachable; {kept} reports and the final status "
          f"({status}) are kept in {run_dir}; deliver them with: python -m runner sync {run_dir}", flush=True)
    return False


def _sync_one(run_dir: Path) -> Optional[str]:
    """Deliver one run folder's kept reports and ending; the one-line reason when it cannot."""
    path = run_dir / rundir.RUN_INFO
    info = rundir.read_json(path)
    if not path.exists():
        return f"{run_dir}: not a run folder of the runner (no {rundir.RUN_INFO})"
    if not (isinstance(info, dict) and isinstance(info.get("tracking_uri"), str) and info.get("run_id")):
        return (f"{path} cannot be read back (cut short, emptied or garbled), so the MLflow run it names is unknown; "
                f"the run's reports stay in {run_dir / rundir.EVENTS}")
    state = rundir.read_json(run_dir / rundir.DELIVERED)
    state = state if isinstance(state, dict) else {}
    uri, run_id = info["tracking_uri"], info["run_id"]
    pump = EventPump(run_dir / rundir.EVENTS, uri, run_id, say=lambda line: None)
    before = pump.pending()
    final = state.get("final")
    if not pump():
        return f"{run_dir}: the store {uri} is still unreachable ({pump.down}); nothing is lost, run sync again later"
    if final:
        try:
            end_run(uri, run_id, final["status"], final.get("error"))
        except Exception as exc:  # noqa: BLE001
            return f"{run_dir}: the store {uri} refused the final status ({outage_reason(exc)})"
        rundir.update_json(run_dir / rundir.DELIVERED, final=None, ended=final["status"])
    ended = f", ended {final['status']}" if final else ""
    print(f"[runner] synced {run_dir}: {before} reports delivered to MLflow run {run_id}{ended}", flush=True)
    return None


def sync(args: List[str]) -> int:
    """``python -m runner sync <run or sweep folder> ...``: exit 0 when every run is complete in its store."""
    if not args or any(a.startswith("-") for a in args):
        print("usage: python -m runner sync <run folder or sweep folder> ...", file=sys.stderr)
        return 2
    failed = 0
    for arg in args:
        folder = Path(arg).resolve()
        runs = rundir.point_dirs(folder) if not (folder / rundir.RUN_INFO).exists() else [folder]
        for run_dir in runs or [folder]:
            error = _sync_one(run_dir)
            if error:
                print(f"error: {error}", file=sys.stderr, flush=True)
                failed += 1
    return 1 if failed else 0
