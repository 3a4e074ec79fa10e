"""One node's torch elastic agent: ``python -m runner.agent <run_dir> <node_rank> <port>``.

``python -m runner.agent --warm <threads>`` is the same agent started before the job's config exists
(see :func:`runner.launch.prewarm`): it sets OpenMP's thread count, imports torch, TorchRec and the
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

from omegaconf import OmegaConf

from runner.affinity import agent_threads, workers_on_host


def _cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()  # asks the driver (NVML); creates no CUDA context


def _set_threads(threads: int) -> None:
    # OpenMP (FBGEMM's CPU kernels) would start a thread per core in every worker: oversubscribed.
    # Set before torch loads: OpenMP reads it then, and forked workers inherit that.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(threads))


def main(argv: list[str]) -> int:
    if argv[0] == "--warm":
        _set_threads(int(argv[1]))
        from runner.worker import preload

        preload()
        job = sys.stdin.readline()
        if not job.strip():  # the driver did not need this agent
            return 0
        argv = [str(x) for x in json.loads(job)]
    run_dir, node_rank, port = Path(argv[0]), int(argv[1]), int(argv[2])
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    # A failed worker's traceback goes to <run_dir>/errors/; the driver prints the one-line cause.
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    logging.getLogger("torch.multiprocessing").setLevel(logging.ERROR)  # "Terminating process ..." on stop
    cfg = OmegaConf.load(run_dir / "resolved.yaml")
    c = cfg.cluster
    _set_threads(agent_threads(cfg))  # a warm agent: already set
    os.environ["RUNNER_HOST_WORKERS"] = str(workers_on_host(c))  # workers pick their cores from it
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from runner.worker import elastic_entry, preload

    start_method = c.start_method
    if start_method == "auto":  # fork needs a parent that has not touched CUDA; spawn is always safe
        start_method = "fork" if c.device == "cpu" or (c.device == "auto" and not _cuda_present()) else "spawn"
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
        rank, failure = exc.get_first_failure()
        message = failure.message if isinstance(failure.message, str) else json.dumps(failure.message)
        killed = failure.signal_name() not in ("<N/A>", "")
        if killed:
            message = f"killed by {failure.signal_name()}"
        line = message.strip().splitlines()[-1] if message.strip() else f"exit code {failure.exitcode}"
        err_dir = run_dir / "errors"
        err_dir.mkdir(parents=True, exist_ok=True)
        (err_dir / f"agent{node_rank}.json").write_text(
            json.dumps({"rank": rank, "time": failure.timestamp or time.time(), "error": line,
                        "source": "agent", "signal": killed}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
