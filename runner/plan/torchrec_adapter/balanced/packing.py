"""The ``balanced`` search's first plans: the runner's own start and a packing start (ranks filled up to a target,
best fit), both by :func:`construct`.

The runner's own start (:func:`construct`) places each table's cheapest option on the least loaded
ranks, as TorchRec's greedy partitioner does. Where the tables' shards are large and few sizes (a rank holds
two or three whole shards), that leaves the busiest ranks a few per cent above what a packing reaches, and
where uniform (data-parallel) options are cheapest their sliver on every rank lands on the fullest ranks too,
which the search's moves (:mod:`.moves`) cannot take back one table at a time. This start packs instead: the
largest shards first, each on the fullest rank where it stays within a target (halfway between the simple
lower bound and the runner's own start), with uniform options at their cost or at twice it, whichever packs
better. It is a start like the others: the search keeps the best of all (docs/planning.md).
"""

from __future__ import annotations

import functools
import random
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from runner.plan.torchrec_adapter.balanced.problem import (
    UNIFORM,
    Choice,
    Problem,
    Solution,
    changed,
    place,
    rating,
    simple_bound,
    valid,
)

PACKING_AT = 0.5  # the target: this far from the simple lower bound to the runner's own start's rating
PACKING_ABOVE = 0.01  # tried only where the runner's own start is this far above the simple lower bound


def packing_starts(problem: Problem, own: Optional[Solution],
                   tick: Optional[Callable[[], None]] = None) -> Dict[str, Solution]:
    """A start that packs ranks up to a target halfway between the runner's own start and the simple lower bound
    (best fit, :func:`construct`), where the runner's own start is more than :data:`PACKING_ABOVE` above
    that bound: the better of one with uniform options at their cost and one at twice it. Where the busiest ranks
    are full of whole shards, a uniform option's sliver on every rank is what the moves cannot take back (6,400
    tables on 2,048 GPUs: 258.236 ms from the runner's start, 250.086 ms from the second)."""
    if own is None:
        return {}
    top, floor = rating(problem, own), simple_bound(problem)
    if not floor == floor or top <= floor * (1 + PACKING_ABOVE):  # nan: some table fits nowhere
        return {}  # (within 1%: the moves from the runner's start do better with the whole budget, 5,384 x 1,024)
    found: Dict[str, Solution] = {}
    for name, weight in (("packing", 1.0), ("packing, uniform x2", 2.0)):
        start = construct(problem, target=floor + PACKING_AT * (top - floor), uniform_weight=weight, tick=tick)
        if start is not None and valid(problem, start) is None and changed(start, own):
            found[name] = start
    if not found:
        return {}
    best = min(found, key=lambda name: rating(problem, found[name]))  # one more start, not two: each start
    return {best: found[best]}  # takes a share of the search's budget from the others


def _storage_share(problem: Problem, c: Choice) -> float:
    """The largest fraction of one rank's capacity, of any storage kind, that ``c`` takes where it lands."""
    cap = np.maximum(problem.capacity.max(0), 1)
    if c.kind == UNIFORM:
        return float((c.mem / np.maximum(problem.capacity, 1)).max())
    return float((c.mem / cap).max())


def construct(problem: Problem, by_storage: bool = False, rng: Optional[random.Random] = None,
              target: Optional[float] = None, uniform_weight: float = 1.0,
              tick: Optional[Callable[[], None]] = None) -> Optional[Solution]:
    """A start: each table's option of least total perf (``by_storage``: of least storage share per rank,
    for memory-bound problems), uniform ones first, then the rest largest shard (or storage) first, each
    placed by :func:`place`, the next option tried where one fits nowhere; None where a table fits nowhere.
    With ``rng``: the tables in a random order, each option tried in a random order (for tight storage).
    A packing start: ``target`` (a busiest rank to pack the ranks up to, best fit) and ``uniform_weight`` (a
    uniform option's total counted that many times over: it loads every rank, the fullest ones included).
    ``tick``: called once per table placed (progress, :func:`.effort.ticker`)."""
    tables = problem.tables

    def cost(t: int, o: int) -> Tuple[float, float]:
        c = tables[t][o]
        if by_storage:
            return _storage_share(problem, c), c.total
        return c.total * (uniform_weight if c.kind == UNIFORM else 1.0), 0.0

    choose = [min(range(len(options)), key=functools.partial(cost, t)) for t, options in enumerate(tables)]
    load, used = np.zeros(problem.world), np.zeros_like(problem.capacity)
    picks, ranks = list(choose), [np.empty(0, dtype=np.int64)] * len(tables)

    def size(t: int) -> float:
        c = tables[t][picks[t]]
        return _storage_share(problem, c) if by_storage else c.largest

    order = sorted(range(len(tables)), key=lambda t: (tables[t][picks[t]].kind != UNIFORM, -size(t)))
    if rng is not None:
        rng.shuffle(order)
    for t in order:
        if tick is not None:
            tick()
        tried = [picks[t]] + sorted((o for o in range(len(tables[t])) if o != picks[t]), key=lambda o: cost(t, o))
        if rng is not None:
            rng.shuffle(tried)
        for o in tried:
            found = place(problem, tables[t][o], load, used, target)
            if found is not None:
                picks[t], ranks[t] = o, found
                c = tables[t][o]
                np.add.at(load, found, c.perf)
                np.add.at(used, found, c.mem)
                break
        else:
            return None
    return Solution(picks, ranks)
