"""Worker: one process per rank. Its environment, device, cores and process group; then the rank's job.

Started by the runner's elastic agents (:func:`elastic_entry`), or by an external ``torchrun``
(:mod:`runner.launch.torchrun`). A rank that fails writes its one-line error and traceback in the run
folder (the driver reports the earliest: the root cause, not its peers' broken connections).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from runner.config.errors import one_line
from runner.config.modes import MODES
from runner.config.parts import part
from runner.config.place import read_place
from runner.config.schema import load_resolved
from runner.runtime import affinity, run_files
from runner.runtime.allocator import keep_freed_memory
from runner.runtime.cores import job_memory
from runner.runtime.device import (
    backend,
    check_autocast,
    check_pipeline,
    check_sparse_optimizer,
    check_tf32,
    ddr_cap_for_host,
    device_type,
    hbm_cap_bytes,
)
from runner.runtime.logfile import log_to_file
from runner.runtime.process_end import AGENT_PID, die_with_parent
from runner.train import heartbeat
from runner.train.rank_env import RankEnv, env_int

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig
    from runner.track.reporter import Reporter


def select_device(cluster_device: str, local_rank: int) -> torch.device:
    """``cuda:LOCAL_RANK`` when CUDA is requested or present, else the CPU."""
    if device_type(cluster_device) == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def check_gpu(autocast: Optional[str], device: torch.device) -> None:
    """What this GPU cannot do, refused before anything runs on it (``precision.autocast`` bf16 on a pre-Ampere
    GPU)."""
    if device.type == "cuda":
        check_autocast(autocast, torch.cuda.get_device_capability(device), torch.cuda.get_device_name(device))


def gpu_memory_cap(hbm_cap_gib: Optional[float], device: torch.device) -> Optional[int]:
    """The planner's HBM per GPU (CUDA only): the least free memory among the job's GPUs (what other
    processes hold on a shared GPU is not the job's), agreed by every rank, or ``cluster.hbm_cap_gib``
    checked against it."""
    if device.type != "cuda":
        return None
    smallest = torch.tensor([torch.cuda.mem_get_info(device)[0]], dtype=torch.int64, device=device)
    dist.all_reduce(smallest, op=dist.ReduceOp.MIN)
    return hbm_cap_bytes(hbm_cap_gib, int(smallest.item()))


def set_tf32(enabled: bool, device: torch.device) -> None:
    check_tf32(enabled, device.type)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled


def bind_cores(cpu_affinity: str, device: torch.device, env: RankEnv) -> Optional[List[int]]:
    """``cluster.cpu_affinity=auto``: a CPU worker on its own slice of the host's cores, a CUDA worker on its
    GPU's socket (:mod:`runner.runtime.affinity`); the cores, or None when the worker is left unbound."""
    if cpu_affinity != "auto":
        return None
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return affinity.bind_near_gpu(f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0")
    allowed = affinity.allowed_cores()
    slot = affinity.host_slot(env.rank, env.local_rank, env.local_world, env.host_workers)
    cores = affinity.worker_cores(slot, env.host_workers, allowed)
    if not cores:  # fewer cores than workers: shared, within the job's slice when it has one
        return allowed if len(allowed) < (os.cpu_count() or len(allowed)) else None
    affinity.bind(cores)
    return sorted(os.sched_getaffinity(0))  # what the kernel now applies, as reported in runner.cpu_cores


def _init_process_group(device: torch.device, timeout: timedelta, env: RankEnv) -> None:
    """The default process group, its keys under a per-attempt prefix of the launcher's store.

    After an elastic restart the agent's store still holds the previous attempt's keys; without the
    prefix a fast rank can read a dead peer's address and fail with "connection refused".
    """
    kind = backend(device.type)
    if "MASTER_ADDR" not in os.environ:
        dist.init_process_group(backend=kind, timeout=timeout)
        return
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(host_name=os.environ["MASTER_ADDR"], port=int(os.environ["MASTER_PORT"]),
                          world_size=env.world, is_master=not agent_store and env.rank == 0, timeout=timeout,
                          multi_tenant=not agent_store)
    dist.init_process_group(backend=kind, store=dist.PrefixStore(f"runner/attempt-{env.restarts}", store),
                            rank=env.rank, world_size=env.world, timeout=timeout)


def preload() -> None:
    """Import what :func:`run` needs, in the agent before it forks the workers (start-up time)."""
    import torchrec.distributed.model_parallel  # noqa: F401

    import runner.train.trainer  # noqa: F401


def run(cfg: RunnerConfig, run_folder: Path, joined: Optional[Callable[[], None]] = None,
        allocated: Sequence[Tuple[int, str]] = ()) -> Dict[str, Any]:
    """Set this process up as one rank, then run its part of the job; rank 0 returns the results. ``joined``
    runs once the process group is up (a failure after that reaches every peer through it at once)."""
    from runner.track.reporter import Reporter

    marks = {"worker_started": time.time()}  # forked: just started; spawned: its imports done
    env = RankEnv.from_environment(cfg.cluster)
    pids = run_folder / run_files.PIDS  # for operators (and tests) that need to find a rank's process
    pids.mkdir(exist_ok=True)
    (pids / f"rank{env.rank}.pid").write_text(str(os.getpid()))
    heartbeat.start(run_folder, env.rank, env_int("GROUP_RANK", 0))
    device = select_device(cfg.cluster.device, env.local_rank)
    if device.type == "cpu":  # its buffers kept mapped between steps, as a GPU's caching allocator keeps them
        keep_freed_memory()
    check_gpu(cfg.precision.autocast, device)
    cores = bind_cores(cfg.cluster.cpu_affinity, device, env)  # before gloo or OpenMP start threads
    set_tf32(cfg.precision.tf32, device)
    check_sparse_optimizer(cfg.optimizer.sparse, device.type)
    check_pipeline(cfg.train.pipeline, device.type)
    bound = cores if device.type == "cpu" else None  # a GPU's socket is shared: threads are the host's share
    torch.set_num_threads(affinity.threads_per_worker(cfg.train.threads_per_worker, env.host_workers, bound))
    _init_process_group(device, timedelta(seconds=cfg.cluster.pg_timeout_s), env)
    if cfg.cluster.gloo_loop_priority == "low":
        affinity.lower_gloo_loops(expect=1 if dist.get_backend() == "gloo" else 0)
    marks["process_group"] = time.time()
    if joined is not None:
        joined()
    reporter = Reporter(run_folder, env.rank, cfg.train.steps, cfg.sweep.verbose)
    try:
        results = part(MODES[cfg.mode].works)(cfg, run_folder, env, device, reporter, marks, cores, allocated)
    except BaseException as exc:
        reporter.failed(exc)
        end_process_group(failed=True)
        raise
    dist.destroy_process_group()
    return results


def train_rank(cfg: RunnerConfig, run_folder: Path, env: RankEnv, device: torch.device, reporter: Reporter,
               marks: Dict[str, float], cores: Optional[List[int]], allocated: Sequence[Tuple[int, str]]
               ) -> Dict[str, Any]:
    """A training job's rank (its mode's ``works``): the model trained with the memory caps this rank plans with."""
    from runner.train.trainer import Trainer

    ddr = cfg.cluster.ddr_cap_gib
    if device.type == "cuda":  # UVM tables live in host memory: plan with what this host gives the job, as
        place = read_place(run_folder)  # the driver worked it out (place.json); under a plain torchrun, here
        ddr = place.ddr_cap_gib if place is not None else ddr_cap_for_host(ddr, env.host_workers,
                                                                           *job_memory(allocated))[0]
    hbm = gpu_memory_cap(cfg.cluster.hbm_cap_gib, device)
    return Trainer(cfg, run_folder, env, device, reporter, marks, hbm, ddr).run(cores)


ABORT_WITHIN_S = 10.0  # how long a failed rank waits for its process group to end before it exits anyway


def end_process_group(failed: bool, within_s: float = ABORT_WITHIN_S) -> bool:
    """End this rank's process group; True when it ended within ``within_s``. After a failure, peers may be gone
    or stuck in a collective, and destroying the group can wait on them until ``cluster.pg_timeout_s``: NCCL's
    is aborted instead, and the rank waits at most ``within_s`` before exiting with its error (errors here are
    passed over), so that its agent stops the job in seconds."""
    if not dist.is_initialized():
        return True
    if not failed:
        dist.destroy_process_group()
        return True
    end = getattr(dist.distributed_c10d, "_abort_process_group", dist.destroy_process_group) \
        if dist.get_backend() == "nccl" else dist.destroy_process_group

    def quietly() -> None:
        with contextlib.suppress(Exception):  # peers that already stopped can make this raise
            end()

    ender = threading.Thread(target=quietly, name="end-process-group", daemon=True)
    ender.start()
    ender.join(within_s)
    return not ender.is_alive()


def _write_error_report(run_folder: Path, exc: BaseException, timeout_s: float) -> None:
    """One line per failed rank, for the driver to report (the earliest is the root cause). A collective that
    timed out names the peers that went silent (:mod:`.heartbeat`), without the library's source paths."""
    rank = os.environ.get("RANK", "?")
    report: Dict[str, Any] = {"rank": rank, "time": time.time(), "error": one_line(exc), "source": "worker"}
    if heartbeat.is_collective_timeout(exc) and rank.isdigit():
        report["error"], silent = heartbeat.timeout_line(run_folder, env_int("WORLD_SIZE", 1), int(rank), timeout_s)
        report["unanswered"] = [{"rank": r, "node": n} for r, n, _ in silent]
    with contextlib.suppress(OSError):  # a full run folder: the driver's own line names it
        run_files.write_error(run_folder, f"rank{rank}", report, traceback.format_exc())


def run_guarded(run_folder: Path, pg_timeout_s: float, life: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """A rank's whole ``life`` (:func:`run`), its failure recorded in ``run_folder`` (``pg_timeout_s``: the process
    group's timeout, ``cluster.pg_timeout_s``, which a timed-out collective's line names)."""
    die_with_parent(AGENT_PID)  # an agent that dies (or is killed) takes its workers along
    log_to_file(run_folder, f"rank{os.environ.get('RANK', '?')}")
    try:
        return life()
    except BaseException as exc:
        _write_error_report(run_folder, exc, pg_timeout_s)
        raise


def elastic_entry(run_folder: str) -> Dict[str, Any]:
    """Entry point for the runner's elastic agents: the resolved config is ``<run_folder>/resolved.yaml``."""
    cfg, folder = load_resolved(Path(run_folder) / run_files.RESOLVED), Path(run_folder)
    return run_guarded(folder, cfg.cluster.pg_timeout_s, lambda: run(cfg, folder))
