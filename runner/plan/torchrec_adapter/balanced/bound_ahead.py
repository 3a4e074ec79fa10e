"""The plan's lower bound computed beside the search, on the core the search leaves idle.

The bound (:mod:`.bound`) reads only the search's problem, which is known before the search starts; at 5,384
tables on 1,024 GPUs its linear program takes about 2 s, after a 5 s search, on a machine where one core
searches and the other waits. :func:`start_bound` forks the planning process once the problem is built (only where
a fork is safe and there is a core to spare: :func:`runner.runtime.cores.may_fork`); the fork computes the bound
with the same call and sends it back; :func:`taken` gives it to :func:`.bound.plan_bound` for the same options
and devices. Where the fork fails or dies, the bound is computed here as before: the same number either way.
"""

from __future__ import annotations

import time
from multiprocessing.connection import Connection, Pipe
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from runner.plan.torchrec_adapter.balanced.problem import Problem
from runner.runtime.process_end import fork_helper, reap

ANSWER_TIMEOUT_S = 600.0  # the bound at 6,400 tables on 2,048 GPUs takes seconds
WAIT_STEP_S = 1.0  # the wait for it says so this often (the job prints a line every 10 s)

_AHEAD: List[Any] = []  # [search space, problem, pid, connection], the latest only


def start_bound(search_space: List[Any], problem: Problem, bound: Callable[[Problem], Tuple[float, str]],
                progress: Optional[Callable[[str], None]] = None) -> None:
    """Fork a process that computes ``bound(problem)`` (:func:`.bound.lower_bound_of`) for the problem of these
    options; ``progress`` is told, every second, that the plan waits for it (where it does)."""
    end_bound_fork()
    ours, theirs = Pipe(duplex=False)

    def work() -> None:  # in the fork; where it fails, the planning process computes the bound
        ours.close()
        value, kind = bound(problem)
        theirs.send((float(value), str(kind)))

    pid = fork_helper(work)
    theirs.close()
    _AHEAD[:] = [search_space, Problem([], problem.capacity, problem.local), pid, ours, progress]  # its devices only


def taken(search_space: Any, reserved: Any) -> Optional[Tuple[float, str]]:
    """The bound the fork computed for these options (the same object) on devices like these (the same
    storage left), waiting for it; None where none was started for them or the fork gave none."""
    if not _AHEAD or _AHEAD[0] is not search_space or not _same_devices(_AHEAD[1], reserved):
        end_bound_fork()
        return None
    conn: Connection = _AHEAD[3]
    progress = _AHEAD[4]
    try:
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while not conn.poll(min(WAIT_STEP_S, max(deadline - time.monotonic(), 0.0))):
            if time.monotonic() >= deadline:
                return None
            if progress is not None:
                progress("the plan's lower bound (computed beside the search)")
        value, kind = conn.recv()
        return float(value), str(kind)
    except (EOFError, OSError):
        return None
    finally:
        end_bound_fork()


def _same_devices(devices: Problem, reserved: Any) -> bool:  # the bound's devices are like ``reserved``?
    from runner.plan.torchrec_adapter.balanced.proposer import capacity_of

    return devices.local == reserved.local_world_size and np.array_equal(devices.capacity, capacity_of(reserved))


def end_bound_fork() -> None:
    """End the fork (if any is left) and drop what it was for."""
    if not _AHEAD:
        return
    pid, conn = _AHEAD[2], _AHEAD[3]
    _AHEAD.clear()
    conn.close()
    reap(pid, kill=True)
