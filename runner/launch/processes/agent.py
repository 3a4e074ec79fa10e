"""One node's torch elastic agent:
``python -m runner.launch.processes.agent <run_folder> <node_rank> <port> <static|c10d>`` (the rendezvous its job's
scheduler asks for).

``python -m runner.launch.processes.agent --warm <threads>`` is the same agent started before the job's config
exists (see :mod:`runner.launch.processes.prewarm`): it sets OpenMP's thread count, imports torch, TorchRec (not
on a GPU host, where the workers are spawned and import it themselves) and the runner, then reads its job from
stdin as one JSON line ``[run_folder, node_rank, port, rendezvous]`` (end of input: exits without a job).

The driver starts one per node that runs on this host (all of them when nodes are emulated). The
agent rendezvouses with the others (c10d, or static: rank 0 on node 0) at ``cluster.master_addr:port`` and starts
``cluster.workers_per_node`` workers, restarting them up to ``cluster.max_restarts`` times.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.config.schema import load_resolved
from runner.launch import schedulers
from runner.launch.processes.deathwatch import DeathWatch
from runner.runtime import run_files, signals
from runner.runtime.affinity import threads_per_worker, workers_on_host
from runner.runtime.device import device_type, node_gpus, visible_gpus
from runner.runtime.logfile import log_to_file
from runner.runtime.process_end import AGENT_PID, DRIVER_PID, die_with_parent, exit_now

if TYPE_CHECKING:
    from runner.config.schema import ClusterSchema


def _set_threads(threads: int) -> None:
    # OpenMP (FBGEMM's CPU kernels) would start a thread per core in every worker: oversubscribed.
    # Set before torch loads: OpenMP reads it then, and forked workers inherit that.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(threads))


def _job_from_stdin() -> list | None:
    """A warm agent's job, ``[run_folder, node_rank, port, rendezvous]`` (None: the driver did not need this agent)."""
    import logging

    # No run folder yet for the libraries' log lines (FBGEMM warns at import on releases its table does not
    # list): none reach the terminal. A library that does not load is reported once the job is known.
    logging.disable(logging.CRITICAL)
    try:
        from torch.distributed.launcher.api import elastic_launch  # noqa: F401  (every job's launch)

        from runner.runtime.device import cuda_verdict
        from runner.train.worker import preload

        if not cuda_verdict()[0]:  # CUDA workers are spawned and import TorchRec themselves: on a GPU host its
            preload()  # import here (10 s on the lent H200s) would only delay their launch (fork: main preloads)
    except (ImportError, OSError):
        pass
    finally:
        logging.disable(logging.NOTSET)
    job = sys.stdin.readline()
    return [str(x) for x in json.loads(job)] if job.strip() else None


def _start_method(c: ClusterSchema) -> str:
    """``cluster.start_method``; ``auto``: fork CPU workers (they inherit the imports), spawn CUDA ones
    (fork needs a parent that has not touched CUDA; spawn is always safe)."""
    if c.start_method != "auto":
        return c.start_method
    return "fork" if c.device == "cpu" or (c.device == "auto" and device_type("auto") == "cpu") else "spawn"


def _own_gpus(c: ClusterSchema, node_rank: int) -> None:
    """Nodes emulated on one GPU host each get their own GPUs (``CUDA_VISIBLE_DEVICES``, inherited by the
    spawned workers): every node numbers LOCAL_RANK from 0, and ``cuda:LOCAL_RANK`` is then its own GPU."""
    if c.node_rank is not None or c.nodes < 2 or device_type(c.device) != "cuda":
        return
    os.environ["CUDA_VISIBLE_DEVICES"] = node_gpus(visible_gpus(), node_rank, c.workers_per_node)


def _rank_of(run_folder: Path, pid: int) -> str:
    for f in (run_folder / run_files.PIDS).glob("rank*.pid"):
        with contextlib.suppress(OSError, ValueError):
            if int(f.read_text().strip()) == pid:
                return f.stem[len("rank"):]
    return "?"


def _report_failures(run_folder: Path, node_rank: int, exc: Any, watch: DeathWatch) -> None:
    """Each worker that died by a signal (with the kernel's word on why, when it has one): such a rank
    reports nothing itself. Then torch elastic's own failure report, when it names another rank."""
    killed = watch.killed()
    for death in killed:
        rank = _rank_of(run_folder, int(str(death["pid"])))
        line = f"killed by {death['signal']}{likely_cause(int(str(death['pid'])), str(death['signal']))}"
        run_files.write_error(run_folder, f"agent{node_rank}-rank{rank}",
                            {"rank": rank, "time": death["time"], "error": line, "source": "agent",
                            "signal": death["signal"], "node": node_rank, "pid": death["pid"]})
    pids = {d["pid"] for d in killed}
    for rank, failure in sorted(exc.failures.items()):
        if failure.pid in pids:
            continue
        message = failure.message if isinstance(failure.message, str) else json.dumps(failure.message)
        name = failure.signal_name()
        killed_by = name not in ("<N/A>", "")
        if killed_by:
            message = f"killed by {name}{likely_cause(failure.pid, name)}"
        line = message.strip().splitlines()[-1] if message.strip() else f"exit code {failure.exitcode}"
        run_files.write_error(run_folder, f"agent{node_rank}-elastic{rank}",
                            {"rank": rank, "time": failure.timestamp or time.time(), "error": line,
                            "source": "agent", "signal": name if killed_by else None, "node": node_rank,
                            "pid": failure.pid})


def _report_unloadable(run_folder: Path, node_rank: int, workers: int, exc: BaseException) -> None:
    """The node's workers cannot start: torch, TorchRec or FBGEMM does not load here (the loader's reason)."""
    cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
    line = f"torch, TorchRec or FBGEMM does not load on node {node_rank}: {str(exc).strip()}{cause}"
    with contextlib.suppress(OSError):  # a full run folder: the driver's own line names it
        run_files.write_error(run_folder, f"agent{node_rank}-libraries",
                            {"rank": node_rank * workers, "time": time.time(), "error": line.splitlines()[0],
                            "source": "agent", "signal": None, "node": node_rank, "pid": os.getpid()})


def likely_cause(pid: int, signal_name: str) -> str:
    """``" (the kernel's OOM killer: ...)"`` when the kernel log says it killed ``pid``; else a hint."""
    if signal_name != "SIGKILL":
        return ""
    import subprocess

    try:
        log = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=3).stdout
    except (OSError, subprocess.SubprocessError):
        log = ""
    for line in reversed(log.splitlines()):
        if f"Killed process {pid} " in line or f"Killed process {pid}," in line:
            return f" (the kernel's OOM killer: {line.split(']', 1)[-1].strip()})"
    return " (by another process or the kernel's OOM killer: check memory, e.g. dmesg)"


def main(argv: list[str]) -> int:
    die_with_parent(DRIVER_PID)  # a driver killed with SIGKILL takes its agents (and so their workers) along
    # a scheduler's early signal (Slurm's time-limit warning) reaches every process of the job; the driver
    # answers it (workers inherit the ignoring)
    for early in schedulers.early_signals():
        signal.signal(early, signal.SIG_IGN)
    if argv[0] == "--warm":
        _set_threads(int(argv[1]))
        job = _job_from_stdin()
        if job is None:
            return 0
        argv = job
    run_folder, node_rank, port, static = Path(argv[0]), int(argv[1]), int(argv[2]), argv[3] == "static"
    cfg = load_resolved(run_folder / run_files.RESOLVED)
    c = cfg.cluster
    host_workers = workers_on_host(c.nodes, c.workers_per_node, c.node_rank)
    _set_threads(threads_per_worker(cfg.train.threads_per_worker, host_workers))  # a warm agent: already set
    os.environ["RUNNER_HOST_WORKERS"] = str(host_workers)  # workers pick their cores from it
    _own_gpus(c, node_rank)
    try:
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import LaunchConfig, elastic_launch

        from runner.train.worker import elastic_entry, preload
    except (ImportError, OSError) as exc:  # a library that does not load on this host (FBGEMM's, a CUDA one)
        _report_unloadable(run_folder, node_rank, c.workers_per_node, exc)
        return 1

    log_to_file(run_folder, f"agent{node_rank}")  # once torch elastic's loggers exist
    signals.guard_elastic()  # a stop signal never raises where Python can only print it

    start_method = _start_method(c)
    if start_method == "fork":
        try:
            preload()  # the workers inherit torch, TorchRec and the runner already imported
        except (ImportError, OSError) as exc:
            _report_unloadable(run_folder, node_rank, c.workers_per_node, exc)
            return 1
    # static rendezvous (a scheduler's tasks, e.g. Slurm's): node rank = group rank (rank 0 on node 0, whose task
    # opens the run)
    config = LaunchConfig(
        min_nodes=c.nodes,
        max_nodes=c.nodes,
        nproc_per_node=c.workers_per_node,
        run_id=f"runner-{port}",  # the same on every host (their run folders' names differ)
        rdzv_backend="static" if static else "c10d",
        rdzv_endpoint=f"{c.master_addr}:{port}",
        rdzv_configs=({"rank": node_rank, "timeout": c.pg_timeout_s} if static
                      else {"is_host": node_rank == 0, "join_timeout": c.pg_timeout_s}),
        max_restarts=c.max_restarts,
        monitor_interval=0.5,
        start_method=start_method,
    )
    os.environ[AGENT_PID] = str(os.getpid())  # the workers die with this agent
    watch = DeathWatch()
    try:
        elastic_launch(config, elastic_entry)(str(run_folder))
    except ChildFailedError as exc:
        with contextlib.suppress(OSError):  # a full run folder: the driver's own line names it
            _report_failures(run_folder, node_rank, exc, watch)
        return 1
    except SignalException as exc:  # the driver stopped the job: torch elastic has stopped the workers
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
