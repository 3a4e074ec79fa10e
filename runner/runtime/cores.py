"""Cores for jobs that share a host: with a parallel launcher, each running job gets its own slice.

``hydra/launcher=joblib`` runs ``n_jobs`` points at once on this host. Without a share each job would
bind its ranks from the first core on, so two jobs' rank 0 would both sit on core 0. Here a job first
takes a free slot of ``cores // parallel`` cores (an ``flock`` on a per-user lock file, so concurrent
jobs in other processes see it, and a job that dies frees its slot) and restricts its own process to
that slice; its agents and workers inherit the restriction, and :mod:`runner.runtime.affinity` binds
within it. A job that finds no free slot runs on all allowed cores, as it would alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import gc
import hashlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, List, Optional, Sequence, Tuple

from runner.config.errors import ConfigError
from runner.config.modes import MODES
from runner.runtime.affinity import worker_cores
from runner.runtime.device import visible_gpus

if TYPE_CHECKING:
    from omegaconf import DictConfig

SLOT_DIR = Path(tempfile.gettempdir()) / f"runner-core-slots-{os.getuid()}"


def parallel_jobs(launcher: object) -> int:
    """How many jobs the launcher runs at once on this host (joblib's ``n_jobs``; -1: one per core)."""
    n = getattr(launcher, "get", lambda *_: None)("n_jobs")
    if n is None:
        return 1
    n = int(n)
    return len(os.sched_getaffinity(0)) if n < 0 else max(n, 1)


def gpu_share(visible: Sequence[str], slot: int, parallel: int, needed: int) -> List[str]:
    """The GPUs of the ``slot``-th of ``parallel`` jobs running at once on this host: its own
    ``len(visible) // parallel`` of the visible ones; refused in one line when that is fewer than the
    ``needed`` (one per worker on this host)."""
    per = len(visible) // parallel
    if per < needed:
        raise ConfigError("hydra.launcher.n_jobs", parallel,
                          f"at most {len(visible) // max(needed, 1)} CUDA jobs at once on this host: each needs "
                          f"{needed} GPU(s) (one per worker) and {len(visible)} are visible")
    return list(visible[slot * per:(slot + 1) * per])


@contextlib.contextmanager
def job_cores(parallel: int, gpus: int = 0) -> Iterator[Optional[List[int]]]:
    """Restrict this process (and what it starts) to a free slice of the host's cores while the job runs;
    with ``gpus`` (a CUDA job's workers on this host), also to its own slice of the visible GPUs
    (``CUDA_VISIBLE_DEVICES``), as disjoint between the jobs as the cores are."""
    allowed = sorted(os.sched_getaffinity(0))
    n = min(parallel, len(allowed))
    if n <= 1:
        yield None
        return
    SLOT_DIR.mkdir(exist_ok=True)
    key = hashlib.sha1(",".join(map(str, allowed)).encode()).hexdigest()[:10]
    for slot in range(n):
        fd = os.open(SLOT_DIR / f"{key}-{n}-{slot}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        cores = worker_cores(slot, n, allowed) or allowed  # n <= the cores: a slice each
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        try:
            if gpus:
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_share(visible_gpus(), slot, n, gpus))
            os.sched_setaffinity(0, cores)
            yield cores
        finally:
            os.sched_setaffinity(0, allowed)
            if gpus and shown is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            elif gpus and shown is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = shown
            os.close(fd)  # releases the lock
        return
    yield None


def plan_batch_size(mode: str, launcher: DictConfig, points: int, pooled: bool) -> Optional[int]:
    """For a plan-only sweep whose launcher runs its points in a pool of this host's processes (``pooled``, as
    joblib's does: :func:`runner.launch.schedulers.host_pool.pools_points`): points per batch so
    that each process takes one contiguous run of points (``ceil(points / n_jobs)``). Hydra orders a sweep's points
    with the first swept key varying slowest, so a process's points mostly share their bandwidths, and
    :mod:`runner.plan.torchrec_adapter.enumeration_reuse` redoes the perf estimate once per bandwidth pair a
    process meets instead of at nearly every point. None when it does not apply (training sweeps, one process, or
    ``batch_size`` already set). ``launcher``: the composed ``hydra.launcher``."""
    if not MODES[mode].answer_is_plan or not pooled or str(launcher.get("batch_size", "auto")) != "auto":
        return None
    jobs = parallel_jobs(launcher)
    return -(-points // jobs) if 1 < jobs < points else None


def job_memory(allocated: Sequence[Tuple[int, str]] = ()) -> Tuple[Optional[int], str]:
    """The host memory this job may use, in bytes, and what bounds it: the host's (psutil), its cgroup's limit (a
    container, Slurm's cgroup plugin), a scheduler's allocation (``allocated``:
    :func:`runner.launch.schedulers.allocations`); (None, '') where none can be read."""
    import psutil

    found: List[Tuple[int, str]] = []
    with contextlib.suppress(OSError, RuntimeError):
        found.append((int(psutil.virtual_memory().total), "the host's memory"))
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append((int(limit), "the cgroup's memory.max"))
    found.extend(allocated)
    return min(found) if found else (None, "")


def check_dense_batch(rows: int, num_dense: int, workers: int, memory: Tuple[Optional[int], str]) -> None:
    """One line (a :class:`ConfigError` on ``data.num_dense_features``) where one batch's dense features alone
    (``rows`` x ``num_dense`` float32 values) for each of this host's ``workers`` are more than the memory the job
    may use (``memory``: :func:`job_memory`); a lower bound of what training takes, so only the impossible is
    refused, before any worker starts."""
    total, what = memory
    need = rows * num_dense * 4 * workers
    if total is not None and need > total:
        raise ConfigError("data.num_dense_features", num_dense,
                          f"fewer: one batch's dense features ({rows} rows x {num_dense} float32 values) for each of "
                          f"this host's {workers} worker(s) take {need / 2**30:.1f} GiB, more than {what} "
                          f"({total / 2**30:.1f} GiB)")


def may_fork() -> bool:
    """Whether this process may fork a helper for a second core: it has a core to spare and nothing a fork must
    not copy live (no CUDA context, no process group: the plan-only driver or a sweep's own process, not a
    training worker)."""
    import torch

    return (hasattr(os, "fork") and len(os.sched_getaffinity(0)) > 1 and not torch.cuda.is_initialized()
            and not (torch.distributed.is_available() and torch.distributed.is_initialized()))


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for a plan and its report: a plan at thousands of tables creates
    millions of small objects (a data-parallel option at 1,024 GPUs has 1,024 shards), which set off collections
    that each walk every object alive, a sweep's kept options too (a 9-point study at 5,384 x 1,024: 30 s of 175;
    one plan-only job there: 2.3 s of 19.7). Planning and reporting make no reference cycles worth collecting
    meanwhile; the collector resumes as it was (nested pauses leave it paused until the outermost ends)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def return_freed_memory() -> None:
    """Hand the heap's freed pages back to the system (glibc's ``malloc_trim``): arrays freed by the gigabyte stay
    in this process's footprint otherwise, and what is allocated next (Python's own objects) does not reuse them.
    Nothing where the C library has no such call."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
