"""A sweep's points run in a pool of this host's processes (``hydra/launcher=joblib``): the pool started ahead of the
first points and ended once they have all answered. The launcher's, not a :class:`~runner.launch.schedulers.Scheduler`'s
(the schedulers say where a job's nodes run; this is how this host runs several points at once); in this package,
as every decision on a launcher's name is."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
from typing import TYPE_CHECKING, List, Sequence

if TYPE_CHECKING:
    from omegaconf import DictConfig

POOLED_LAUNCHERS = ("hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",)  # hydra/launcher=joblib
"""The ``_target_`` of each Hydra launcher that runs a sweep's points in a pool of this host's processes, each
taking its points in batches (``hydra.launcher.n_jobs`` at once, ``hydra.launcher.batch_size`` each)."""
_WARMING: List[threading.Thread] = []


def pools_points(launcher: DictConfig) -> bool:
    """Whether the composed ``hydra.launcher`` runs a sweep's points in a pool of this host's processes."""
    return str(launcher.get("_target_", "")) in POOLED_LAUNCHERS


def warm_pool(launcher: DictConfig, modules: Sequence[str]) -> None:
    """A sweep about to start whose points run in a pool (``launcher``: the ``hydra.launcher`` config): its processes
    told to end with this one (:func:`runner.runtime.process_end.end_with_sweep`: a sweep killed outright leaves no
    pool process running a point); with ``modules``, the pool started now, in the background, each process importing
    them, while the sweep's own process opens its parent run (its workers would otherwise start, and import, only
    once the first points are handed out)."""
    if not pools_points(launcher):
        return
    from runner.runtime.process_end import SWEEP_PID

    os.environ[SWEEP_PID] = str(os.getpid())  # inherited by the pool's processes, started from here on
    if not modules:
        return
    from hydra_plugins.hydra_joblib_launcher._core import process_joblib_cfg
    from joblib import Parallel, delayed, effective_n_jobs

    from runner.config.schema import resolved_mapping

    # the arguments joblib's launcher will give Parallel, so that it finds this pool and takes it over
    args = {k: v for k, v in resolved_mapping(launcher).items() if k != "_target_"}
    args["backend"] = "loky"
    process_joblib_cfg(args)

    def warm() -> None:
        with contextlib.suppress(BaseException):  # a head start only: the points import what they need anyway
            Parallel(**args)(delayed(_imported)(list(modules)) for _ in range(effective_n_jobs(args.get("n_jobs"))))
    _WARMING.append(threading.Thread(target=warm, name="runner-warm-pool", daemon=True))
    _WARMING[-1].start()


def end_pool() -> None:
    """A sweep's points all answered: the pool that ran them, idle now, ended at once. Left to the interpreter's exit,
    each worker tears down torch's and TorchRec's modules while the command waits (2.2 s of a 25-point plan sweep's
    25 s)."""
    while _WARMING:
        _WARMING.pop().join(60)
    loky = sys.modules.get("joblib.externals.loky.reusable_executor")  # joblib's pool, where one ran the points
    executor = getattr(loky, "_executor", None)
    if executor is not None:
        executor.shutdown(wait=True, kill_workers=True)


def _imported(modules: List[str]) -> int:
    """In a pool's worker: import ``modules`` (what its first point would import; one that fails is left to it)."""
    for name in modules:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    return os.getpid()
