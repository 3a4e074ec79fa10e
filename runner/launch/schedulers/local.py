"""This host's scheduler: the job's nodes are this host's agents (emulated nodes, or one host of a multi-host job
whose other hosts run their own ``python -m runner`` with ``cluster.node_rank``), rendezvousing over torch
elastic's c10d; every default of :class:`~runner.launch.schedulers.Scheduler` is this one's. A sweep's points may
run in a pool of this host's processes (joblib's launcher), which it ends once they have all answered."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Dict, List, Sequence, cast

from runner.launch.schedulers import Scheduler

if TYPE_CHECKING:
    from omegaconf import DictConfig

_WARMING: List[threading.Thread] = []


class LocalScheduler(Scheduler):
    name = "local"
    pooled_launchers = ("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",)  # hydra/launcher=joblib

    def warm_pool(self, launcher: DictConfig, modules: Sequence[str]) -> None:
        if str(launcher.get("_target_")) not in self.pooled_launchers:
            return
        from hydra_plugins.hydra_joblib_launcher._core import process_joblib_cfg
        from joblib import Parallel, delayed, effective_n_jobs
        from omegaconf import OmegaConf

        # the arguments joblib's launcher will give Parallel, so that it finds this pool and takes it over
        composed = cast(Dict[str, Any], OmegaConf.to_container(launcher, resolve=True))
        args = {str(k): v for k, v in composed.items() if k != "_target_"}
        args["backend"] = "loky"
        process_joblib_cfg(args)

        def warm() -> None:
            with contextlib.suppress(BaseException):  # a head start only: the points import what they need anyway
                Parallel(**args)(delayed(_imported)(list(modules)) for _ in range(effective_n_jobs(args.get("n_jobs"))))
        _WARMING.append(threading.Thread(target=warm, name="runner-warm-pool", daemon=True))
        _WARMING[-1].start()

    def end_pool(self) -> None:
        while _WARMING:
            _WARMING.pop().join(60)
        loky = sys.modules.get("joblib.externals.loky.reusable_executor")  # joblib's pool, where one ran the points
        executor = getattr(loky, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=True, kill_workers=True)


SCHEDULER = LocalScheduler()


def _imported(modules: List[str]) -> int:
    """In a pool's worker: import ``modules`` (what its first point would import; one that fails is left to it)."""
    for name in modules:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    return os.getpid()
