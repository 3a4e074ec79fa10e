"""The balanced search's swaps: a device shard of the busiest rank traded for a smaller one elsewhere.

Every device shard of a search state (:class:`Shards`) is kept in fixed slots, a table's slots in table order
and its shards in shard order, updated as tables are taken off and put back, rather than gathered again from
every table for each swap looked for (20,000 tables: most of a move's time). Empty slots are masked, so the
shards are scanned in the order a gathering would list them and the same swap wins, ties included
(:func:`best_swap`).
"""

from __future__ import annotations

import weakref
from typing import Any, List, Optional, Tuple

import numpy as np

from runner.plan.torchrec_adapter.balanced.effort import SWAP_SCAN
from runner.plan.torchrec_adapter.balanced.problem import DEVICE, Choice, Problem

_LAYOUT: List[Tuple[Any, Tuple[np.ndarray, np.ndarray, np.ndarray]]] = []
"""The latest problem (a weak reference: this cache does not keep its numbers) and its slots: (slot offset per
table, table per slot, shard per slot)."""


def _layout(problem: Problem) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per table its first slot (as many slots as its largest device option has shards), and per slot its table
    and shard index."""
    if not (_LAYOUT and _LAYOUT[0][0]() is problem):
        width = np.array([max((len(c.perf) for c in options if c.kind == DEVICE), default=0)
                          for options in problem.tables], dtype=np.int64)
        offset = np.concatenate([[0], np.cumsum(width)]).astype(np.int64)
        table = np.repeat(np.arange(len(width), dtype=np.int64), width)
        shard = np.arange(len(table), dtype=np.int64) - offset[table]
        _LAYOUT[:] = [(weakref.ref(problem), (offset, table, shard))]
    return _LAYOUT[0][1]


class Shards:
    """Every device shard placed in a state: its rank, perf and storage, in fixed slots (see the module doc)."""

    def __init__(self, problem: Problem) -> None:
        self.offset, self.table, self.shard = _layout(problem)
        slots = len(self.table)
        self.used = np.zeros(slots, dtype=bool)
        self.rank = np.zeros(slots, dtype=np.int64)
        self.perf = np.full(slots, np.inf)
        self.mem = np.zeros((slots, problem.capacity.shape[1]), dtype=np.int64)
        self.count = 0  # device shards placed

    def put(self, t: int, c: Choice, ranks: np.ndarray) -> None:
        if c.kind != DEVICE:
            return
        lo = int(self.offset[t])
        hi = lo + len(c.perf)
        self.used[lo:hi] = True
        self.rank[lo:hi] = ranks
        self.perf[lo:hi] = c.perf
        self.mem[lo:hi] = c.mem
        self.count += hi - lo

    def take(self, t: int, c: Choice, ranks: np.ndarray) -> None:
        if c.kind != DEVICE:
            return
        lo = int(self.offset[t])
        hi = lo + len(c.perf)
        self.used[lo:hi] = False
        self.perf[lo:hi] = np.inf
        self.mem[lo:hi] = 0
        self.count -= hi - lo


def best_swap(shards: Shards, load: np.ndarray, used: np.ndarray, capacity: np.ndarray, r: int,
              limit: float) -> Tuple[Optional[Tuple[float, int, int, int, int]], int]:
    """The swap of a device shard of rank ``r`` with a smaller device shard elsewhere that leaves both ranks
    below ``limit``, with the lowest such load: (load, table a, shard a, table b, shard b), or None; and the
    work it took (:mod:`.effort`: a unit and one more per :data:`.effort.SWAP_SCAN` shards scanned, per shard
    of ``r``)."""
    if not shards.count:
        return None, 0
    on_r = shards.used & (shards.rank == r)
    mine = np.flatnonzero(on_r)
    work = len(mine) * (1 + shards.count // SWAP_SCAN)
    best: Optional[Tuple[float, int, int, int, int]] = None
    pb, rb = shards.perf, shards.rank
    elsewhere = shards.used & ~on_r
    load_b = load[rb] - pb  # each other shard's rank without it (empty slots: -inf, never chosen)
    for k in mine:
        pa = pb[k]
        score = np.maximum(load[r] - pa + pb, load_b + pa)
        candidates = np.flatnonzero(elsewhere & (pb < pa) & (score < limit))
        if not len(candidates):
            continue
        ma, mb = shards.mem[k], shards.mem[candidates]
        rc = rb[candidates]
        fit = ((used[r] - ma + mb) <= capacity[r]).all(1) & ((used[rc] - mb + ma) <= capacity[rc]).all(1)
        if fit.any():
            found = candidates[fit]
            i = int(found[np.argmin(score[found])])
            if best is None or score[i] < best[0]:
                best = (float(score[i]), int(shards.table[k]), int(shards.shard[k]), int(shards.table[i]),
                        int(shards.shard[i]))
    return best, work
