"""A job from Hydra's call to its recorded outcome (:func:`run_job`), owned here.

Hydra calls :func:`run_job` once per job (a sweep's point, or the single run), in whichever process runs
it (the command's own, a joblib worker, a Slurm task). It takes the job's place as a scheduler's task
(:mod:`runner.launch.schedulers`: a Slurm task's node and rendezvous), validates what the pre-check did not,
keeps a resumed sweep's finished point (:mod:`runner.launch.sweep.resume`), answers a point from an earlier
run of the same config (``sweep.reuse``), and otherwise runs the job's attempts
(:func:`runner.launch.job.driver.execute_job`, again while it fails from a fault, ``sweep.retries``). Its
outcome (:mod:`.outcome`, the same value the driver ended the MLflow run with) is recorded here, in its run
folder's ``status.json``, where a sweep's outcome is read from (:mod:`runner.launch.sweep.parent`), and said.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from runner.config.errors import TrackingError, WorkerFailure
from runner.config.place import Place
from runner.config.schema import freeze, resolved_mapping
from runner.config.validation import validate
from runner.launch.job import outcome
from runner.launch.sweep import stop as sweep_stop
from runner.launch.sweep.parent import end_failed_sweep
from runner.launch.sweep.precheck import checked
from runner.runtime import run_files
from runner.track.objective import Objective, objective_value, objectives

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig
    from runner.launch.schedulers import Scheduler, Task


def _this_host() -> Scheduler:
    from runner.launch import schedulers

    return schedulers.named("local")


@dataclass
class _Job:
    """What a job knows of itself as it goes: Hydra's facts, then where it runs: its scheduler, resolved once here
    and handed down, and its place (a scheduler's task may move its run folder and adopt its place into a new,
    read-only config)."""

    cfg: RunnerConfig
    run_folder: Path
    sweep_folder: Optional[Path]  # a sweep's point: its sweep folder
    num: int
    overrides: List[str]
    task: Optional[Task] = None
    place: Place = field(default_factory=lambda: Place("local"))
    scheduler: Scheduler = field(default_factory=_this_host)  # this host's until the job takes its place
    resolved: Dict[str, Any] = field(default_factory=dict)  # the config resolved, as its run records it (once placed)

    @property
    def multirun(self) -> bool:
        return self.sweep_folder is not None

    @property
    def objectives(self) -> List[Tuple[str, str]]:
        """The metrics (and directions) the job returns to a searching sweeper."""
        return objectives(self.cfg.tracking.objective, self.cfg.mode)


def run_job(cfg: RunnerConfig) -> Optional[Objective]:
    """One job, its outcome recorded in its run folder; the value it returns to a searching sweeper. As a
    scheduler's task, a failed or stopped job also fails the scheduler's job (a node k > 0 keeps its files where the
    scheduler places them: :meth:`runner.launch.schedulers.Scheduler.node_run_folder`)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from runner.runtime.process_end import end_with_sweep

    end_with_sweep()  # a pool's process: it and its point end with the sweep's process
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    job = _Job(cfg, Path(hc.runtime.output_dir).resolve(), Path(hc.sweep.dir).resolve() if multirun else None,
               hc.job.num if multirun else 0, list(hc.overrides.task))  # a single run has no job number
    logging.captureWarnings(True)  # library warnings to the run's log file (Hydra's job logging), not the terminal
    try:
        sweep_stop.raise_if_stopped(job.sweep_folder)  # a sweep stopped by sweep.max_failures starts no more points
        if not _take_place(job):  # a plan or data job runs in node 0's task only
            return None
        if job.multirun and (kept := _kept(job)) is not None:
            return kept.get("objective")  # a resumed sweep's point that has its answer: its record stays
        results = (_answer if job.multirun else _attempts)(job)
    except sweep_stop.SweepStopped as exc:  # the sweep goes on to its end, which says why it stopped
        return _stopped(job, exc.reason)
    except KeyboardInterrupt as exc:
        end = outcome.of_error(exc, job.scheduler, job.run_folder)
        outcome.write(end, job.run_folder)
        resume = f"; resume the sweep: python -m runner resume {job.sweep_folder}" if job.multirun else ""
        say_error(f"{end.line}; every worker was stopped, the run is {end.status} ({job.run_folder}){resume}")
        raise SystemExit(end.exit_code) from None
    except Exception as exc:
        return _failed(job, exc)
    value = objective_value(job.objectives, results, job.run_folder)
    outcome.write(outcome.finished(results), job.run_folder, objective=value)
    if job.multirun:
        _say_progress(job.sweep_folder, job.num, str(results.get("summary") or "done").replace("[runner] ", ""))
    return value


def _take_place(job: _Job) -> bool:
    """The job as a scheduler's task, where it has one (its node, rendezvous and run folder), its config read-only
    from here and validated where the pre-check did not; False where this task runs none of it."""
    from runner.launch import schedulers

    scheduler, job.task = schedulers.task_of(job.cfg.cluster.scheduler)
    job.scheduler = scheduler  # resolved once: handed down from here
    elsewhere, job.place = False, Place(scheduler.name)
    if job.task is not None:
        c = job.cfg
        job.run_folder, elsewhere, job.place = scheduler.take(c.mode, c.cluster, c.train.checkpoint.dir, job.run_folder,
                                                           job.task)
        job.cfg = job.place.applied(job.cfg)  # a new config, with where the task runs; Hydra's stays as composed
    job.cfg = freeze(job.cfg)  # read-only from here, in this process, its agents and its workers
    if elsewhere:
        return False
    if job.task is not None or not checked(job.overrides):
        validate(job.cfg)  # once per job: with the scheduler's values adopted, unless the pre-check validated it
    job.resolved = resolved_mapping(job.cfg)  # once per job: every boundary (run, resume, reuse) is handed it
    return True


def _stopped(job: _Job, reason: str) -> Optional[Objective]:
    started = (job.run_folder / run_files.RUN_INFO).exists()
    outcome.write(outcome.Outcome("KILLED", f"{'stopped' if started else 'not run'}: {reason}"), job.run_folder)
    _say_progress(job.sweep_folder, job.num, "stopped" if started else "not run")
    return objective_value(job.objectives, None)


def _failed(job: _Job, exc: Exception) -> Optional[Objective]:
    """A failed job's outcome recorded and said; the sweep goes on (a searching sweeper gets the worst value), but
    a full disk ends it, and a single job or a scheduler's task exits 1."""
    end = outcome.of_error(exc, job.scheduler, job.run_folder)
    if end.full_disk and job.sweep_folder is not None:  # every later point would fail too, so the sweep ends here
        line = end_failed_sweep(end.line, job.sweep_folder)
        outcome.write(outcome.Outcome("FAILED", line, exit_code=1), job.run_folder)
        say_error(line)
        raise SystemExit(1) from None
    logging.getLogger("runner").error("job failed: %s", end.line, exc_info=exc)  # to the run's log file
    outcome.write(end, job.run_folder)
    say_error(end.line)
    if job.sweep_folder is not None:
        sweep_stop.count_failure(job.sweep_folder, job.num, end.line, job.cfg.sweep.max_failures)
    if job.sweep_folder is None or job.task is not None:  # a scheduler's job fails with its run
        raise SystemExit(1) from None
    _say_progress(job.sweep_folder, job.num, "failed (its line is above)")
    return objective_value(job.objectives, None)  # its outcome is read from every point's status


def _say_progress(sweep_folder: Optional[Path], num: int, outcome: str) -> None:
    """The sweep's progress and the outcome of its point ``num`` (Hydra's job number) in one line, once the outcome
    is recorded (:mod:`runner.launch.sweep.progress`)."""
    from runner.launch.sweep.progress import progress_line

    line = progress_line(sweep_folder) if sweep_folder is not None else None
    if line:
        print(f"{line} | {outcome if outcome.startswith(f'job {num} ') else f'job {num}: {outcome}'}", flush=True)


def _kept(job: _Job) -> Optional[Dict[str, Any]]:
    """A resumed sweep's point that finished before with the same config: its recorded status (None: it runs)."""
    from runner.launch.sweep.resume import kept_point

    kept = kept_point(job.resolved, job.cfg.tracking, job.run_folder)
    if kept is not None:
        print(f"[runner] job {job.num} kept: it finished before with the same config ({job.run_folder})", flush=True)
    return kept


def _answer(job: _Job) -> Dict[str, Any]:
    """A sweep's point: answered by an earlier run of the same config (``sweep.reuse``), or run."""
    from runner.launch.sweep.resume import config_digest, reusable, reuse_asked

    c = job.cfg  # the config's hash (a plan-only job's calibration chosen) only where reuse is asked
    earlier = reusable(config_digest(c.cluster, c.mode, job.resolved), c.tracking) \
        if reuse_asked(c.mode, c.sweep.reuse) else None
    if earlier is not None:
        from runner.launch.job.driver import reuse_job

        return reuse_job(job.cfg, job.resolved, earlier, job.scheduler)
    return _attempts(job)


def _attempts(job: _Job) -> Dict[str, Any]:
    """The job, run again (up to ``sweep.retries`` times) while it fails from a fault; each attempt its own
    MLflow run (tag ``runner.attempt``), the earlier attempts' files in ``previous/<n>/``; on the scheduler's
    task it runs as, if any."""
    from runner.launch.job.driver import execute_job
    from runner.track.mlflow_run import mark_requeued

    cfg, run_folder, task = job.cfg, job.run_folder, job.task
    attempt = 1
    if task is not None and task.restarts > 0:  # the scheduler started the job again (a lost node): the next attempt
        attempt += task.restarts
        if task.node_rank == 0:
            mark_requeued(run_folder, task.shown_id, attempt, task.label)
        if attempt > cfg.sweep.retries + 1:
            raise WorkerFailure(f"{task.label} requeued job {task.shown_id} after it lost a node; sweep.retries="
                                f"{cfg.sweep.retries} allows {cfg.sweep.retries + 1} attempt(s), so attempt "
                                f"{attempt} does not run")
    while True:
        try:
            return execute_job(cfg, job.resolved, job.scheduler, attempt, job.place)
        except (WorkerFailure, TrackingError) as exc:
            if attempt > cfg.sweep.retries or not exc.fault:
                raise
            outcome.write(outcome.of_error(exc, job.scheduler, run_folder), run_folder, attempt=attempt)
            print(f"[runner] attempt {attempt} of {cfg.sweep.retries + 1} failed from a fault ({exc}); running "
                  "it again", flush=True)
            attempt += 1


def say_error(line: str) -> None:
    """``error: <line>`` on stderr, on a line of its own (rank 0's progress bar may not have ended one)."""
    print(f"{chr(10) if sys.stderr.isatty() else ''}error: {line}", file=sys.stderr, flush=True)
