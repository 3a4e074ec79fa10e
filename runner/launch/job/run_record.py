"""What a job's MLflow run records (:func:`run_record`), from where Hydra placed the job (:class:`HydraJob`): its
name in a sweep, its tags (the point's values, Hydra's choices, the scheduler's, whether the prewarmed agent took
it), its config's hash, its datasets; and the driver's run that opens with it (:func:`driver_run`: a
:class:`runner.track.mlflow_run.DriverRun`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional

from runner.launch.processes.prewarm import took_warm
from runner.launch.sweep.resume import config_digest
from runner.runtime import run_files
from runner.runtime.cores import parallel_jobs
from runner.track import store
from runner.track.mlflow_run import DriverRun, JobShape, RunRecord
from runner.track.sweep_points import point_name, point_values, sweep_info

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig
    from runner.data.layout import JobData
    from runner.launch.schedulers import Scheduler


@dataclass(frozen=True)
class HydraJob:
    """Where this job sits in Hydra's run: its folder, and for a sweep's point its number and sweep."""

    run_folder: Path
    job_num: Optional[int]  # None: a single run
    sweep_folder: Optional[str]
    overrides: str
    choices: Mapping[str, Any]
    parallel: int = 1  # jobs the launcher runs at once on this host

    @classmethod
    def from_hydra(cls, scheduler: Scheduler, node_rank: Optional[int]) -> "HydraJob":
        """This process's job as Hydra placed it (``scheduler``: the job's, which places node ``node_rank``'s
        folder)."""
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        multirun = hc.mode == RunMode.MULTIRUN
        folder = scheduler.node_run_folder(Path(hc.runtime.output_dir).resolve(), node_rank)
        return cls(folder, hc.job.num if multirun else None,
                   hc.sweep.dir if multirun else None, " ".join(hc.overrides.task) or "(none)",
                   {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra")},
                   parallel_jobs(hc.launcher) if multirun else 1)


def driver_run(cfg: RunnerConfig, hydra_job: HydraJob, config: Dict[str, Any], port: int, scheduler: Scheduler,
               data: Optional[JobData], attempt: int = 1) -> DriverRun:
    """The job's MLflow run (``config``: ``cfg`` resolved, as it records it), recording :func:`run_record` when it
    opens (``data``: a training job's data part, its datasets recorded)."""
    shape = JobShape(cfg.mode, cfg.cluster.nodes, cfg.cluster.node_rank, cfg.sweep.verbose)
    return DriverRun(cfg.tracking, shape, hydra_job.run_folder, config, port, lambda: run_record(
        hydra_job, config, attempt, scheduler.run_tags(), cfg.tracking.run_name,
        config_digest(cfg.cluster, cfg.mode, dict(config)), data), scheduler.static_rendezvous)


def run_record(hydra_job: HydraJob, config: Dict[str, Any], attempt: int, scheduler_tags: Dict[str, str],
               run_name: Optional[str], digest: str, data: Optional[JobData]) -> RunRecord:
    """What the job's run records: a sweep's point named after its values (``run_name``: ``tracking.run_name``),
    its tags (the scheduler's among them; ``digest``: its config's hash), the resolved config and Hydra's folder as
    artifacts, its datasets (``data``: a training job's)."""
    sweep = sweep_info(hydra_job.sweep_folder)
    point = point_values(sweep.get("swept", []), config, hydra_job.choices)
    name = store.default_run_name(run_name, config, hydra_job.choices)
    if hydra_job.job_num is not None and not run_name:  # a sweep's point: named after its values
        name = point_name(point) if point else f"{name}-{hydra_job.job_num}"
    tags = {"runner.kind": "job", "runner.overrides": hydra_job.overrides,
            "runner.agent_prewarmed": str(took_warm()).lower(), "runner.run_dir": str(hydra_job.run_folder),
            **{f"runner.choice.{k}": v for k, v in hydra_job.choices.items()},
            **{f"runner.sweep.{k}": v for k, v in point.items()},
            **scheduler_tags}
    if hydra_job.job_num is not None:
        tags["runner.job"] = str(hydra_job.job_num)
    tags["runner.attempt"] = str(attempt)
    tags["runner.config_hash"] = digest  # what sweep.reuse looks for
    folder = hydra_job.run_folder
    return RunRecord(name, sweep.get("parent_run_id"), tags, [folder / run_files.RESOLVED, folder / ".hydra"],
                     _datasets(data) if data is not None else [])


def _datasets(data: JobData) -> List[Any]:
    """The run's training and evaluation data, described for MLflow; a failure to describe them is logged."""
    import logging

    from runner.data.lineage import datasets

    try:
        return list(datasets(data))
    except Exception as exc:  # the data itself was checked before launch; its record is not worth the run
        logging.getLogger("runner").warning("datasets not described: %s", exc, exc_info=True)
        return []
