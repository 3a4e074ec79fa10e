"""One node's torch elastic agent: ``python -m runner.launch.agent <run_dir> <node_rank> <port>``.

``python -m runner.launch.agent --warm <threads>`` is the same agent started before the job's config exists
(see :mod:`runner.launch.warm`): it sets OpenMP's thread count, imports torch, TorchRec and the
runner, then reads its job from stdin as one JSON line ``[run_dir, node_rank, port]`` (end of input:
exits without a job).

The driver starts one per node that runs on this host (all of them when nodes are emulated). The
agent rendezvouses with the others over c10d at ``cluster.master_addr:port`` and starts
``cluster.workers_per_node`` workers, restarting them up to ``cluster.max_restarts`` times.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from runner.config import rundir
from runner.config.device import device_type
from runner.train.affinity import agent_threads, workers_on_host


def _set_threads(threads: int) -> None:
    # OpenMP (FBGEMM's CPU kernels) would start a thread per core in every worker: oversubscribed.
    # Set before torch loads: OpenMP reads it then, and forked workers inherit that.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(threads))


def _job_from_stdin() -> list | None:
    """A warm agent's job, ``[run_dir, node_rank, port]`` (None: the driver did not need this agent)."""
    from runner.train.worker import preload

    preload()
    job = sys.stdin.readline()
    return [str(x) for x in json.loads(job)] if job.strip() else None


def _quiet_logs() -> None:
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    # A failed worker's traceback goes to <run_dir>/errors/; the driver prints the one-line cause.
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    logging.getLogger("torch.multiprocessing").setLevel(logging.ERROR)  # "Terminating process ..." on stop


def _start_method(c: Any) -> str:
    """``cluster.start_method``; ``auto``: fork CPU workers (they inherit the imports), spawn CUDA ones
    (fork needs a parent that has not touched CUDA; spawn is always safe)."""
    if c.start_method != "auto":
        return c.start_method
    return "fork" if c.device == "cpu" or (c.device == "auto" and device_type("auto") == "cpu") else "spawn"


def _record_failure(run_dir: Path, node_rank: int, exc: Any) -> None:
    """The first failed worker as the agent saw it: a signal that killed it, else its last error line."""
    rank, failure = exc.get_first_failure()
    message = failure.message if isinstance(failure.message, str) else json.dumps(failure.message)
    killed = failure.signal_name() not in ("<N/A>", "")
    if killed:
        message = f"killed by {failure.signal_name()}"
    line = message.strip().splitlines()[-1] if message.strip() else f"exit code {failure.exitcode}"
    rundir.record_error(run_dir, f"agent{node_rank}", {"rank": rank, "time": failure.timestamp or time.time(),
                                                      "error": line, "source": "agent", "signal": killed})


def main(argv: list[str]) -> int:
    if argv[0] == "--warm":
        _set_threads(int(argv[1]))
        job = _job_from_stdin()
        if job is None:
            return 0
        argv = job
    run_dir, node_rank, port = Path(argv[0]), int(argv[1]), int(argv[2])
    _quiet_logs()
    cfg = OmegaConf.load(run_dir / rundir.RESOLVED)
    c = cfg.cluster
    _set_threads(agent_threads(cfg))  # a warm agent: already set
    os.environ["RUNNER_HOST_WORKERS"] = str(workers_on_host(c))  # workers pick their cores from it
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from runner.train.worker import elastic_entry, preload

    start_method = _start_method(c)
    if start_method == "fork":
        preload()  # the workers inherit torch, TorchRec and the runner already imported
    config = LaunchConfig(
        min_nodes=c.nodes,
        max_nodes=c.nodes,
        nproc_per_node=c.workers_per_node,
        run_id=f"runner-{port}",  # the same on every host (their run folders' names differ)
        rdzv_backend="c10d",
        rdzv_endpoint=f"{c.master_addr}:{port}",
        rdzv_configs={"is_host": node_rank == 0, "join_timeout": c.pg_timeout_s},
        max_restarts=c.max_restarts,
        monitor_interval=0.5,
        start_method=start_method,
    )
    try:
        elastic_launch(config, elastic_entry)(str(run_dir))
    except ChildFailedError as exc:
        _record_failure(run_dir, node_rank, exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
