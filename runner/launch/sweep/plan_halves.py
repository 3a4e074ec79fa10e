"""Pass 1 of a sweep planned together, on two cores: the later half of the points planned in a fork.

Pass 1 (:mod:`.plan_together`) plans every point in full, one after the other, in the sweep's process: at
5,384 tables on 1,024 GPUs each point is its enumeration (redone where the bandwidths change) and a 5 s
search, 90 s for 9 points on one core while the other waits. :func:`plan_in_halves` forks the sweep's process
once (where a fork is safe and a core is spare: :func:`runner.plan.planner.may_fork`); the fork plans the later
half of the points (consecutive points share their bandwidths, so each half enumerates as few as it can), the
sweep's process the earlier half; the fork sends its points' plans and facts back. What a point gets is the same
kind of answer: its own search's plan (the earlier points of its own half as extra starts) joins the set, and
pass 2 gives every point the best of the whole set there. Where the fork fails or dies, its points are planned
here after the others.
"""

from __future__ import annotations

import contextlib
from multiprocessing.connection import Pipe
from typing import Any, Callable, Dict, List, Optional, Tuple

from runner.runtime.process_end import fork_helper, reap

Answer = Tuple[int, Optional[Dict[str, Any]], Dict[str, Any]]  # (point, its plan's entries or None, its facts)
ANSWER_TIMEOUT_S = 24 * 3600.0  # the fork's half takes as long as this process's half


def plan_in_halves(count: int, plan_point: Callable[[int, bool], Tuple[Optional[Dict[str, Any]], Dict[str, Any]]],
                   fork: bool) -> List[Answer]:
    """Every point's answer (``plan_point(i, report)``: its entries and facts; ``report``: whether it may print
    progress), in point order; the later half in a fork when ``fork``."""
    later = list(range((count + 1) // 2, count)) if fork and count > 1 else []
    pid, conn = _start(later, plan_point) if later else (None, None)
    try:
        answers = {i: (i, *plan_point(i, True)) for i in range(count) if i not in later}
        got = _collect(pid, conn, later) if later else []
        answers.update({a[0]: a for a in got})
        # the fork failed: planned here
        answers.update({i: (i, *plan_point(i, True)) for i in later if i not in answers})
    finally:
        if pid is not None and conn is not None:  # (both or neither)
            conn.close()
            reap(pid, kill=True)  # done (it has sent all) or given up on
    return [answers[i] for i in range(count)]


def _start(points: List[int], plan_point: Callable[[int, bool], Tuple[Any, Any]]) -> Tuple[Optional[int], Any]:
    ours, theirs = Pipe(duplex=False)

    def work() -> None:  # in the fork: its points, each answer sent as it comes (what it did not send is
        ours.close()  # planned in the sweep's process)
        for i in points:
            theirs.send((i, *plan_point(i, False)))

    try:
        pid = fork_helper(work)
    except OSError:
        ours.close()
        theirs.close()
        return None, None
    theirs.close()
    return pid, ours


def _collect(pid: Optional[int], conn: Any, points: List[int]) -> List[Answer]:
    out: List[Answer] = []
    if conn is None:
        return out
    with contextlib.suppress(EOFError, OSError):  # it ended early: what it sent is kept
        while len(out) < len(points) and conn.poll(ANSWER_TIMEOUT_S):
            out.append(conn.recv())
    return out
