"""What a job's MLflow run records (:func:`run_record`), from where Hydra placed the job (:class:`HydraJob`):
its name in a sweep, its tags (the point's values, Hydra's choices, the scheduler's, whether the prewarmed agent
took it), its config's hash, its datasets. The run itself is :class:`runner.track.driver_run.DriverRun`, which
records what this gives it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional

from runner.config.roles import config_hash
from runner.launch import schedulers
from runner.launch.processes.prewarm import took_warm
from runner.plan.calibration import hashed
from runner.runtime import rundir
from runner.runtime.cores import parallel_jobs
from runner.track import store
from runner.track.driver_run import DriverRun, RunRecord
from runner.track.sweep_points import point_name, point_values, sweep_info

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig


@dataclass(frozen=True)
class HydraJob:
    """Where this job sits in Hydra's run: its folder, and for a sweep's point its number and sweep."""

    run_dir: Path
    job_num: Optional[int]  # None: a single run
    sweep_dir: Optional[str]
    overrides: str
    choices: Mapping[str, Any]
    parallel: int = 1  # jobs the launcher runs at once on this host

    @classmethod
    def from_hydra(cls, cfg: RunnerConfig) -> "HydraJob":
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        multirun = hc.mode == RunMode.MULTIRUN
        folder = schedulers.named(cfg.cluster.scheduler).node_run_dir(Path(hc.runtime.output_dir).resolve(),
                                                                      cfg.cluster.node_rank)
        return cls(folder, hc.job.num if multirun else None,
                   hc.sweep.dir if multirun else None, " ".join(hc.overrides.task) or "(none)",
                   {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra")},
                   parallel_jobs(hc.launcher) if multirun else 1)


def driver_run(cfg: RunnerConfig, ctx: HydraJob, config: Dict[str, Any], port: int, attempt: int = 1) -> DriverRun:
    """The job's MLflow run, recording :func:`run_record` when it opens."""
    return DriverRun(cfg, ctx.run_dir, config, port, lambda: run_record(cfg, ctx, config, attempt),
                  schedulers.named(cfg.cluster.scheduler).static_rendezvous)


def run_record(cfg: RunnerConfig, ctx: HydraJob, config: Dict[str, Any], attempt: int) -> RunRecord:
    """What the job's run records: a sweep's point named after its values, its tags, the resolved config and
    Hydra's folder as artifacts, its datasets (training)."""
    sweep = sweep_info(ctx.sweep_dir)
    point = point_values(sweep.get("swept", []), cfg, ctx.choices)
    name = store.default_run_name(cfg, ctx.choices)
    if ctx.job_num is not None and not cfg.tracking.run_name:  # a sweep's point: named after its values
        name = point_name(point) if point else f"{name}-{ctx.job_num}"
    tags = {"runner.kind": "job", "runner.overrides": ctx.overrides,
            "runner.agent_prewarmed": str(took_warm()).lower(), "runner.run_dir": str(ctx.run_dir),
            **{f"runner.choice.{k}": v for k, v in ctx.choices.items()},
            **{f"runner.sweep.{k}": v for k, v in point.items()},
            **schedulers.named(cfg.cluster.scheduler).run_tags(cfg)}
    if ctx.job_num is not None:
        tags["runner.job"] = str(ctx.job_num)
    tags["runner.attempt"] = str(attempt)
    tags["runner.config_hash"] = config_hash(hashed(cfg.cluster, cfg.mode, dict(config)))  # what sweep.reuse looks for
    return RunRecord(name, sweep.get("parent_run_id"), tags, [ctx.run_dir / rundir.RESOLVED, ctx.run_dir / ".hydra"],
                     _datasets(cfg) if cfg.mode == "train" else [])


def _datasets(cfg: RunnerConfig) -> List[Any]:
    """The run's training and evaluation data, described for MLflow; a failure to describe them is logged."""
    import logging

    from runner.data.layout import job_data
    from runner.data.lineage import datasets

    try:
        return list(datasets(job_data(cfg)))
    except Exception as exc:  # the data itself was checked before launch; its record is not worth the run
        logging.getLogger("runner").warning("datasets not described: %s", exc, exc_info=True)
        return []
