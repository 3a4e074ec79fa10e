"""A job's MLflow run under its driver: the job's :class:`runner.track.run_life.RunLife` and what a driver adds.

Rank 0 never opens or ends it (it appends its reports to the run folder's event log); ``mode=plan``
reports through the same log from the driver's own process. A plain torchrun, without a driver, has rank 0's
process hold the job's ``RunLife`` (:func:`runner.track.run_life.torchrun_run`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional

from runner.config.roles import config_hash
from runner.launch.job_end import PlanChart
from runner.launch.prewarm import took_warm
from runner.launch.slurm import node_run_dir, run_tags
from runner.runtime import rundir
from runner.runtime.cores import parallel_jobs
from runner.track import store
from runner.track.run_life import RunLife
from runner.track.sweep import point_name, point_values, sweep_info
from runner.track.system import start_system_metrics

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
        return cls(node_run_dir(Path(hc.runtime.output_dir).resolve(), cfg), hc.job.num if multirun else None,
                   hc.sweep.dir if multirun else None, " ".join(hc.overrides.task) or "(none)",
                   {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra")},
                   parallel_jobs(hc.launcher) if multirun else 1)


class MlflowRun:
    """The job's MLflow run: opened once, fed rank 0's reports, ended with the job's status.

    On a real multi-host job (``cluster.node_rank`` set) every host runs a driver and c10d rendezvous puts
    rank 0 on any of them: only the driver that finds rank 0 on its host opens and writes the run. A Slurm
    job's static rendezvous puts rank 0 on node 0: node 0's task opens the run at once, the others never.
    """

    def __init__(self, cfg: RunnerConfig, ctx: HydraJob, config: Dict[str, Any], port: int) -> None:
        self.cfg, self.ctx, self.config, self.port = cfg, ctx, config, port
        self.uri = store.tracking_uri(cfg)
        self.multi_host = cfg.cluster.node_rank is not None
        self.slurm = cfg.cluster.scheduler == "slurm"
        self._life = RunLife(ctx.run_dir, self.uri)  # open, deliver, end
        self._system: Any = None  # this host's system-metrics monitor
        self.chart = PlanChart(ctx.run_dir)  # drawn while the workers train, once rank 0 wrote the plan
        self.replaces: Optional[str] = None  # the run of this folder's earlier job (a point run again)
        self.attempt = 1  # which run of this job (sweep.retries)

    @property
    def run_id(self) -> Optional[str]:
        return self._life.run_id

    @property
    def opened(self) -> bool:
        """Whether this driver opened the run (in the store, or kept while the store is away)."""
        return self._life.opened

    def rank0_here(self) -> bool:
        if self.slurm:
            return self.cfg.cluster.node_rank == 0
        return (self.ctx.run_dir / rundir.PIDS / "rank0.pid").exists()

    @property
    def opens_early(self) -> bool:
        """Whether this driver opens the run while its workers start (it knows rank 0 is on its host)."""
        return not self.multi_host or (self.slurm and self.rank0_here())

    def open(self) -> None:
        """Create the run (its folder's ``run.json`` records it), log the config, start the system metrics."""
        ctx = self.ctx
        sweep = sweep_info(ctx.sweep_dir)
        point = point_values(sweep.get("swept", []), self.cfg, ctx.choices)
        name = store.default_run_name(self.cfg, ctx.choices)
        if ctx.job_num is not None and not self.cfg.tracking.run_name:  # a sweep's point: named after its values
            name = point_name(point) if point else f"{name}-{ctx.job_num}"
        tags = {"runner.kind": "job", "runner.overrides": ctx.overrides,
                "runner.agent_prewarmed": str(took_warm()).lower(), "runner.run_dir": str(ctx.run_dir),
                **{f"runner.choice.{k}": v for k, v in ctx.choices.items()},
                **{f"runner.sweep.{k}": v for k, v in point.items()}, **run_tags(self.cfg)}
        if ctx.job_num is not None:
            tags["runner.job"] = ctx.job_num
        tags["runner.attempt"] = self.attempt
        tags["runner.config_hash"] = config_hash(self.config)  # what sweep.reuse looks for
        run_id = self._life.open(self.cfg, self.config, name, sweep.get("parent_run_id"), tags, {"port": self.port})
        self._life.artifacts([ctx.run_dir / rundir.RESOLVED, ctx.run_dir / ".hydra"])
        if run_id is None:  # the store is away: the run is kept in the folder
            return
        if self.replaces and sweep.get("parent_run_id"):
            _retire(self.uri, self.replaces, sweep["parent_run_id"], run_id)
        print(f"[runner] MLflow run {self.run_id} | run folder {ctx.run_dir}", flush=True)
        self._system = start_system_metrics(self.cfg, self.uri, self.run_id, self.cfg.cluster.node_rank or 0)
        if self.cfg.mode == "train":
            _log_datasets(self.cfg, self.uri, self.run_id)

    def pump(self) -> None:
        """Write rank 0's new reports (metrics, tags, plan artifacts) to the run."""
        if self.multi_host and not self.opened and self.rank0_here():
            self.open()
        if self.opened:
            self._life.deliver()
            if self.cfg.mode == "train":
                self.chart.start()
        if self._system is None and self.slurm and self.cfg.cluster.node_rank:  # node k: once node 0 opened it
            info = rundir.read_json(self.ctx.run_dir.parent / rundir.RUN_INFO)
            if info and info.get("run_id"):
                self._system = start_system_metrics(self.cfg, self.uri, info["run_id"], self.cfg.cluster.node_rank)
                self._system = self._system or False  # off: asked once

    def deliver(self) -> bool:
        return self._life.deliver()

    def report_last(self, files: Any, artifact_path: Optional[str]) -> None:
        self._life.report_last(files, artifact_path)

    def add_to_note(self, section: str) -> None:
        self._life.add_to_note(section)

    def stop_system_metrics(self) -> None:
        """This host's last system-metric samples, logged before the run ends."""
        if self._system:
            self._system.stop()
        self._system = False

    def end(self, status: str, error: Optional[str] = None) -> bool:
        """End the run (what rank 0 reported first); False when the store is unreachable and the ending
        is kept in the run folder for ``python -m runner sync``."""
        self.stop_system_metrics()
        return self._life.end(status, error)

    def ensure_on_record(self) -> None:
        """A refused job is still on record, as FAILED (on a multi-host job: by node 0's driver)."""
        if not self.opened and (not self.multi_host or self.rank0_here() or self.cfg.cluster.node_rank == 0):
            self.open()


def _log_datasets(cfg: RunnerConfig, uri: str, run_id: str) -> None:
    """The run's training and evaluation data as MLflow inputs; a failure to describe them is logged, not fatal."""
    import logging

    from runner.data.lineage import datasets
    from runner.track.inputs import log_datasets

    try:
        log_datasets(uri, run_id, datasets(cfg))
    except Exception as exc:  # the data itself was checked before launch; its record is not worth the run
        logging.getLogger("runner").warning("datasets not logged: %s", exc, exc_info=True)


def record_requeued(run_dir: Path, job: str, attempt: int) -> None:
    """The run of the attempt before ``attempt``, stopped when Slurm requeued job ``job`` after a lost node (it
    ended KILLED, as a cancelled job does): FAILED, saying so. The new attempt gets its own run."""
    info = rundir.read_json(run_dir / rundir.RUN_INFO) or {}
    if not info.get("run_id"):
        return
    try:
        if store.client(info["tracking_uri"]).get_run(info["run_id"]).info.status in ("KILLED", "RUNNING"):
            store.end_run(info["tracking_uri"], info["run_id"], "FAILED",
                          f"Slurm requeued job {job} after it lost a node (attempt {attempt} follows)")
    except Exception:  # noqa: BLE001 - the earlier run keeps its status; the new attempt runs all the same
        pass


def _retire(uri: str, old: str, parent: str, new: str) -> None:
    """A sweep's point run again (a resumed sweep): its earlier run under the same parent is deleted (MLflow's
    soft delete, restorable from the UI's deleted runs), so that the parent keeps one child per point."""
    try:
        if store.client(uri).get_run(old).data.tags.get("mlflow.parentRunId") == parent:
            store.client(uri).delete_run(old)
            store.set_tags(uri, new, {"runner.replaces": old})
    except Exception:  # noqa: BLE001 - the earlier run stays; the new one is recorded all the same
        pass

