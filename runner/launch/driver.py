"""The driver: one job = one run folder, one MLflow run, one launch of this host's agents.

It writes the resolved config (what the workers run: they never compose again), starts the agents,
opens the MLflow run while the workers import and rendezvous, writes rank 0's reports to the run as they
come, and ends the run FINISHED, FAILED with the one-line reason, or KILLED. ``mode=plan`` plans in this
process instead of launching; ``mode=write_data`` writes data and opens no run.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from omegaconf import OmegaConf

from runner import STARTED
from runner.config.device import (
    check_bf16_before_launch,
    check_gpu_count,
    check_sparse_optimizer,
    check_tf32,
    device_type,
    host_gpus,
    visible_gpus,
)
from runner.launch.agents import launch, nodes_on_this_host
from runner.launch.ports import check_master_port, free_port
from runner.launch.slurm import node_run_dir, run_tags, stop_outcome
from runner.launch.warm import discard_warm, took_warm
from runner.runtime import rundir, signals
from runner.runtime.affinity import agent_threads
from runner.runtime.cores import job_cores, parallel_jobs
from runner.track import store
from runner.track.events import EventPump
from runner.track.reporter import summary_line
from runner.track.sweep import point_name, point_values, sweep_info
from runner.track.sync import end_or_keep
from runner.track.system import start_system_metrics
from runner.train.checkpoint import checkpoint_root, resolve


@dataclass(frozen=True)
class JobContext:
    """Where this job sits in Hydra's run: its folder, and for a sweep's point its number and sweep."""

    run_dir: Path
    job_num: Optional[int]  # None: a single run
    sweep_dir: Optional[str]
    overrides: str
    choices: Mapping[str, Any]
    parallel: int = 1  # jobs the launcher runs at once on this host

    @classmethod
    def from_hydra(cls, cfg: Any) -> "JobContext":
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        multirun = hc.mode == RunMode.MULTIRUN
        return cls(node_run_dir(Path(hc.runtime.output_dir).resolve(), cfg), hc.job.num if multirun else None,
                   hc.sweep.dir if multirun else None, " ".join(hc.overrides.task) or "(none)",
                   {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra")},
                   parallel_jobs(hc.launcher) if multirun else 1)


def pre_launch_checks(cfg: Any, run_dir: Path) -> None:
    """What can be refused before any worker starts (torch is imported only when it must be asked)."""
    resolve(cfg.train.resume, checkpoint_root(cfg, run_dir))
    if cfg.data.name != "synthetic":
        from runner.data.sources import check_data

        check_data(cfg)
    kind = device_type(cfg.cluster.device)  # imports torch only on a machine with NVIDIA's driver
    check_tf32(cfg.precision.tf32, kind)
    check_sparse_optimizer(cfg.optimizer.sparse, kind)
    if kind == "cuda":
        check_bf16_before_launch(cfg.precision.autocast, host_gpus())
        c = cfg.cluster
        note = check_gpu_count(c.workers_per_node * len(nodes_on_this_host(c)), c.workers_per_node, visible_gpus())
        if note:
            print(note, flush=True)


_JOBS = itertools.count()


def _mark_start() -> None:
    """Workers measure start-up from ``RUNNER_START_UNIX``: the command's start for its first job,
    this job's start for later jobs of a sweep."""
    os.environ["RUNNER_START_UNIX"] = str(STARTED if next(_JOBS) == 0 else time.time())


class JobRun:
    """The job's MLflow run: opened once, fed rank 0's reports, ended with the job's status.

    On a real multi-host job (``cluster.node_rank`` set) every host runs a driver and c10d rendezvous puts
    rank 0 on any of them: only the driver that finds rank 0 on its host opens and writes the run. A Slurm
    job's static rendezvous puts rank 0 on node 0: node 0's task opens the run at once, the others never.
    """

    def __init__(self, cfg: Any, ctx: JobContext, config: Dict[str, Any], port: int) -> None:
        self.cfg, self.ctx, self.config, self.port = cfg, ctx, config, port
        self.uri = store.tracking_uri(cfg)
        self.multi_host = cfg.cluster.node_rank is not None
        self.slurm = cfg.cluster.scheduler == "slurm"
        self.run_id: Optional[str] = None
        self._pump: Optional[EventPump] = None
        self._system: Any = None  # this host's system-metrics monitor

    def rank0_here(self) -> bool:
        if self.slurm:
            return self.cfg.cluster.node_rank == 0
        return (self.ctx.run_dir / rundir.PIDS / "rank0.pid").exists()

    @property
    def opens_early(self) -> bool:
        """Whether this driver opens the run while its workers start (it knows rank 0 is on its host)."""
        return not self.multi_host or (self.slurm and self.rank0_here())

    def open(self) -> None:
        """Create the run, log the config, publish ``run.json`` for rank 0."""
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
        self.run_id = store.open_job_run(self.uri, self.cfg, self.config, name, sweep.get("parent_run_id"), tags)
        self._pump = EventPump(ctx.run_dir / rundir.EVENTS, self.uri, self.run_id)
        store.log_artifacts(self.uri, self.run_id, [ctx.run_dir / rundir.RESOLVED, ctx.run_dir / ".hydra"])
        rundir.write_json(ctx.run_dir / rundir.RUN_INFO,
                          {"tracking_uri": self.uri, "run_id": self.run_id, "port": self.port})
        print(f"[runner] MLflow run {self.run_id} | run folder {ctx.run_dir}", flush=True)
        self._system = start_system_metrics(self.cfg, self.uri, self.run_id, self.cfg.cluster.node_rank or 0)
        if self.cfg.mode == "train":
            _log_datasets(self.cfg, self.uri, self.run_id)

    def pump(self) -> None:
        """Write rank 0's new reports (metrics, tags, plan artifacts) to the run."""
        if self.multi_host and self.run_id is None and self.rank0_here():
            self.open()
        if self._pump is not None:
            self._pump()
        if self._system is None and self.slurm and self.cfg.cluster.node_rank:  # node k: once node 0 opened it
            info = rundir.read_json(self.ctx.run_dir.parent / rundir.RUN_INFO)
            if info and info.get("run_id"):
                self._system = start_system_metrics(self.cfg, self.uri, info["run_id"], self.cfg.cluster.node_rank)
                self._system = self._system or False  # off: asked once

    def describe_plan(self) -> None:
        """Append the plan's short markdown to the run's Description (best effort: the plan is in its artifacts)."""
        from runner.plan.report import plan_description

        section = plan_description(self.ctx.run_dir / rundir.PLAN)
        if not section or self.run_id is None:
            return
        try:
            note = store.client(self.uri).get_run(self.run_id).data.tags.get("mlflow.note.content", "")
            store.set_tags(self.uri, self.run_id, {"mlflow.note.content": f"{note}\n\n{section}".strip()})
        except Exception:  # an outage: the run keeps its Description without the plan
            pass

    def stop_system_metrics(self) -> None:
        """This host's last system-metric samples, logged before the run ends."""
        if self._system:
            self._system.stop()
        self._system = False

    def end(self, status: str, error: Optional[str] = None) -> bool:
        """End the run (what rank 0 reported first); False when the store is unreachable and the ending
        is kept in the run folder for ``python -m runner sync``."""
        self.stop_system_metrics()
        if self.run_id is None:
            return True
        return end_or_keep(self.ctx.run_dir, self._pump, self.uri, self.run_id, status, error)

    def ensure_on_record(self) -> None:
        """A refused job is still on record, as FAILED (on a multi-host job: by node 0's driver)."""
        if self.run_id is None and (not self.multi_host or self.rank0_here() or self.cfg.cluster.node_rank == 0):
            self.open()


def _log_datasets(cfg: Any, uri: str, run_id: str) -> None:
    """The run's training and evaluation data as MLflow inputs; a failure to describe them is logged, not fatal."""
    import logging

    from runner.data.lineage import datasets
    from runner.track.inputs import log_datasets

    try:
        log_datasets(uri, run_id, datasets(cfg))
    except Exception as exc:  # the data itself was checked before launch; its record is not worth the run
        logging.getLogger("runner").warning("datasets not logged: %s", exc, exc_info=True)


def _plan(cfg: Any, run: JobRun) -> Dict[str, Any]:
    from runner.plan.plan_only import plan_only
    from runner.plan.reuse import reused_model
    from runner.train.models import planning_model

    run.open()
    return plan_only(cfg, run.ctx.run_dir, reused_model(cfg, planning_model))


def _train(cfg: Any, run: JobRun) -> Optional[Dict[str, Any]]:
    """Launch this host's agents; rank 0's results (None when rank 0 ran on another host)."""
    run_dir = run.ctx.run_dir
    pre_launch_checks(cfg, run_dir)
    try:
        launch(cfg.cluster, run_dir, run.port, while_starting=run.open if run.opens_early else None, pump=run.pump,
               threads=agent_threads(cfg))
    finally:
        run.pump()  # what rank 0 reported before the end (or before a failure)
        if run.run_id is None:  # node k of a multi-host job: the run is node 0's to end
            run.stop_system_metrics()
    if run.multi_host and run.run_id is None:
        who = "node 0's task" if run.slurm else "rank 0 ran on another host, whose driver"
        print(f"[runner] node {cfg.cluster.node_rank} finished; {who} logged the MLflow run", flush=True)
        return None
    results = rundir.read_json(run_dir / rundir.RESULTS)
    if results is None:
        raise RuntimeError(f"every worker exited 0 but rank 0 wrote no {run_dir / rundir.RESULTS}")
    return results


def run_job(cfg: Any) -> Dict[str, Any]:
    """Write the resolved config, launch (or plan), keep the MLflow run, return the results."""
    if cfg.mode != "train":
        discard_warm()  # no workers: free the core the prewarmed agent would hold
    if cfg.mode == "write_data":
        from runner.data.writer import write_data

        return write_data(cfg)
    _mark_start()
    ctx = JobContext.from_hydra(cfg)
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    earlier = rundir.set_aside_previous(ctx.run_dir)  # a job reads only its own files
    if earlier is not None:
        print(f"[runner] the run folder held an earlier job's files: moved to {earlier} (checkpoints stay, "
              "for train.resume=latest)", flush=True)
    config = OmegaConf.to_container(cfg, resolve=True)
    (ctx.run_dir / rundir.RESOLVED).write_text(OmegaConf.to_yaml(config))
    port = cfg.cluster.master_port or free_port()
    if cfg.cluster.master_port and cfg.mode == "train" and cfg.cluster.node_rank in (None, 0):
        check_master_port(cfg.cluster.master_addr, port)  # this host runs the rendezvous: it must bind the port
    rundir.write_json(ctx.run_dir / rundir.DRIVER, {"port": port})
    run = JobRun(cfg, ctx, config, port)  # type: ignore[arg-type]
    store.check_store(run.uri)  # an unreachable server is refused before any worker starts
    with job_cores(ctx.parallel):  # concurrent jobs on this host: each on its own cores
        return _run(cfg, run)


def _run(cfg: Any, run: JobRun) -> Dict[str, Any]:
    """Plan or train, keeping the MLflow run's status in step with the outcome."""
    try:
        results = _plan(cfg, run) if cfg.mode == "plan" else _train(cfg, run)
        if results is None:
            return {}
        run.pump()
        results.update(run_id=run.run_id, tracking_uri=run.uri)
        if cfg.mode == "plan" and results.get("plan_status") == "feasible":
            run.describe_plan()
    except KeyboardInterrupt as exc:
        run.end(*stop_outcome(cfg, signals.stopped(exc).name))
        raise
    except BaseException as exc:
        run.ensure_on_record()
        run.end("FAILED", str(exc))
        raise
    if not run.end("FINISHED"):
        results["tracking_pending"] = str(run.ctx.run_dir)
    results["summary"] = summary_line(results)
    print(results["summary"], flush=True)
    return results
