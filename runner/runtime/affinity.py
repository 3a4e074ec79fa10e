"""CPU cores for each worker on a host: which cores it is bound to, and how many threads it runs.

With ``cluster.cpu_affinity=auto`` a CPU worker is bound to its own slice of the cores this process
may use (``os.sched_getaffinity``, so ``taskset``/cgroup limits are respected): slot ``s`` of ``W``
workers on the host gets cores ``s*k .. s*k+k-1`` of the allowed list, ``k = cores // W``. Unbound,
the kernel moves the workers' compute threads, gloo's threads and the data thread between cores;
bound, each worker keeps its caches (what that buys: docs/benchmarks.md). When a host runs more workers
than it has cores, nothing is bound.

Imported by the agent before torch: nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import List, Optional, Set


def allowed_cores() -> List[int]:
    """Cores this process may run on, in order."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def workers_on_host(nodes: int, workers_per_node: int, node_rank: Optional[int]) -> int:
    """Workers this host runs (``cluster.nodes``, ``.workers_per_node``, ``.node_rank``): all of them when nodes
    are emulated (no node rank), else one node's."""
    return (1 if node_rank is not None else int(nodes)) * int(workers_per_node)


def host_slot(rank: int, local_rank: int, local_world: int, host_workers: int) -> int:
    """This worker's index among the host's workers (distinct per worker on the host)."""
    if host_workers > local_world:  # emulated nodes: every rank of the job runs on this host
        return rank % host_workers
    return local_rank


def worker_cores(slot: int, host_workers: int, allowed: List[int]) -> Optional[List[int]]:
    """Cores of worker ``slot`` of ``host_workers``; None when there are fewer cores than workers."""
    per = len(allowed) // max(host_workers, 1)
    if per < 1 or not 0 <= slot < host_workers:
        return None
    return allowed[slot * per:(slot + 1) * per]


def threads_per_worker(configured: Optional[int], host_workers: int, bound: Optional[List[int]] = None) -> int:
    """``train.threads_per_worker``; else the worker's bound cores; else the allowed cores divided among
    the host's workers (at least 1)."""
    if configured:
        return int(configured)
    if bound:
        return len(bound)
    return max(1, len(allowed_cores()) // max(host_workers, 1))


def gpu_local_cores(cpulist: str, allowed: List[int]) -> List[int]:
    """The allowed cores on a GPU's own socket (NUMA node), from its PCI device's ``local_cpulist`` (e.g.
    ``0-23,48-71``); every allowed core where the list names none of them (or cannot be read)."""
    local: Set[int] = set()
    for part in filter(None, cpulist.strip().split(",")):
        low, _, high = part.partition("-")
        if low.isdigit() and (high or low).isdigit():
            local.update(range(int(low), int(high or low) + 1))
    return [c for c in allowed if c in local] or list(allowed)


def bind_near_gpu(pci_bus_id: str) -> List[int]:
    """Bind a CUDA worker to the allowed cores of its GPU's socket (the host memory its copies and data
    loading touch stays local); the cores bound."""
    try:
        cpulist = Path(f"/sys/bus/pci/devices/{pci_bus_id.lower()}/local_cpulist").read_text()
    except OSError:
        cpulist = ""
    cores = gpu_local_cores(cpulist, allowed_cores())
    bind(cores)
    return cores


def bind(cores: List[int]) -> None:
    """Bind every thread of this process to ``cores`` (threads started later inherit it)."""
    core_set = set(cores)
    for tid in _thread_ids() or [0]:  # not Linux: this thread
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, core_set)


GLOO_LOOP = "gloo_tcp_loop"  # the thread name gloo gives its TCP event loop (one per process group)
LOW_NICE = 19


def gloo_loops() -> List[int]:
    """Thread ids of this process's gloo event loops (by the name each loop gives itself once it runs)."""
    found = []
    for tid in _thread_ids():
        with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm") as f:  # OSError: a thread that ended
            if f.read().startswith(GLOO_LOOP):
                found.append(tid)
    return found


def _thread_ids() -> List[int]:
    """This process's threads (none listed where there is no ``/proc``)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []


def lower_gloo_loops(expect: int, wait_s: float = 2.0) -> int:
    """Put this process's gloo event-loop threads at nice 19 (``cluster.gloo_loop_priority=low``); how many.

    gloo's TCP loop does not sleep while a peer's data waits on a socket for a receive this rank has not
    posted yet: it polls again at once (docs/benchmarks.md gives how often), on the cores of the rank's
    training thread, and so slows the very rank that is behind. At
    nice 19 it gets the core when the training thread waits on a collective, and little before. Called
    after each gloo process group is made (each has its own loop; threads made later keep their nice).
    A new loop names itself once it first runs: wait up to ``wait_s`` until ``expect`` loops are named.
    """
    deadline = time.monotonic() + wait_s
    tids = gloo_loops()
    while len(tids) < expect and time.monotonic() < deadline:
        time.sleep(0.005)
        tids = gloo_loops()
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            if os.getpriority(os.PRIO_PROCESS, tid) < LOW_NICE:
                os.setpriority(os.PRIO_PROCESS, tid, LOW_NICE)  # Linux: per thread
    return len(tids)
