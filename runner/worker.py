"""Worker: one process per rank. Process group -> model on meta -> plan -> DMP -> train -> eval.

Started by the runner's elastic agents (:func:`elastic_entry`), or by an external ``torchrun``:
``torchrun --nproc_per_node=2 -m runner.worker <run_dir>/resolved.yaml``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from runner import affinity, reporting
from runner.affinity import threads_per_worker
from runner.checkpoint import CheckpointError
from runner.plan_io import PlanError
from runner.validation import ConfigError, validate


def select_device(cluster_device: str, local_rank: int) -> tuple[torch.device, str]:
    """``cuda:LOCAL_RANK`` + NCCL when CUDA is requested or present, else CPU + gloo."""
    use_cuda = cluster_device == "cuda" or (cluster_device == "auto" and torch.cuda.is_available())
    if use_cuda:
        if not torch.cuda.is_available():
            raise ConfigError("cluster.device", cluster_device, "auto or cpu on a machine without CUDA")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def set_tf32(enabled: bool, device: torch.device) -> None:
    """TF32 is a CUDA matmul mode; asking for it on CPU is a config error, not a silent no-op."""
    if enabled and device.type != "cuda":
        raise ConfigError("precision.tf32", enabled, "false on CPU workers (TF32 is a CUDA matmul mode)")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled


def bind_cores(cfg: Any, device: torch.device, rank: int, local_rank: int, local_world: int,
               host_workers: int) -> Optional[List[int]]:
    """``cluster.cpu_affinity=auto``: bind a CPU worker to its own slice of the host's cores (see
    :mod:`runner.affinity`); returns the cores, or None when the worker is left unbound."""
    if cfg.cluster.cpu_affinity != "auto" or device.type != "cpu":
        return None
    cores = affinity.worker_cores(affinity.host_slot(rank, local_rank, local_world, host_workers), host_workers,
                                  affinity.allowed_cores())
    if not cores:
        return None
    affinity.bind(cores)
    return sorted(os.sched_getaffinity(0))  # what the kernel now applies, as reported in runner.cpu_cores


def _quiet_logs(rank: int) -> None:
    warnings.filterwarnings("ignore")
    logging.getLogger().setLevel(logging.ERROR)
    for name in ("torch", "torchrec", "fbgemm_gpu"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _init_process_group(backend: str, timeout: timedelta, rank: int, world: int, attempt: int) -> None:
    """The default process group, its keys under a per-attempt prefix of the launcher's store.

    After an elastic restart the agent's store still holds the previous attempt's keys; without the
    prefix a fast rank can read a dead peer's address and fail with "connection refused".
    """
    if "MASTER_ADDR" not in os.environ:
        dist.init_process_group(backend=backend, timeout=timeout)
        return
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(host_name=os.environ["MASTER_ADDR"], port=int(os.environ["MASTER_PORT"]),
                          world_size=world, is_master=not agent_store and rank == 0, timeout=timeout,
                          multi_tenant=not agent_store)
    dist.init_process_group(backend=backend, store=dist.PrefixStore(f"runner/attempt-{attempt}", store),
                            rank=rank, world_size=world, timeout=timeout)


def _world(cfg: Any) -> tuple[int, int, int, int]:
    """RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, checked against the cluster config."""
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    world, local_world = _env_int("WORLD_SIZE", 1), _env_int("LOCAL_WORLD_SIZE", 1)
    expected = cfg.cluster.nodes * cfg.cluster.workers_per_node
    if world != expected:
        raise ConfigError("cluster.nodes*cluster.workers_per_node", expected,
                          f"the launcher's WORLD_SIZE ({world})")
    if local_world != cfg.cluster.workers_per_node:
        raise ConfigError("cluster.workers_per_node", cfg.cluster.workers_per_node,
                          f"the launcher's LOCAL_WORLD_SIZE ({local_world})")
    return rank, local_rank, world, local_world


def _resume_point(cfg: Any, checkpointer: Any, restarts: int) -> Optional[Path]:
    """``train.resume``; after an elastic restart, the newest checkpoint of this run (if any)."""
    from runner.checkpoint import complete_checkpoints, resolve

    if cfg.train.resume is None and restarts > 0:
        found = complete_checkpoints(checkpointer.root)
        return found[-1] if found else None
    return resolve(cfg.train.resume, checkpointer.root)


def preload() -> None:
    """Import what :func:`run` needs, in the agent before it forks the workers (start-up time)."""
    import torchrec.distributed.model_parallel  # noqa: F401

    import runner.checkpoint  # noqa: F401
    import runner.datasets  # noqa: F401
    import runner.model  # noqa: F401
    import runner.optimizers  # noqa: F401
    import runner.planning  # noqa: F401
    import runner.training  # noqa: F401


def run(cfg: Any, run_dir: Path) -> Dict[str, Any]:
    """Train and evaluate this rank's part of the job; rank 0 returns (and writes) the results."""
    from torchrec.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel

    from runner import checkpoint
    from runner.datasets import AllRanksIterator, Prefetcher
    from runner.datasets import source as data_source
    from runner.model import build_model
    from runner.optimizers import apply_sparse_optimizer, check_device_support, combined_optimizer
    from runner.planning import make_plan
    from runner.steps import loss_scale_for
    from runner.training import evaluate, gather_measurements, train

    marks = {"worker_started": time.time()}  # forked: just started; spawned: its imports done
    rank, local_rank, world, local_world = _world(cfg)
    restarts = _env_int("TORCHELASTIC_RESTART_COUNT", 0)
    pids = run_dir / "pids"  # for operators (and tests) that need to find a rank's process
    pids.mkdir(exist_ok=True)
    (pids / f"rank{rank}.pid").write_text(str(os.getpid()))
    device, backend = select_device(cfg.cluster.device, local_rank)
    host_workers = _env_int("RUNNER_HOST_WORKERS", local_world)  # set by the runner's agents
    cores = bind_cores(cfg, device, rank, local_rank, local_world, host_workers)  # before gloo/OpenMP threads
    set_tf32(cfg.precision.tf32, device)
    check_device_support(cfg.optimizer, device.type)
    torch.set_num_threads(threads_per_worker(cfg.train.threads_per_worker, host_workers, cores))
    _init_process_group(backend, timedelta(seconds=cfg.cluster.pg_timeout_s), rank, world, restarts)
    marks["process_group"] = time.time()
    reporter = reporting.Reporter(cfg, run_dir, rank)
    try:
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg, device)
        apply_sparse_optimizer(model, cfg.optimizer)
        plan, best_plan, plan_s, sharders = make_plan(cfg, model, world, local_world, device.type,
                                                      dist.GroupMember.WORLD)
        # DDP's static-graph mode cannot take no_sync() micro-batches (gradient accumulation)
        wrapper = DefaultDataParallelWrapper(static_graph=cfg.train.grad_accumulation_steps == 1)
        marks["planned"] = time.time()
        dmp = DistributedModelParallel(module=model, device=device, plan=plan, sharders=sharders,
                                       data_parallel_wrapper=wrapper)
        reporter.plan(plan, best_plan, plan_s, world, local_world, device.type)
        optimizer = combined_optimizer(dmp, cfg.optimizer)

        checkpointer = checkpoint.Checkpointer(cfg, run_dir, rank)
        source = _resume_point(cfg, checkpointer, restarts)
        loss_scale = loss_scale_for(cfg)
        meta = checkpoint.load(source, dmp, optimizer, cfg.train.resume_optimizer, rank) if source else {}
        start = meta.get("step", 0)
        if loss_scale is not None and meta.get("loss_scale"):
            loss_scale.load_state_dict(meta["loss_scale"])
        marks["model_ready"] = time.time()
        reporter.started(start, restarts, source)

        def data(num_batches: int, eval_split: bool, first: int = 0) -> Any:
            batches = data_source(cfg, rank, world, eval_split, first, num_batches)
            if not eval_split and cfg.data.prefetch_batches > 0:
                batches = Prefetcher(batches, cfg.data.prefetch_batches)
            # synthetic sources have the same length on every rank; files may end unevenly
            return batches if cfg.data.name == "synthetic" else AllRanksIterator(batches)

        def save(step: int, metrics: Dict[str, float]) -> None:
            meta = {"world_size": world, "sharding_types": sorted(reporter.sharding_types), "metrics": metrics,
                    "loss_scale": loss_scale.state_dict() if loss_scale is not None else None}
            path = checkpointer.save(step, dmp, optimizer, meta, run_dir / "plan" / "plan.json")
            reporter.checkpointed(step, path, metrics)

        def on_checkpoint(step: int) -> None:
            evaluated = evaluate(dmp, data(cfg.data.eval_batches, True), device, cfg)
            reporter.eval_metrics(step, evaluated)
            save(step, evaluated)

        train_data = data(cfg.train.steps, False, start)
        try:
            with reporter.progress(cfg.train.steps, start) as bar:
                result = train(dmp, optimizer, train_data, start, cfg.train.steps, device,
                               cfg, reporter.train_metrics, bar, checkpointer.due, on_checkpoint, loss_scale)
        finally:
            getattr(train_data, "close", lambda: None)()
        reporter.plan_chart()
        if result.first_step_unix is not None:
            reporter.startup(dict(marks, first_step=result.first_step_unix))
        if result.data_ended:
            reporter.data_ended(result.last_step)
        reporter.measured(gather_measurements(result, device, cores))
        eval_metrics = evaluate(dmp, data(cfg.data.eval_batches, True), device, cfg)
        if cfg.train.checkpoint.enabled:  # also when nothing was trained: the loaded state, in this layout
            save(result.last_step, eval_metrics)
        return reporter.finish(result, eval_metrics, world)
    except BaseException as exc:
        reporter.failed(exc)
        raise
    finally:
        dist.destroy_process_group()


def _record_error(run_dir: Path, exc: BaseException) -> None:
    """One line per failed rank, for the driver to report (the earliest is the root cause)."""
    rank = os.environ.get("RANK", "?")
    line = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, ConfigError):
        line = f"config error: {exc}"
    elif isinstance(exc, PlanError):
        line = f"plan error: {exc}"
    elif isinstance(exc, CheckpointError):
        line = f"checkpoint error: {exc}"
    err_dir = run_dir / "errors"
    err_dir.mkdir(parents=True, exist_ok=True)
    record = {"rank": rank, "time": time.time(), "error": line, "source": "worker"}
    (err_dir / f"rank{rank}.json").write_text(json.dumps(record))
    (err_dir / f"rank{rank}.traceback.txt").write_text(traceback.format_exc())


def _run_guarded(cfg: Any, run_dir: Path) -> Dict[str, Any]:
    _quiet_logs(_env_int("RANK", 0))
    try:
        return run(cfg, run_dir)
    except BaseException as exc:
        _record_error(run_dir, exc)
        raise


def elastic_entry(run_dir: str) -> Dict[str, Any]:
    """Entry point for the runner's elastic agents: the resolved config is ``<run_dir>/resolved.yaml``."""
    return _run_guarded(OmegaConf.load(Path(run_dir) / "resolved.yaml"), Path(run_dir))


def main(argv: list[str]) -> int:
    """``torchrun ... -m runner.worker <config.yaml>``: results go to the config file's folder."""
    if len(argv) != 1:
        print("usage: torchrun --nproc_per_node=N -m runner.worker <resolved config.yaml>", file=sys.stderr)
        return 2
    path = Path(argv[0]).resolve()
    cfg = OmegaConf.load(path)
    try:
        validate(cfg)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _run_guarded(cfg, path.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
