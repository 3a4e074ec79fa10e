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
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from runner.plan.torchrec_adapter.balanced.problem import Problem
from runner.runtime.process_end import fork_answer, give_up, helper_answer

WAIT_STEP_S = 1.0  # the wait for it says so this often (the job prints a line every 10 s)

_AHEAD: List[Any] = []  # [search space, its devices, pid, the answer's pipe, progress], the latest only


def start_bound(search_space: List[Any], problem: Problem, bound: Callable[[Problem], Tuple[float, str]],
                progress: Optional[Callable[[str], None]] = None) -> None:
    """Fork a process that computes ``bound(problem)`` (:func:`.bound.lower_bound_of`) for the problem of these
    options; ``progress`` is told, every second, that the plan waits for it (where it does). Where no fork can be
    made, nothing: the bound is computed here when asked."""
    end_bound_fork()
    try:
        pid, answer = fork_answer(lambda: bound(problem))
    except OSError:
        return
    _AHEAD[:] = [search_space, Problem([], problem.capacity, problem.local), pid, answer, progress]  # its devices


def taken(search_space: Any, reserved: Any) -> Optional[Tuple[float, str]]:
    """The bound the fork computed for these options (the same object) on devices like these (the same
    storage left), waiting for it; None where none was started for them or the fork gave none."""
    if not _AHEAD or _AHEAD[0] is not search_space or not _same_devices(_AHEAD[1], reserved):
        end_bound_fork()
        return None
    pid, answer, progress = _AHEAD[2:]
    _AHEAD.clear()
    said = [time.monotonic()]

    def meanwhile() -> None:
        if progress is not None and time.monotonic() - said[0] >= WAIT_STEP_S:
            said[0] = time.monotonic()
            progress("the plan's lower bound (computed beside the search)")

    found = helper_answer(pid, answer, meanwhile, "the lower bound's process")  # None: computed here
    return None if found is None else (float(found[0]), str(found[1]))


def _same_devices(devices: Problem, reserved: Any) -> bool:  # the bound's devices are like ``reserved``?
    from runner.plan.torchrec_adapter.balanced.proposer import capacity_of

    return devices.local == reserved.local_world_size and np.array_equal(devices.capacity, capacity_of(reserved))


def end_bound_fork() -> None:
    """End the fork (if any is left) and drop what it was for."""
    if not _AHEAD:
        return
    pid, answer = _AHEAD[2], _AHEAD[3]
    _AHEAD.clear()
    give_up(pid, answer)
