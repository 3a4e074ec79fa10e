"""This host's scheduler: the job's nodes are this host's agents (emulated nodes, or one host of a multi-host job
whose other hosts run their own ``python -m runner`` with ``cluster.node_rank``), rendezvousing over torch
elastic's c10d; every default of :class:`~runner.launch.schedulers.Scheduler` is this one's. A sweep's points may
run in a pool of this host's processes (joblib's launcher), which it ends once they have all answered."""

from __future__ import annotations

import sys

from runner.launch.schedulers import Scheduler


class LocalScheduler(Scheduler):
    name = "local"
    pooled_launchers = ("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",)  # hydra/launcher=joblib

    def end_pool(self) -> None:
        loky = sys.modules.get("joblib.externals.loky.reusable_executor")  # joblib's pool, where one ran the points
        executor = getattr(loky, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=True, kill_workers=True)


SCHEDULER = LocalScheduler()
