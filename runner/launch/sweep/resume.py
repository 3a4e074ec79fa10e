"""Resuming a sweep: only the points without a finished answer run again, under the same parent run.

``python -m runner resume <sweep folder>`` runs the sweep's command again with its ``hydra.sweep.dir`` (as
re-running the same command with that folder does). Each point keeps its job number and folder; a point
whose folder holds a FINISHED job (a trained run, or a plan-only answer: a plan or "no plan fits") of the
same config (its ``answer`` keys, :mod:`runner.config.roles`), recorded in this sweep's store and
experiment, is kept and not run; failed, killed and never-started points run, their earlier run
replaced. The sweep's parent MLflow run goes on (:class:`runner.launch.sweep.parent.SweepParentRun`) and its
summary and report cover every point. A command whose overrides differ from the folder's sweep is refused,
naming the keys, unless ``sweep.resume_changed=true``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from runner.config import roles
from runner.config.modes import MODES
from runner.plan import hashed
from runner.runtime import run_files
from runner.track import store
from runner.track.sweep_points import SWEEP_FILE, sweep_info

if TYPE_CHECKING:
    from mlflow.entities import Run

    from runner.config.schema import ClusterSchema, TrackingSchema
    from runner.track.mlflow_run import DriverRun

ENDINGS = ("FINISHED", "FAILED", "KILLED")  # what status.json says of a job that ended (run_files.write_status)


def _task(overrides: List[str]) -> Dict[str, str]:
    """Task overrides as key -> value: only keys that can change an answer (:mod:`runner.config.roles`; Hydra's
    own ``hydra.*`` and ``hydra/...`` left out)."""
    pairs = [(key.lstrip("+~"), value) for key, _, value in (text.partition("=") for text in overrides)]
    return {key: value for key, value in pairs
            if not (key.startswith(("hydra.", "hydra/")) or key == "hydra" or roles.role(key) != roles.ANSWER)}


def changed_overrides(before: List[str], now: List[str]) -> List[str]:
    """``key: before -> now`` for each task override that differs between two commands."""
    a, b = _task(before), _task(now)
    return [f"{k}: {a.get(k, '(not set)')} -> {b.get(k, '(not set)')}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


def check_resume(sweep_folder: Path, overrides: List[str], allow_changed: bool) -> Optional[str]:
    """The one-line refusal when ``sweep_folder`` holds a sweep of other overrides (None: a new folder, the same
    command, or ``sweep.resume_changed=true``)."""
    info = run_files.read_json(sweep_folder / SWEEP_FILE) or {}
    if "overrides" not in info or allow_changed:
        return None
    changed = changed_overrides(info["overrides"], overrides)
    if not changed:
        return None
    return (f"hydra.sweep.dir={sweep_folder} holds a sweep of another command ({'; '.join(changed)}): use a new "
            "hydra.sweep.dir, or sweep.resume_changed=true to resume it with these values (points finished with "
            "another config run again)")


def kept_point(now: Dict[str, Any], tracking: TrackingSchema, run_folder: Path) -> Optional[Dict[str, Any]]:
    """The status of a finished job in ``run_folder`` of the same config as ``now`` (a job's config, resolved:
    :func:`runner.config.roles.answer`) whose run is recorded where it records (``tracking``: the same store and
    experiment, as ``sweep.reuse`` asks): the point is kept, not run. None when the point must run."""
    import yaml

    status = run_files.read_status(run_folder)
    if (run_folder / run_files.STATUS).exists() and not (isinstance(status, dict) and status.get("status") in ENDINGS):
        return _runs_again(run_folder / run_files.STATUS)  # a record of no ending, or of one no job writes
    if not status or status.get("status") != "FINISHED" or not (run_folder / run_files.RESOLVED).exists():
        return None
    results = run_folder / run_files.RESULTS
    if results.exists() and not isinstance(run_files.read_json(results), dict):
        return _runs_again(run_folder / run_files.RESULTS)
    try:
        before = yaml.safe_load((run_folder / run_files.RESOLVED).read_text())
    except (OSError, ValueError, yaml.YAMLError):  # a byte that is not UTF-8 is a ValueError
        return _runs_again(run_folder / run_files.RESOLVED)
    if not isinstance(before, dict) or set(now) - set(before):  # not a config, or cut short (sections missing)
        return _runs_again(run_folder / run_files.RESOLVED)
    if roles.answer(before) != roles.answer(now):
        return None
    info = run_files.read_json(run_folder / run_files.RUN_INFO)
    if (run_folder / run_files.RUN_INFO).exists() and not (isinstance(info, dict)
                                                     and isinstance(info.get("tracking_uri"), str)):
        return _runs_again(run_folder / run_files.RUN_INFO)  # where its run is recorded is unknown
    place = _recorded_at(before, info or {})
    if place != (tracking.experiment, store.tracking_uri(tracking.uri)):
        print(f"[runner] job {run_folder.name}: it finished with the same config, but its run is recorded in "
              f"experiment {place[0]!r} of {place[1]}; this sweep records in experiment {tracking.experiment!r} "
              f"of {store.tracking_uri(tracking.uri)}: it runs again", flush=True)
        return None
    return status


def _recorded_at(config: Dict[str, Any], run_info: Any) -> Tuple[Any, Any]:
    """``(experiment, tracking URI)`` where a finished point's run is recorded (its ``run.json`` says the URI)."""
    tracking = config.get("tracking") or {}
    uri = run_info.get("tracking_uri") if isinstance(run_info, dict) else None
    return tracking.get("experiment"), uri or store.tracking_uri(tracking.get("uri"))


def _runs_again(path: Path) -> Optional[Dict[str, Any]]:
    """A finished point whose record cannot be read back (cut short, emptied, garbled) is not kept: said."""
    print(f"[runner] warning: {path} cannot be read back; the point runs again", flush=True)
    return None


def _sweep_parent_in_store() -> bool:
    """Whether this point's sweep began with its store there (its parent run is in it), or this is no sweep."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return True
    sweep_folder = HydraConfig.get().sweep.dir
    return not sweep_folder or bool(sweep_info(sweep_folder).get("parent_run_id"))


def reuse_asked(mode: str, reuse: Optional[bool]) -> bool:
    """Whether ``sweep.reuse`` (``reuse``) is on for a job of ``mode`` (null: plan-only jobs)."""
    return MODES[mode].reuses if reuse is None else bool(reuse)


def reusable(digest: str, tracking: TrackingSchema) -> Optional[Any]:
    """A FINISHED run of a config of hash ``digest`` (tag ``runner.config_hash``: :func:`config_digest`) in the store
    and experiment ``tracking`` names (where :func:`reuse_asked`)."""
    uri = store.tracking_uri(tracking.uri)
    try:
        found = finished_runs_of(store.client(uri), digest, tracking.experiment)
    except Exception as exc:
        if not store.is_outage(uri, exc):
            raise
        if _sweep_parent_in_store():  # else the sweep said once, as it began, that its store is away
            print(f"[runner] tracking store {uri} unreachable ({store.outage_reason(exc)}): no earlier run can answer "
                  "this point (sweep.reuse); it runs", flush=True)
        return None
    return found[0] if found else None


def config_digest(cluster: ClusterSchema, mode: str, resolved: Dict[str, Any]) -> str:
    """A job's config hash (tag ``runner.config_hash``), from its config resolved (``resolved``; ``cluster`` and
    ``mode`` its own, for the calibration a plan-only job plans with)."""
    return roles.config_hash(hashed(cluster, mode, resolved))


def finished_runs_of(client: Any, digest: str, experiment_name: str) -> List[Any]:
    """The newest FINISHED run of the config of hash ``digest`` (:func:`config_digest`) in ``client``'s store and
    experiment ``experiment_name``, as a list of at most one (empty: none, or no such experiment)."""
    experiment = client.get_experiment_by_name(experiment_name)
    return [] if experiment is None else client.search_runs(
        [experiment.experiment_id], f"tags.`runner.config_hash` = '{digest}' and attributes.status = 'FINISHED'",
        max_results=1)


def link_point(run_folder: Path, earlier: Run, new_run: DriverRun) -> Dict[str, Any]:
    """Answer a sweep's point with ``earlier`` (a FINISHED run of the same config): its results and plan files
    copied into ``run_folder``, and ``new_run`` (the point's child run, opened here) given its metrics and tags,
    ``runner.reused_from`` naming it. The point's results (its run still open)."""
    source = Path(earlier.data.tags.get("runner.run_dir", "/nonexistent"))
    if (source / run_files.PLAN).is_dir():
        shutil.copytree(source / run_files.PLAN, run_folder / run_files.PLAN, dirs_exist_ok=True)
    new_run.open()
    copied = {k: v for k, v in earlier.data.tags.items() if k.startswith("runner.plan") or k in (
        "runner.sharding_types", "runner.world_size", "runner.local_world_size", "runner.nodes", "runner.device")}
    store.set_tags(new_run.uri, new_run.mlflow.run_id, {**copied, "runner.reused_from": earlier.info.run_id})
    if earlier.data.metrics:
        assert new_run.mlflow.run_id is not None  # set_tags above wrote to it
        store.log_step_metrics(new_run.uri, new_run.mlflow.run_id, [(dict(earlier.data.metrics), 0)])
    results = {**(run_files.read_json(source / run_files.RESULTS) or {}), "reused_from": earlier.info.run_id,
               "run_id": new_run.mlflow.run_id, "tracking_uri": new_run.uri}
    run_files.write_json(run_folder / run_files.RESULTS, results)
    return results  # the run is ended with the point's outcome by the driver (launch/job/end.py)


def resume_args(folder: Path, extra: List[str]) -> List[str]:
    """The command line that resumes the sweep in ``folder``: its recorded command, this folder, ``extra``."""
    info = run_files.read_json(folder / SWEEP_FILE)
    texts = [info.get(k, []) for k in ("command", "overrides")] if isinstance(info, dict) else [None]
    if (folder / SWEEP_FILE).exists() and not (isinstance(info, dict) and "command" in info and all(
            isinstance(t, list) and all(isinstance(a, str) for a in t) for t in texts)):  # each an argument's text
        raise ValueError(f"{folder / SWEEP_FILE} cannot be read back (cut short, emptied or garbled), so the sweep's "
                         f"command is lost: run the sweep's command again with hydra.sweep.dir={folder} (points "
                         "that finished with the same config are kept)")
    if not info or "command" not in info:
        raise ValueError(f"{folder} is not a sweep folder the runner can resume (no {SWEEP_FILE} with its command)")
    command = [a for a in info["command"] if not a.startswith("hydra.sweep.dir=")]
    return [*command, f"hydra.sweep.dir={folder}", *extra]


def resume_argv(args: List[str]) -> List[str]:
    """``resume <sweep folder> [key=value ...]`` as the command line that resumes it (usage or error: exit 2)."""
    if not args or args[0].startswith("-"):
        print("usage: python -m runner resume <sweep folder> [key=value ...]", file=sys.stderr)
        raise SystemExit(2)
    folder = Path(args[0]).expanduser().resolve()
    try:
        argv = resume_args(folder, args[1:])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"[runner] resuming the sweep in {folder}: python -m runner {' '.join(argv)}", flush=True)
    return argv
