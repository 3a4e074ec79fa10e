"""Every job mode ``mode`` may name, each declared once, here.

A declaration says what the driver runs for the job and what each of its workers runs (``module:function``, found
by name when the job starts; no workers: the driver's process does the job), and the facts the stages that handle
a job read: what its run records, what it answers, how a sweep of it runs, how its results are summed up. The
schema's allowed values, the driver, the workers, tracking and the sweep's stages read it; nothing else names a
mode. Adding one is its functions, its declaration below and its test (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

_DRIVER, _LINES = "runner.launch.job.driver:", "runner.track.reporter:"


@dataclass(frozen=True)
class Mode:
    name: str
    summary: str
    """What the job does, in a few words (docs)."""
    drives: str
    """``module:function`` the driver runs for the job, its run folder made and its MLflow run started:
    ``(cfg, data, hydra_job, run, chart, place, scheduler) -> results`` (:func:`runner.launch.job.driver.execute_job`);
    without a run (``opens_run``): ``(cfg) -> results``."""
    works: Optional[str] = None
    """``module:function`` each worker runs (:func:`runner.train.worker.run`): ``(cfg, run_folder, env, device,
    reporter, marks, cores, allocated) -> results`` (rank 0's); None: no workers, the job runs in the driver."""
    opens_run: bool = True
    """The job has a run folder and an MLflow run; False: the driver runs ``drives`` on the config alone."""
    logs_data: bool = False
    """Its run logs the training data it reads (datasets, lineage)."""
    system_metrics: bool = False
    """Its run logs the hosts' CPU, memory and GPU use (``tracking.system_metrics``)."""
    objective: str = "eval/auc"
    """The run metric a job returns to a searching sweeper where ``tracking.objective.metric`` is null."""
    answer_is_plan: bool = False
    """The job answers with its plan alone: its config's hash names the calibration it plans with, a sweep's plan
    report lists it even where no plan fits, a pooled sweep gives each process a contiguous run of points (one
    enumeration per bandwidth pair)."""
    reuses: bool = False
    """``sweep.reuse``'s null: a sweep's point takes a finished run of the same config instead of running again."""
    plans_together: bool = False
    """A grid sweep of it plans its points in one pass first, with a proposer that does
    (:mod:`runner.launch.sweep.plan_together`)."""
    warm_imports: Tuple[str, ...] = ()
    """What its job imports as it runs: a sweep's pool of processes imports them before its first points
    (``runner.plan.planner`` reaches the TorchRec adapter only after its version check)."""
    keeps_calibration: bool = False
    """It writes a calibration, kept in ``cluster.calibration_dir`` (``calibrate.keep``): the pre-check checks that
    folder before anything is measured."""
    reports: str = _LINES + "training_line"
    """``module:function`` giving the job's last line from its results: ``(results, run, view) -> str``."""

    @property
    def on_workers(self) -> bool:
        """Its job runs on workers (the others run in the driver)."""
        return self.works is not None


DEFAULT = "train"
MODES: Dict[str, Mode] = {m.name: m for m in (
    Mode("train", "launch workers that train the model", _DRIVER + "drive_workers", "runner.train.worker:train_rank",
         logs_data=True, system_metrics=True),
    Mode("plan", "plan and log in the driver only, for any cluster", _DRIVER + "drive_plan",
         objective="plan/est_step_ms", answer_is_plan=True, reuses=True, plans_together=True,
         reports=_LINES + "plan_line",
         warm_imports=("runner.launch.job.hydra_call", "runner.plan.planner", "runner.train.models", "mlflow",
                       "matplotlib.backends.backend_agg", "matplotlib.figure")),
    Mode("calibrate", "measure this cluster's kernels, collectives and dense part on the job's workers and write a "
         "calibration (docs/calibration.md)", _DRIVER + "drive_workers", "runner.train.calibrate:run_calibration",
         keeps_calibration=True, reports=_LINES + "calibration_line"),
    Mode("write_data", "write the synthetic source for this model as Parquet to data.path",
         "runner.data.writer:write_data", opens_run=False),
)}
