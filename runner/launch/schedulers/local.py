"""This host's scheduler: the job's nodes are this host's agents (emulated nodes, or one host of a multi-host job
whose other hosts run their own ``python -m runner`` with ``cluster.node_rank``), rendezvousing over torch
elastic's c10d; every default of :class:`~runner.launch.schedulers.Scheduler` is this one's. (A sweep's points
run in a pool of this host's processes under joblib's launcher: :mod:`.host_pool`.)"""

from __future__ import annotations

from runner.launch.schedulers import Scheduler


class LocalScheduler(Scheduler):
    name = "local"


SCHEDULER = LocalScheduler()
