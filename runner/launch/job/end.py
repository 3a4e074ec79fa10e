"""How a job's MLflow run ends: the one module that ends it, whichever process holds the run, from the job's
outcome (:mod:`.outcome`).

The driver (:mod:`.driver`, its run a :class:`runner.track.mlflow_run.DriverRun`) and rank 0 under a plain
torchrun (:mod:`runner.launch.torchrun`, its run a :class:`runner.track.mlflow_run.MlflowRun`) both end a finished
job with :func:`end_finished_run`: the plan's chart (:class:`PlanChart`, the one place it is drawn) as the run's
last report, what is left delivered, a plan-only answer's plan in the run's description, the run ended, the
summary line printed; it returns the job's outcome. A failed or stopped job's run ends with its outcome's status
and line through :func:`end_job_run`.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any, Dict, Optional

from runner.launch.job.outcome import Outcome, finished
from runner.plan import CHART, ESTIMATES, draw_plan_chart, plan_description
from runner.runtime import run_files
from runner.track.mlflow_run import MlflowRun
from runner.track.reporter import summary_line
from runner.track.sweep_points import sweep_of


class PlanChart:
    """A job's ``plan/plan.png``, drawn once from the plan report rank 0 (or the planner) wrote: in a thread
    as soon as that report is there while the workers train (matplotlib takes about a second: off the ranks'
    path and off the job's), else when the job ends. A failure to draw (a full disk) is raised to the
    caller of :meth:`png`, in its own thread, as if it had drawn it there."""

    def __init__(self, run_folder: Path) -> None:
        self.folder = run_folder / run_files.PLAN
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None

    def start(self) -> None:
        """Start drawing once the plan report is there (nothing before, nothing twice)."""
        if self._thread is None and (self.folder / ESTIMATES).exists():
            self._thread = threading.Thread(target=self._draw, name="plan-chart", daemon=True)
            self._thread.start()

    def _draw(self) -> None:
        try:
            draw_plan_chart(self.folder)
        except BaseException as exc:  # noqa: BLE001 - raised again by png(), in the job's thread
            self._error = exc

    def png(self) -> Optional[Path]:
        """The drawn chart (waited for while drawing); None when the job wrote no plan report."""
        if self._thread is None:
            self._draw()  # nothing to overlap with any more: drawn here
        else:
            self._thread.join()
        if self._error is not None:
            raise self._error
        png = self.folder / CHART
        return png if png.exists() else None


def end_finished_run(run: MlflowRun, chart: PlanChart, results: Dict[str, Any], verbose: bool = False) -> Outcome:
    """End the run of a job that finished (the driver's, or rank 0's under a plain torchrun); its outcome, the
    ``results`` given the run's id and store, and the summary line (printed; in a sweep, with ``verbose`` only)."""
    run_folder = run.run_folder
    png = chart.png()
    if png is not None and run.opened:
        run.report_last([png], run_files.PLAN)
    run.deliver()
    results.update(run_id=run.run_id, tracking_uri=run.uri)
    if results.get("plan_status") == "feasible" and run.opened:  # a plan-only answer: its plan in the description
        if section := plan_description(run_folder / run_files.PLAN):
            run.add_to_note(section)
    sweep = sweep_of(run_folder)
    if not run.end("FINISHED"):  # a sweep's point: delivered by the sweep's one sync command
        results["tracking_pending"] = str(sweep or run_folder)
    results["run_id"] = run.run_id  # a run kept while the store was away may have been created at the end
    results["summary"] = summary_line(results)
    if sweep is None or verbose:  # else in the sweep's progress line
        print(results["summary"], flush=True)
    return finished(results)


def end_job_run(run: MlflowRun, end: Outcome) -> bool:
    """End the run of a job with its outcome's status and line (a failed or stopped job's, or a point answered
    by an earlier run); a store that fails here is said in a warning (the job's own outcome matters more). False
    when the ending is not in the store."""
    try:
        return run.end(end.status, end.error)
    except Exception as exc:  # noqa: BLE001
        print(f"[runner] warning: could not mark the MLflow run {end.status}: {exc}", file=sys.stderr, flush=True)
        return False
