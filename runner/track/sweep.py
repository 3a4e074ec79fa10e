"""A Hydra sweep as MLflow sees it: one parent run, each point's run its child, an outcome read from the points.

:class:`SweepParentRun` is the Hydra callback named in ``conf/config.yaml``. When the multirun starts it
creates the parent run and leaves its id in the sweep folder, where each point's driver finds it. When
the multirun ends it reads what every point left in its run folder (``status.json``, whichever launcher
and process ran it), writes the sweep report, and ends the parent FINISHED, or FAILED naming the points
that failed (the command then exits non-zero).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from runner.config import rundir
from runner.track.store import end_run, log_artifacts, start_run, tracking_uri
from runner.track.sweep_report import write_sweep_report

PARENT_RUN_FILE = "mlflow_parent_run_id"


def parent_run_id(sweep_dir: Optional[str]) -> Optional[str]:
    """The sweep's parent run id, written by :class:`SweepParentRun` into the sweep folder."""
    if not sweep_dir:
        return None
    f = Path(sweep_dir) / PARENT_RUN_FILE
    return f.read_text().strip() if f.exists() else None


@dataclass
class PointOutcome:
    job: int
    status: str
    error: Optional[str]


def outcomes(sweep_dir: Path) -> List[PointOutcome]:
    """How each point ended, from its ``status.json``; a point that left none did not end by itself."""
    out = []
    for d in rundir.point_dirs(sweep_dir):
        status = rundir.read_status(d)
        if status is None:
            out.append(PointOutcome(int(d.name), "FAILED", "ended without recording a status (killed?)"))
        else:
            out.append(PointOutcome(int(d.name), status["status"], status.get("error")))
    return out


class SweepParentRun(Callback):
    """Hydra callback: one MLflow parent run per multirun; each job's run becomes its child."""

    def __init__(self) -> None:
        self._run_id: Optional[str] = None
        self._uri = ""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._uri = tracking_uri(config)
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        overrides = " ".join(config.hydra.overrides.task)
        self._run_id = start_run(self._uri, config.tracking.experiment, f"sweep {sweep_dir.name}", None,
                                 {"runner.kind": "sweep", "runner.overrides": overrides,
                                  "runner.sweep_dir": str(sweep_dir)})
        (sweep_dir / PARENT_RUN_FILE).write_text(self._run_id)
        print(f"[runner] sweep parent MLflow run {self._run_id} ({sweep_dir})", flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self._run_id:
            return
        sweep_dir = Path(config.hydra.sweep.dir)
        log_artifacts(self._uri, self._run_id, [p for p in [sweep_dir / "multirun.yaml"] if p.exists()])
        self._report(sweep_dir)
        points = outcomes(sweep_dir)
        failed = [p for p in points if p.status != "FINISHED"]
        lines = [f"job {p.job}: {p.status.lower()}: {p.error or 'no reason recorded'}" for p in failed]
        end_run(self._uri, self._run_id, "FAILED" if failed else "FINISHED", "; ".join(lines) or None)
        if failed:
            print(f"error: {len(failed)} of {len(points)} job(s) failed:\n  " + "\n  ".join(lines), file=sys.stderr,
                  flush=True)
            raise SystemExit(1)

    def _report(self, sweep_dir: Path) -> None:
        try:
            report = write_sweep_report(sweep_dir)
        except Exception as exc:  # a report problem must not hide the sweep's own outcome
            print(f"[runner] warning: sweep report failed: {type(exc).__name__}: {exc}", flush=True)
            return
        if report is not None:
            log_artifacts(self._uri, self._run_id, sorted(report.iterdir()), artifact_path="report")
            print(f"[runner] sweep report: {report / 'report.md'}", flush=True)
