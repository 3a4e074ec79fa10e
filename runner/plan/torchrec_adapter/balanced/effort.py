"""The balanced search's budget, counted in work rather than time, so that a config gives the same plan on any
machine and under any load.

A unit of work is one evaluation: one sharding option of a table placed on the ranks' loads (a move, a
re-placement or a ruin-and-recreate reinsertion tried; a unit more per 256 ranks, whose loads and storage it
reads), one device shard's move to its best rank, or one shard's swap partners scanned (a unit more per 256
shards scanned), and one table's shards added to a search state's loads (a state is built per start and per
round), so that a unit takes about as long at any size. The search (:func:`.proposer.search`) stops at the first
of:

- ``bound``: the best plan is within ``sharding.balanced_gap`` of the simple lower bound (nothing left to find);
- ``patience``: ``sharding.balanced_patience`` units of work went by since the best plan last improved (a
  ruin-and-recreate round costs tens of units at 8 tables and thousands at 5,384 tables on 1,024 GPUs, so small
  problems try many rounds and large ones few);
- ``rounds``: the rounds are done (:data:`.proposer.ROUNDS`);
- ``work``: ``sharding.balanced_work`` units are spent;
- ``timeout``: the safety stop, ``sharding.planner_timeout_s`` seconds of wall clock (null: none). Only this one
  depends on the machine; where it fires the plan says so (:attr:`Effort.cut_short`, the tag
  ``runner.plan_cut_short``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, TypeVar

T = TypeVar("T")
SWAP_SCAN = 256  # shards scanned per unit of work in a swap's scan
RANKS_PER_UNIT = 256  # ranks read per unit of work in a placement
PROGRESS_EVERY_S = 1.0  # a long search says how far it is this often (the clock decides when, never what): the
# job prints a line once 10 s have gone by since its last, at the next word it is told
STOPS = ("bound", "patience", "rounds", "work", "timeout", "optimal")


@dataclass
class Effort:
    """Work spent against ``limit`` (units, see the module doc), and the safety stop's deadline
    (``time.perf_counter()`` value; None: no clock)."""

    limit: int
    timeout_s: Optional[float] = None
    spent: int = 0
    cut: bool = False
    """The safety stop fired: the search ended before its work was done."""
    stopped: str = ""
    """Why the search ended (one of :data:`STOPS`), set by the search."""
    progress: Optional[Callable[[str], None]] = None
    """Told how far the search is, every :data:`PROGRESS_EVERY_S` seconds."""
    deadline: Optional[float] = field(default=None, init=False)
    _said: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._said = time.perf_counter()
        if self.timeout_s is not None:
            self.deadline = self._said + self.timeout_s

    def spend(self, units: int) -> None:
        self.spent += units

    def left(self, until: Optional[int] = None) -> bool:
        """Whether work is left (below ``until`` too, where given) and the safety stop has not fired."""
        if self.spent >= (self.limit if until is None else min(until, self.limit)):
            return False
        now = time.perf_counter()
        if self.deadline is not None and now >= self.deadline:
            self.cut = True
            return False
        if self.progress is not None and now - self._said >= PROGRESS_EVERY_S:
            self._said = now
            self.progress(f"balanced search: {self.spent:,} of {self.limit:,} evaluations")
        return True

    def share(self, parts: int) -> int:
        """The ``spent`` value at which an even share (one of ``parts``) of the work left ends."""
        return self.spent + max(self.limit - self.spent, 0) // max(parts, 1)

    def facts(self, rounds: int) -> Dict[str, Any]:
        return {"work": self.spent, "work_limit": self.limit, "rounds": rounds, "stopped": self.stopped,
                "cut_short": self.cut_short(rounds)}

    def cut_short(self, rounds: int) -> Optional[str]:
        """The words a plan cut by the safety stop carries (None where the search ended on its own)."""
        if not self.cut:
            return None
        return (f"the balanced search was cut short by sharding.planner_timeout_s={self.timeout_s:g} after "
                f"{self.spent:,} of {self.limit:,} units of work ({rounds} ruin-and-recreate rounds): another "
                f"machine or load may give another plan; raise or unset sharding.planner_timeout_s for the "
                f"search's own answer")


def ticker(say: Optional[Callable[[str], None]], text: str) -> Optional[Callable[[], None]]:
    """For a long step's loop (a start built table by table): a call that tells ``say`` ``text`` once every
    :data:`PROGRESS_EVERY_S` seconds; None without ``say``."""
    if say is None:
        return None
    said = [time.perf_counter()]

    def tick() -> None:
        now = time.perf_counter()
        if now - said[0] >= PROGRESS_EVERY_S:
            said[0] = now
            say(text)
    return tick


def ticking(items: Iterable[T], tick: Optional[Callable[[], None]]) -> Iterator[T]:
    """``items``, with ``tick`` (where given) called after each."""
    for item in items:
        yield item
        if tick is not None:
            tick()


STOPPED = {"bound": "within sharding.balanced_gap of the simple lower bound",
           "patience": "sharding.balanced_patience evaluations improved nothing",
           "rounds": "every round done", "work": "sharding.balanced_work spent",
           "timeout": "cut short by sharding.planner_timeout_s", "optimal": "proved optimal"}


def search_text(facts: Dict[str, Any]) -> str:
    """The note's words on the search's work and why it stopped (empty where no search ran)."""
    if "work" not in facts:
        return ""
    return (f"; search: {facts['work']:,} of {facts['work_limit']:,} evaluations, {facts['rounds']} rounds, "
            f"stopped: {STOPPED.get(facts['stopped'], facts['stopped'])}")
