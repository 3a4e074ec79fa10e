"""How a measurement is timed: one warm-up, then repeats synchronised with the device, and more of them while the
median they give is not known well enough (:class:`Repeats`), every rank of a collective agreeing on each round.

``mode=calibrate`` (:mod:`.calibrate`) and the embedding forward a training job times after its steps
(:mod:`.evaluate`) use it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from runner.plan import median_error


def alone(want: bool, past: bool) -> bool:
    """A measurement this rank makes alone takes more repeats when it wants them and its time is not up."""
    return want and not past


def together(device: torch.device, group: Optional[dist.ProcessGroup] = None) -> Callable[[bool, bool], bool]:
    """A measurement every rank of ``group`` (None: the world) makes at once: more repeats while any rank wants them
    and none is out of time, so that every rank times the same number of calls (a collective needs every rank)."""
    def agree(want: bool, past: bool) -> bool:
        flags = torch.tensor([float(want), float(past)], device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
        return bool(flags[0] > 0) and not bool(flags[1] > 0)
    return agree


@dataclass
class ExtraBudget:
    """Seconds spent in extra rounds (``spent``, one list shared by every measurement of a calibration) and the total
    up to which this measurement may take more (``until``): :class:`runner.train.calibrate.ExtraTime`."""

    spent: List[float]
    until: float


@dataclass(frozen=True)
class Repeats:
    """How often a measurement is timed: ``least`` repeats, then, in rounds of ``least``, more while its median's
    relative standard error (:func:`runner.plan.cost.fit.median_error`) is above ``within``, up to ``most`` and
    until ``deadline`` (``time.perf_counter()``): a scattered point is measured until its median is known as well as
    a steady one's, within a bounded time. ``agree``: :func:`alone`, or :func:`together` for what ranks do at once.
    ``budget``: the extra rounds' time also counted against a shared :class:`ExtraBudget`."""

    least: int
    most: int
    within: float = math.inf
    deadline: float = 0.0
    agree: Callable[[bool, bool], bool] = alone
    budget: Optional[ExtraBudget] = None

    def with_agree(self, agree: Callable[[bool, bool], bool]) -> Repeats:
        return replace(self, agree=agree)

    def out_of_time(self) -> bool:
        return time.perf_counter() >= self.deadline or (self.budget is not None
                                                         and self.budget.spent[0] >= self.budget.until)

    def more(self, samples: List[float]) -> int:
        """How many repeats to take next (0: the median is known, or no more may be taken)."""
        if len(samples) >= self.most or self.most <= self.least:
            return 0
        want = median_error(samples) > self.within
        if not self.agree(want, self.out_of_time()):
            return 0
        return min(self.least, self.most - len(samples))


def timed(run: Callable[[], Any], repeats: Union[int, Repeats], sync: Callable[[], None],
          before: Callable[[], None] = lambda: None) -> List[float]:
    """``run()`` once to warm up, then ``repeats`` times: ms each (``before`` runs untimed ahead of each); with a
    :class:`Repeats`, more while its median is not known well enough."""
    plan = repeats if isinstance(repeats, Repeats) else Repeats(repeats, repeats)
    out: List[float] = []

    def one() -> float:
        before()
        sync()
        start = time.perf_counter()
        run()
        sync()
        return (time.perf_counter() - start) * 1000
    one()  # the warm-up
    out += [one() for _ in range(plan.least)]
    while n := plan.more(out):
        start = time.perf_counter()
        out += [one() for _ in range(n)]
        if plan.budget is not None:
            plan.budget.spent[0] += time.perf_counter() - start
    return out


def forward_backward(forward: Callable[[], Any], backward: Callable[[Any], None], repeats: Union[int, Repeats],
                     sync: Callable[[], None], before: Callable[[], None] = lambda: None
                     ) -> Tuple[List[float], List[float]]:
    """``forward()`` timed, then ``backward(its output)`` timed (each after a fresh untimed forward), ms."""
    held: List[Any] = [None]

    def run_forward() -> None:
        held[0] = forward()
    def again() -> None:
        before()
        run_forward()
    fwd = timed(run_forward, repeats, sync, before)
    bwd = timed(lambda: backward(held[0]), repeats, sync, again)
    return fwd, bwd
