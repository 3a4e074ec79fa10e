"""This host's scheduler: the job's nodes are this host's agents (emulated nodes, or one host of a multi-host job
whose other hosts run their own ``python -m runner`` with ``cluster.node_rank``), rendezvousing over torch
elastic's c10d; every default of :class:`~runner.launch.schedulers.Scheduler` is this one's."""

from __future__ import annotations

from runner.launch.schedulers import Scheduler


class LocalScheduler(Scheduler):
    name = "local"
    pooled_launchers = ("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",)  # hydra/launcher=joblib


SCHEDULER = LocalScheduler()
