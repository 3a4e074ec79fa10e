"""The ``balanced`` proposer's search over a :class:`.problem.Problem`.

- :func:`improve`: repeatedly take the busiest rank and make the move that lowers it most while every rank
  it touches stays below the old maximum: move one of its shards, swap one with a smaller shard elsewhere,
  or take one of its tables off and place it again with any of its options (TorchRec's row-wise,
  table-row-wise or column-wise alternatives). Each move lowers the sorted vector of rank loads, so the
  search ends, at a local optimum or where its share of the work is spent (:mod:`.effort`: counted in
  evaluations, not seconds, so that the same problem gives the same plan on any machine).
- :func:`perturb`: ruin and recreate around that local optimum (a few tables taken off and placed again,
  then improved), keeping what rates no worse; it stops at a target rating (near the lower bound), after rounds
  that improved nothing, or where the work is spent.
- branch and bound over every option and placement, for small problems: :mod:`.exact`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np

from runner.plan.torchrec_adapter.balanced.effort import RANKS_PER_UNIT, Effort
from runner.plan.torchrec_adapter.balanced.problem import (
    DEVICE,
    REL_EPS,
    UNIFORM,
    Choice,
    Problem,
    Solution,
    fits,
    loads_after,
    place,
    rating,
)
from runner.plan.torchrec_adapter.balanced.swaps import Shards, best_swap


@dataclass
class _State:
    problem: Problem
    solution: Solution
    load: np.ndarray = field(init=False)
    used: np.ndarray = field(init=False)
    members: List[set] = field(init=False)  # per rank, the tables with a shard there (but not on every rank)
    shards: Shards = field(init=False)  # every device shard, for the swaps
    everywhere: set = field(init=False)  # the tables with one shard on each rank (uniform options)
    work: int = field(default=0, init=False)  # evaluations made since last counted (:mod:`.effort`)
    unit: int = field(default=1, init=False)  # what one placement costs: it reads every rank's load and storage

    def __post_init__(self) -> None:
        self.load, self.used = np.zeros(self.problem.world), np.zeros_like(self.problem.capacity)
        self.members = [set() for _ in range(self.problem.world)]
        self.everywhere = set()
        self.unit = 1 + self.problem.world // RANKS_PER_UNIT
        self.shards = Shards(self.problem)
        for t in range(len(self.solution.ranks)):
            self._apply(t, 1)

    def on(self, r: int) -> set:
        """The tables with a shard on rank ``r``."""
        return self.members[r] | self.everywhere

    def choice(self, t: int) -> Choice:
        return self.problem.tables[t][self.solution.picks[t]]

    def _apply(self, t: int, sign: int) -> None:
        """Add (``sign`` 1) or take off (-1) table ``t``'s shards: loads, storage and which ranks hold it."""
        c, ranks = self.choice(t), self.solution.ranks[t]
        if c.kind == UNIFORM:  # shard i on rank i: no rank twice, and every rank
            self.load += sign * c.perf
            self.used += sign * c.mem
            (self.everywhere.add if sign > 0 else self.everywhere.discard)(t)
            return
        np.add.at(self.load, ranks, sign * c.perf)
        np.add.at(self.used, ranks, sign * c.mem)
        (self.shards.put if sign > 0 else self.shards.take)(t, c, ranks)
        for r in set(ranks.tolist()):
            (self.members[r].add if sign > 0 else self.members[r].discard)(t)

    def take(self, t: int) -> None:
        self._apply(t, -1)

    def put(self, t: int, o: int, ranks: np.ndarray) -> None:
        self.solution.picks[t], self.solution.ranks[t] = o, ranks
        self._apply(t, 1)


PRUNE_MARGIN = 1e-9  # relative: a table is passed over only where it is clearly no better than the best so far
Move = Tuple[float, int, int, np.ndarray]  # (worst load it leaves on the ranks it touches, table, option, ranks)


def _floors(s: _State, r: int) -> List[Tuple[float, int]]:
    """The tables on rank ``r``, each with its floor, the lowest first: whatever a table's move, rank ``r`` keeps
    its load less that table's shards there, so where a table's floor is no better than the best move found
    so far, neither its move nor any later table's can be (ties: the lowest table first)."""
    out = []
    for t in s.on(r):
        c, ranks = s.choice(t), s.solution.ranks[t]
        out.append((float(s.load[r] - (c.perf[r] if c.kind == UNIFORM else c.perf[ranks == r].sum())), t))
    out.sort()
    return out


def _best_move(s: _State, r: int, limit: float) -> Optional[Move]:
    """The move that lowers rank ``r`` and leaves every rank it touches below ``limit``, with the lowest
    such load: a table of ``r`` placed again with any of its options, or one of its device shards moved."""
    best: Optional[Move] = None
    tables = s.problem.tables
    for floor, t in _floors(s, r):
        old_o, old_ranks = s.solution.picks[t], s.solution.ranks[t]
        old = s.choice(t)
        if floor > (limit if best is None else best[0]) * (1 + PRUNE_MARGIN):
            break  # this table's floor, and every later one's, is above the best move so far
        s.work += len(tables[t]) * s.unit
        if old.kind == DEVICE:
            for j in np.flatnonzero(old_ranks == r):
                s.work += 1
                ok = fits(s.used, old.mem[j], s.problem.capacity)
                ok[r] = False
                after = np.where(ok, s.load + old.perf[j], np.inf)
                q = int(np.argmin(after))
                score = max(after[q], s.load[r] - old.perf[j])
                if score < limit and (best is None or (score, t) < best[:2]):
                    moved = old_ranks.copy()
                    moved[j] = q
                    best = (score, t, old_o, moved)
        s.take(t)
        try:
            for o, c in enumerate(tables[t]):
                ranks = place(s.problem, c, s.load, s.used)
                if ranks is None:
                    continue
                if c.kind == UNIFORM:  # shard i on rank i: every rank touched, r too
                    score = float((s.load + c.perf).max())
                else:
                    touched = np.union1d(ranks, [r])
                    after = s.load[touched].copy()
                    np.add.at(after, np.searchsorted(touched, ranks), c.perf)
                    score = float(after.max())
                if score < limit and (best is None or (score, t) < best[:2]):
                    best = (score, t, o, ranks)
        finally:
            s.put(t, old_o, old_ranks)
    return best


def improve(problem: Problem, start: Solution, effort: Effort, until: Optional[int] = None,
            max_moves: int = 100000) -> Tuple[Solution, int]:
    """Local search from ``start`` (see the module doc) until no move lowers the busiest rank, ``max_moves``
    moves, or ``effort`` has no work left (below ``until`` too, where given); the solution found and the moves
    made."""
    s = _State(problem, start.copy())
    effort.spend(len(problem.tables))  # the state's loads, table by table
    moves = 0
    while moves < max_moves and effort.left(until):
        r = int(np.argmax(s.load))
        limit = s.load[r] * (1 - REL_EPS)
        move = _best_move(s, r, limit)
        swap, work = best_swap(s.shards, s.load, s.used, problem.capacity, r,
                               limit if move is None else min(limit, move[0]))
        s.work += work
        if swap is not None:
            _, ta, ja, tb, jb = swap
            ra, rb = s.solution.ranks[ta].copy(), s.solution.ranks[tb].copy()
            ra[ja], rb[jb] = rb[jb], ra[ja]
            s.take(ta)
            s.put(ta, s.solution.picks[ta], ra)
            s.take(tb)
            s.put(tb, s.solution.picks[tb], rb)
        elif move is not None:
            _, t, o, ranks = move
            s.take(t)
            s.put(t, o, ranks)
        else:
            effort.spend(s.work)
            break
        effort.spend(s.work)
        s.work = 0
        moves += 1
    return s.solution, moves


def _reinsert(s: _State, tables: List[int]) -> bool:
    """Each of ``tables`` (taken off ``s``) placed again, in order, with the option and placement that leave
    the least load on the ranks they touch (then the least total perf); False where one fits nowhere."""
    for t in tables:
        best: Optional[Tuple[float, float, int, np.ndarray]] = None
        s.work += len(s.problem.tables[t]) * s.unit
        for o, c in enumerate(s.problem.tables[t]):
            ranks = place(s.problem, c, s.load, s.used)
            if ranks is None:
                continue
            key = (float(loads_after(s.load, ranks, c.perf).max()), float(c.total))
            if best is None or key < best[:2]:
                best = (*key, o, ranks)
        if best is None:
            return False
        s.put(t, best[2], best[3])
    return True


def perturb(problem: Problem, start: Solution, effort: Effort, rounds: int, patience: int, target: float,
            seed: int = 0) -> Tuple[Solution, int]:
    """Ruin and recreate around :func:`improve`'s local optimum: take off one to three tables of the busiest rank
    and up to two others (chosen by a generator seeded with ``seed``), place them again (:func:`_reinsert`, the
    largest first), improve; keep the result when it rates no worse (so the search walks plateaus) and the best
    seen. Stops (``effort.stopped``) once the best rates at most ``target``, once ``patience`` units of work
    (:mod:`.effort`) have gone by since the best last improved (rounds are cheap on small problems, where many are
    worth trying, and dear on large ones), after ``rounds`` rounds, or where ``effort`` has no work left. The best
    solution and the rounds run."""
    rng = random.Random(seed)
    best, _ = improve(problem, start, effort)
    best_rating = rating(problem, best)
    current, current_rating = best, best_rating
    done, since = 0, effort.spent
    while True:
        if best_rating <= target:
            effort.stopped = "bound"
        elif effort.spent - since >= patience:
            effort.stopped = "patience"
        elif done >= rounds:
            effort.stopped = "rounds"
        elif not effort.left():
            effort.stopped = "timeout" if effort.cut else "work"
        if effort.stopped:
            return best, done
        done += 1
        s = _State(problem, current.copy())
        effort.spend(len(problem.tables))  # the state's loads, table by table
        r = int(np.argmax(s.load))
        mine = sorted(s.on(r))
        chosen = set(rng.sample(mine, min(len(mine), rng.randint(1, 3))))
        if rng.random() < 0.5:  # with the tables of a less loaded rank, to trade places with
            q = int(rng.choice(np.argsort(s.load)[: max(1, problem.world // 4)]))
            chosen |= s.on(q)
        chosen |= set(rng.sample(range(len(problem.tables)), min(len(problem.tables), rng.randint(0, 2))))
        for t in chosen:
            s.take(t)
        order = sorted(chosen, key=lambda t: -max(c.largest for c in problem.tables[t]))
        placed = _reinsert(s, order)
        effort.spend(s.work)
        if not placed:
            continue
        found, _ = improve(problem, s.solution, effort)
        found_rating = rating(problem, found)
        if found_rating <= current_rating * (1 + REL_EPS):
            current, current_rating = found, found_rating
        if found_rating < best_rating * (1 - REL_EPS):
            best, best_rating = found, found_rating
            since = effort.spent
