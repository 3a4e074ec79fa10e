"""The driver: one job = one run folder, one MLflow run, one launch of this host's agents.

It writes the resolved config (what the workers run: they never compose again), starts the agents,
opens the MLflow run (:class:`runner.track.mlflow_run.DriverRun`) while the workers import and rendezvous,
writes rank 0's reports to the run as they come, and ends the run FINISHED, FAILED with the one-line
reason, or KILLED.
What it runs is the job's mode's (:mod:`runner.config.modes`): agents (:func:`drive_workers`), a plan here, no run.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from omegaconf import OmegaConf

from runner import STARTED
from runner.config.errors import TrackingError
from runner.config.modes import MODES
from runner.config.parts import part
from runner.config.place import Place
from runner.launch import schedulers
from runner.launch.job import outcome
from runner.launch.job.end import PlanChart, end_finished_run, end_job_run
from runner.launch.job.run_record import HydraJob, driver_run
from runner.launch.processes.ports import check_master_port, free_port
from runner.launch.processes.prewarm import discard_warm, prewarm
from runner.launch.processes.supervisor import launch, nodes_on_this_host
from runner.launch.sweep.resume import link_point
from runner.runtime import run_files
from runner.runtime.affinity import threads_per_worker, workers_on_host
from runner.runtime.cores import check_dense_batch, job_cores, job_memory
from runner.runtime.device import (
    check_autocast_before_launch,
    check_gpu_count,
    check_pipeline,
    check_sparse_optimizer,
    check_start_method,
    check_tf32,
    ddr_cap_for_host,
    device_type,
    host_gpus,
    job_gpus,
    visible_gpus,
)
from runner.track import store
from runner.track.mlflow_run import DriverRun
from runner.track.sweep_points import sweep_info
from runner.track.sync import end_if_lost
from runner.train.checkpoint import checkpoint_root, resolve

if TYPE_CHECKING:
    from mlflow.entities import Run

    from runner.config.schema import RunnerConfig
    from runner.data.layout import JobData
    from runner.launch.schedulers import Scheduler


def pre_launch_checks(cfg: RunnerConfig, data: JobData, run_folder: Path, place: Optional[Place] = None) -> Place:
    """What can be refused before any worker starts (torch is imported only when it must be asked; ``data``: the
    job's data part); the job's place with what the checks learned (a CUDA host's memory per worker, for the
    planner's DDR cap)."""
    resolve(cfg.train.resume, checkpoint_root(cfg.train.checkpoint.dir, run_folder))
    from runner.data.checks import check_data

    check_data(data)  # nothing for a generated source
    kind = device_type(cfg.cluster.device)  # imports torch only on a machine with NVIDIA's driver
    check_tf32(cfg.precision.tf32, kind)
    check_start_method(cfg.cluster.start_method, kind)
    check_sparse_optimizer(cfg.optimizer.sparse, kind)
    check_pipeline(cfg.train.pipeline, kind)
    c = cfg.cluster
    workers, memory = c.workers_per_node * len(nodes_on_this_host(c)), job_memory(schedulers.allocations())
    check_dense_batch(data.rows, data.layout.num_dense, workers, memory)
    if kind == "cuda":
        visible = visible_gpus()
        check_autocast_before_launch(cfg.precision.autocast, job_gpus(host_gpus(), visible, workers))
        note = check_gpu_count(workers, c.workers_per_node, visible)
        ddr, ddr_note = ddr_cap_for_host(c.ddr_cap_gib, workers, *memory)  # each worker plans with it
        for line in filter(None, (note, ddr_note)):
            print(line, flush=True)
        return dataclasses.replace(place or Place(cfg.cluster.scheduler), ddr_cap_gib=ddr)
    return place or Place(cfg.cluster.scheduler)


_JOBS = itertools.count()


def _plan_choices() -> Any:
    """This plan-only point's share of a sweep planned together (:mod:`runner.launch.sweep.plan_together`), or None
    (no such sweep; TorchRec's stock planner: no plan reused); asked inside the job's cores and its run's error
    handling."""
    from hydra.core.hydra_config import HydraConfig

    from runner.launch.sweep.plan_together import choices_for
    from runner.plan import runners_planner

    if not runners_planner() or not HydraConfig.initialized():
        return None
    return choices_for(list(HydraConfig.get().overrides.task))


def plan_sweep_together(args: List[str]) -> None:
    """Pass 1 of a grid sweep (``args``: the command's) of balanced plan-only points, not on Slurm
    (:func:`runner.launch.sweep.plan_together.plan_together`), before Hydra launches its jobs; nothing for any other
    command. TorchRec is imported only for such a sweep: the driver of any other command leaves it to the
    prewarmed agent and its workers (its import costs a core for seconds)."""
    if not any(a in ("-m", "--multirun") for a in args) or not schedulers.of_command(args).points_here:
        return
    from runner.launch.sweep.plan_together import applies, plan_together
    from runner.launch.sweep.precheck import grid_points

    points = grid_points(lambda point: applies(str(point.mode), point.sharding))
    if len(points) < 2:
        return  # before TorchRec's import: a sweep of other points does not pay it (3 s here)
    from runner.plan import plan_spec, runners_planner

    if not runners_planner():
        return  # (TorchRec's stock planner: each point plans with it)
    import functools

    from runner.launch.job.plan_only import PlanProgress
    from runner.train.models import planning_model

    printer = PlanProgress(after_s=10.0) if not sys.stdout.isatty() else None  # a terminal has its count line
    plan_together([(overrides, plan_spec(point), functools.partial(planning_model, point))
                   for overrides, point in points],
                  None if printer is None else lambda i, counts: printer(counts, f"point {i + 1} of {len(points)}: "))


def drive_plan(cfg: RunnerConfig, data: Optional[JobData], hydra_job: HydraJob, run: DriverRun, chart: PlanChart,
               place: Place, scheduler: Scheduler) -> Dict[str, Any]:
    """A plan-only job (its mode's ``drives``): planned in this process, its store checked as it plans."""
    from runner.launch.job.plan_only import plan_beside, plan_only

    plan = lambda: plan_only(cfg, run.run_folder, _plan_choices())  # noqa: E731
    if hydra_job.job_num is None:  # the plan made in a fork while this process opens and feeds the run
        return plan_beside(plan, run, chart)
    run.open()  # a sweep's point: its process plans its next points with the same model
    return plan()


def chart_beside_training(workers: int, threads: int) -> bool:
    """Whether the plan's chart (matplotlib, about a second of one core) may be drawn while this host's ``workers``
    train with ``threads`` each: only where a core is left over. On 2 cores with 2 workers it took that second from
    the ranks inside a short job's timed steps: a 100-step table-wise DLRM measured 14.2-14.4 ms a step with it drawn
    beside, 10.4-10.8 without (three runs each, alternating), and its whole-step estimate was judged against that."""
    return len(os.sched_getaffinity(0)) > workers * max(threads, 1)


def drive_workers(cfg: RunnerConfig, data: Optional[JobData], hydra_job: HydraJob, run: DriverRun, chart: PlanChart,
                  place: Place, scheduler: Scheduler) -> Optional[Dict[str, Any]]:
    """A job on workers (its mode's ``drives``): launch this host's agents; rank 0's results (None when rank 0
    ran on another host). The plan's chart is drawn while the workers train, once rank 0 has written the plan, where
    this host has a core the workers do not use; else when the job ends (:func:`chart_beside_training`)."""
    assert data is not None  # built for every job on workers
    if hydra_job.job_num is None:  # an unreachable server is refused before any worker starts; a sweep's point
        store.check_store(run.uri)  # (the sweep began with the store there) goes on and keeps its run for later
    run_folder = run.run_folder
    c = cfg.cluster  # the OpenMP threads the agents load torch with (their workers inherit them)
    workers = workers_on_host(c.nodes, c.workers_per_node, c.node_rank)
    threads = threads_per_worker(cfg.train.threads_per_worker, workers)
    beside = chart_beside_training(workers, threads)

    def pump() -> None:
        run.pump()
        if run.mlflow.opened and beside:
            chart.start()

    pre_launch_checks(cfg, data, run_folder, place).write(run_folder)  # the workers read it (place.json)
    try:
        launch(cfg.cluster, run_folder, run.port, scheduler, while_starting=run.open if run.opens_early else None,
               pump=pump, threads=threads)
        _prewarm_next(threads, hydra_job, scheduler)
    finally:
        run.pump()  # what rank 0 reported before the end (or before a failure)
        if not run.mlflow.opened:  # node k of a multi-host job: the run is node 0's to end
            run.mlflow.stop_system_metrics()
    if run.multi_host and not run.mlflow.opened:
        who = "node 0's task" if run.static else "rank 0 ran on another host, whose driver"
        print(f"[runner] node {cfg.cluster.node_rank} finished; {who} logged the MLflow run", flush=True)
        return None
    results = run_files.read_json(run_folder / run_files.RESULTS)
    if results is None:
        raise RuntimeError(f"every worker exited 0 but rank 0 wrote no {run_folder / run_files.RESULTS}")
    return results


def _prewarm_next(threads: int, hydra_job: HydraJob, scheduler: Scheduler) -> None:
    """A sweep whose points run one after another in this process: the next point's agent loads torch and
    TorchRec now (with ``threads``), while this point's run ends (each point paid those imports before its
    workers)."""
    if hydra_job.job_num is None or hydra_job.parallel != 1 or not scheduler.points_here:
        return
    points = sweep_info(hydra_job.sweep_folder).get("points")
    if points and hydra_job.job_num + 1 < points:
        prewarm(threads)  # used when the next point loads torch with the same thread count


def _job_folder(hydra_job: HydraJob, config: Dict[str, Any]) -> Optional[str]:
    """This job's run folder, made; an earlier job's files there set aside (a job reads only its own files);
    ``config`` (the job's, resolved) written. The MLflow run of that earlier job, if it had one."""
    hydra_job.run_folder.mkdir(parents=True, exist_ok=True)
    earlier = run_files.set_aside_previous(hydra_job.run_folder)
    if earlier is not None:
        print(f"[runner] the run folder held an earlier job's files: moved to {earlier} (checkpoints stay, "
              "for train.resume=latest)", flush=True)
        if lost := end_if_lost(earlier):
            print(lost, flush=True)
    (hydra_job.run_folder / run_files.RESOLVED).write_text(OmegaConf.to_yaml(config))
    return (run_files.read_json(earlier / run_files.RUN_INFO) or {}).get("run_id") if earlier else None


def reuse_job(cfg: RunnerConfig, config: Dict[str, Any], earlier: Run, scheduler: Scheduler) -> Dict[str, Any]:
    """A sweep's point answered by ``earlier``, a FINISHED run of the same config (``sweep.reuse``): its own
    folder and child run, linked to that run, nothing planned or trained (``config``: ``cfg`` resolved)."""
    discard_warm()
    hydra_job = HydraJob.from_hydra(scheduler, cfg.cluster.node_rank)
    earlier_run = _job_folder(hydra_job, config)
    from runner.data.layout import job_data

    run = driver_run(cfg, hydra_job, config, 0, scheduler, job_data(cfg) if MODES[cfg.mode].logs_data else None)
    run.replaces = earlier_run  # a resumed sweep's point: its earlier run is replaced
    results = link_point(hydra_job.run_folder, earlier, run)
    results["summary"] = (f"[runner] job {hydra_job.job_num} reused: the same config finished in MLflow run "
                          f"{earlier.info.run_id}")
    end_job_run(run.mlflow, outcome.finished(results))
    if cfg.sweep.verbose:  # else in the sweep's progress line
        print(results["summary"], flush=True)
    return results


def execute_job(cfg: RunnerConfig, config: Dict[str, Any], scheduler: Scheduler, attempt: int, place: Place
                ) -> Dict[str, Any]:
    """Write the resolved config (``config``: ``cfg`` resolved, as the job made it), launch (or plan), keep the
    MLflow run, return the results. ``scheduler``: the job's (:mod:`runner.launch.schedulers`); ``attempt``: which
    run of this job it is (``sweep.retries``); ``place``: where it runs (:mod:`runner.config.place`)."""
    mode = MODES[cfg.mode]
    if not mode.on_workers:
        discard_warm()  # no workers: free the core the prewarmed agent would hold
    if not mode.opens_run:
        return dict(part(mode.drives)(cfg))
    # workers measure start-up from it: the command's start for its first job, this job's for a sweep's later jobs
    os.environ["RUNNER_START_UNIX"] = str(STARTED if next(_JOBS) == 0 else time.time())
    hydra_job = HydraJob.from_hydra(scheduler, cfg.cluster.node_rank)  # where Hydra placed it (the node's folder)
    earlier_run = _job_folder(hydra_job, config)
    port = cfg.cluster.master_port or free_port()
    if cfg.cluster.master_port and mode.on_workers and cfg.cluster.node_rank in (None, 0):
        check_master_port(cfg.cluster.master_addr, port)  # this host runs the rendezvous: it must bind the port
    run_files.write_json(hydra_job.run_folder / run_files.DRIVER, run_files.driver_fields(port))
    from runner.data.layout import job_data

    data = job_data(cfg) if mode.on_workers else None  # built once: checked, its datasets recorded
    run = driver_run(cfg, hydra_job, config, port, scheduler, data if mode.logs_data else None, attempt)
    if attempt == 1:  # a resumed sweep's point: its earlier run is replaced (a retry keeps its earlier attempts)
        run.replaces = earlier_run
    gpus = 0  # concurrent CUDA jobs on this host: each on its own GPUs too
    if mode.on_workers and hydra_job.parallel > 1 and device_type(cfg.cluster.device) == "cuda":
        gpus = cfg.cluster.workers_per_node * len(nodes_on_this_host(cfg.cluster))
    chart = PlanChart(run.run_folder)
    work = lambda: part(mode.drives)(cfg, data, hydra_job, run, chart, place, scheduler)  # noqa: E731
    with job_cores(hydra_job.parallel, gpus):  # concurrent jobs on this host: each on its own cores
        return _ended(run, chart, scheduler, work)


def _ended(run: DriverRun, chart: PlanChart, scheduler: Scheduler,
           work: Callable[[], Optional[Dict[str, Any]]]) -> Dict[str, Any]:
    """The job's ``work`` (to plan or to train); the MLflow run ended with the job's outcome (:mod:`.outcome`,
    :mod:`.end`: the value :func:`runner.launch.job.hydra_call.run_job` records, as under a plain torchrun)."""
    try:
        results = work()
        if results is None:
            return {}
        run.pump()
    except BaseException as exc:
        if isinstance(exc, TrackingError) and not run.mlflow.opened:
            raise  # the store refused before the run opened (a plan-only job's, opened beside): none to record in
        end = outcome.of_error(exc, scheduler, run.run_folder)
        if end.status == "FAILED" and not isinstance(exc, KeyboardInterrupt):
            run.ensure_on_record()
        end_job_run(run.mlflow, end)
        raise
    return end_finished_run(run.mlflow, chart, results, run.job.verbose).results
