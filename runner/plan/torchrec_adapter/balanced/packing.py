"""A packing start for the ``balanced`` search: ranks filled up to a target, best fit.

The runner's own start (:func:`.problem.construct`) places each table's cheapest option on the least loaded
ranks, as TorchRec's greedy partitioner does. Where the tables' shards are large and few sizes (a rank holds
two or three whole shards), that leaves the busiest ranks a few per cent above what a packing reaches, and
where uniform (data-parallel) options are cheapest their sliver on every rank lands on the fullest ranks too,
which the search's moves (:mod:`.moves`) cannot take back one table at a time. This start packs instead: the
largest shards first, each on the fullest rank where it stays within a target (halfway between the simple
lower bound and the runner's own start), with uniform options at their cost or at twice it, whichever packs
better. It is a start like the others: the search keeps the best of all (docs/planning.md).
"""

from __future__ import annotations

from typing import Dict, Optional

from runner.plan.torchrec_adapter.balanced.problem import (
    Problem,
    Solution,
    changed,
    construct,
    rating,
    simple_bound,
    valid,
)

PACKING_AT = 0.5  # the target: this far from the simple lower bound to the runner's own start's rating
PACKING_ABOVE = 0.01  # tried only where the runner's own start is this far above the simple lower bound


def packing_starts(problem: Problem, own: Optional[Solution]) -> Dict[str, Solution]:
    """A start that packs ranks up to a target halfway between the runner's own start and the simple lower bound
    (best fit, :func:`.problem.construct`), where the runner's own start is more than :data:`PACKING_ABOVE` above
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
        start = construct(problem, target=floor + PACKING_AT * (top - floor), uniform_weight=weight)
        if start is not None and valid(problem, start) is None and changed(start, own):
            found[name] = start
    if not found:
        return {}
    best = min(found, key=lambda name: rating(problem, found[name]))  # one more start, not two: each start
    return {best: found[best]}  # takes a share of the search's budget from the others
