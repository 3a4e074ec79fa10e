"""The ``balanced`` proposer's problem: the plan whose busiest rank has the least estimated work.

TorchRec rates a plan by its busiest rank: the sum of the estimated perf of the shards placed there
(``NoopPerfModel``). Its proposers pick one sharding option per table by other criteria (the dynamic-
programming one minimises the *summed* perf within HBM bins) and its greedy partitioner places them. Here
the choice of options and their placement are searched together, on TorchRec's own numbers: each shard's
storage and perf exactly as TorchRec's enumerator and estimators gave them.

The problem, as numbers (:class:`Problem`): per table its options (:class:`Choice`), each with a placement
rule as TorchRec's partitioner keeps it (:data:`UNIFORM` shard i on rank i; :data:`DEVICE` each shard on
any rank; :data:`HOST_UNIFORM` shard j on local rank j of one host; :data:`HOST` every shard within one
host; :data:`MULTI_HOST` block b of ``local`` shards uniformly on a host of its own) and every rank's
storage capacity after the reservation. A :class:`Solution` picks an option per table and a rank per
shard.

Here: the problem's rules (:func:`valid`), TorchRec's rating (:func:`rating`), placing one option by its
rule on the least loaded ranks where it fits (:func:`place`); the first plans are :mod:`.packing`'s, the
search from them is :mod:`.moves`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

UNIFORM, DEVICE, HOST_UNIFORM, HOST, MULTI_HOST = range(5)
REL_EPS = 1e-9  # a move must lower the busiest rank by more than this fraction of its load


@dataclass
class Choice:
    """One sharding option of a table: its placement rule, each shard's perf (ms) and storage (bytes)."""

    kind: int
    perf: np.ndarray  # (shards,) float64
    mem: np.ndarray  # (shards, kinds) int64: hbm, ddr (ssd) per shard
    rows: Optional[np.ndarray] = None  # the distinct rows of ``mem``, where known (its peak read from them)
    summed: Optional[np.ndarray] = None  # ``mem.sum(0)``, where known (summed from the distinct rows)

    # read for every option by the bounds, the starts and the moves: computed once (an option over 8,192 ranks
    # has 8,192 shards; a broadcast view of one shard's numbers is read once)
    @functools.cached_property
    def total(self) -> float:
        """``perf.sum()``: the option's summed shard perf."""
        return float(self.perf.sum())

    @functools.cached_property
    def largest(self) -> float:
        """``perf.max(initial=0.0)``: its largest shard's perf."""
        return float(self.perf.max(initial=0.0))

    @functools.cached_property
    def peak(self) -> np.ndarray:
        """Each storage kind's largest shard (every shard fits within ``x`` where ``(peak <= x).all()``)."""
        if not len(self.mem):
            return np.full(self.mem.shape[1:], np.iinfo(np.int64).min)
        rows = self.rows if self.rows is not None else self.mem[:1] if self.mem.strides[0] == 0 else self.mem
        return np.asarray(rows.max(0))

    @functools.cached_property
    def storage(self) -> np.ndarray:
        """``mem.sum(0)``: the option's storage of each kind, all shards together."""
        if self.summed is not None:
            return self.summed
        if len(self.mem) and self.mem.strides[0] == 0:
            return np.asarray(self.mem[0] * len(self.mem))
        return np.asarray(self.mem.sum(0))


@dataclass
class Problem:
    """Tables' options and every rank's storage capacity; ``local`` ranks per host."""

    tables: List[List[Choice]]
    capacity: np.ndarray  # (world, kinds) int64
    local: int

    @property
    def world(self) -> int:
        return len(self.capacity)


@dataclass
class Solution:
    """An option per table and, per table, the rank of each of the option's shards."""

    picks: List[int]
    ranks: List[np.ndarray]

    def copy(self) -> Solution:
        return Solution(list(self.picks), [r.copy() for r in self.ranks])


def changed(a: Solution, b: Solution) -> bool:
    """Whether two solutions differ in an option or a rank."""
    return a.picks != b.picks or any(not np.array_equal(x, y) for x, y in zip(a.ranks, b.ranks, strict=True))


LOADS_TABLES = 256  # tables summed per call by :func:`loads` (a call's arrays: at most tens of MB at 8,192 ranks)


def loads(problem: Problem, solution: Solution) -> Tuple[np.ndarray, np.ndarray]:
    """Each rank's summed shard perf and storage under ``solution``: every shard added in table order, one call per
    :data:`LOADS_TABLES` tables (``add.at`` adds in order: the same sums as one call per table)."""
    load, used = np.zeros(problem.world), np.zeros_like(problem.capacity)
    for start in range(0, len(solution.picks), LOADS_TABLES):
        picks = solution.picks[start:start + LOADS_TABLES]
        chosen = [problem.tables[t][o] for t, o in enumerate(picks, start)]
        ranks = np.concatenate(solution.ranks[start:start + LOADS_TABLES])
        np.add.at(load, ranks, np.concatenate([c.perf for c in chosen]))
        np.add.at(used, ranks, np.concatenate([c.mem for c in chosen]))
    return load, used


def rating(problem: Problem, solution: Solution) -> float:
    """TorchRec's rating: the busiest rank's summed shard perf."""
    return float(loads(problem, solution)[0].max())


def placeable(problem: Problem) -> List[List[int]]:
    """Per table, its options whose every shard fits on some rank (by storage alone)."""
    cap = problem.capacity.max(0)
    return [[o for o, c in enumerate(options) if (c.peak <= cap).all()] for options in problem.tables]


def simple_parts(problem: Problem, kept: Optional[List[List[int]]] = None) -> Tuple[float, float]:
    """(sum of cheapest totals / ranks, max of cheapest largest shards), over placeable options (``kept``:
    :func:`placeable`, where the caller has it); nan for both where some table has none."""
    kept = placeable(problem) if kept is None else kept
    if any(not k for k in kept):
        return float("nan"), float("nan")
    total = sum(min(problem.tables[t][o].total for o in k) for t, k in enumerate(kept))
    largest = max(min(problem.tables[t][o].largest for o in k) for t, k in enumerate(kept))
    return total / problem.world, largest


def simple_bound(problem: Problem, kept: Optional[List[List[int]]] = None) -> float:
    """The larger of :func:`simple_parts` (the mean rank, the largest shard); nan where some table fits nowhere."""
    return max(simple_parts(problem, kept))  # nan, nan: nan


def valid(problem: Problem, solution: Solution) -> Optional[str]:
    """None when every shard is placed by its option's rule and every rank's storage is within capacity;
    else what is wrong."""
    return _misplaced(problem, solution) or _over_capacity(problem, loads(problem, solution)[1])


def valid_rating(problem: Problem, solution: Solution) -> Optional[float]:
    """:func:`rating` where ``solution`` is :func:`valid` (its shards summed once for both), else None."""
    if _misplaced(problem, solution) is not None:
        return None
    load, used = loads(problem, solution)
    return None if _over_capacity(problem, used) else float(load.max())


def _misplaced(problem: Problem, solution: Solution) -> Optional[str]:
    w, local = problem.world, problem.local
    for t, (o, ranks) in enumerate(zip(solution.picks, solution.ranks, strict=True)):
        c = problem.tables[t][o]
        if len(ranks) != len(c.perf) or (len(ranks) and (ranks.min() < 0 or ranks.max() >= w)):
            return f"table {t}: shards not all placed"
        hosts = ranks // local
        if c.kind == UNIFORM and not np.array_equal(ranks, np.arange(w)):
            return f"table {t}: a uniform option off its ranks"
        if c.kind == HOST_UNIFORM and not np.array_equal(ranks, hosts[0] * local + np.arange(len(ranks))):
            return f"table {t}: a host-uniform option off one host's ranks"
        if c.kind == HOST and (hosts != hosts[0]).any():
            return f"table {t}: a host option across hosts"
        if c.kind == MULTI_HOST:
            blocks = hosts.reshape(-1, local)
            if (blocks != blocks[:, :1]).any() or len(set(blocks[:, 0])) != len(blocks) or not np.array_equal(
                    ranks % local, np.tile(np.arange(local), len(blocks))):
                return f"table {t}: a grid option not one host per block"
    return None


def _over_capacity(problem: Problem, used: np.ndarray) -> Optional[str]:
    if (used > problem.capacity).any():
        return f"rank {int(np.flatnonzero((used > problem.capacity).any(1))[0])}: storage over capacity"
    return None


def fits(used: np.ndarray, mem: np.ndarray, capacity: np.ndarray, within: bool = False) -> np.ndarray:
    """Whether ``mem`` more fits within ``capacity`` on top of ``used``, per rank (TorchRec's ``fits_in``).
    ``within``: no rank is over any kind's capacity already, so only the kinds ``mem`` uses are compared (one
    column of 8,192 ranks, not three and a reduction across them)."""
    if not within or (mem < 0).any():
        return ((used + mem) <= capacity).all(-1)
    ok = np.ones(used.shape[:-1], dtype=bool)
    for k in np.flatnonzero(mem):
        ok &= used[..., k] + mem[k] <= capacity[..., k]
    return ok


def place(problem: Problem, c: Choice, load: np.ndarray, used: np.ndarray,
          target: Optional[float] = None) -> Optional[np.ndarray]:
    """Ranks for ``c``'s shards by its rule, on the least loaded ranks where they fit (the largest shard
    first); None where it fits nowhere. ``load`` and ``used`` are not changed. ``target``: shards free to go to
    any rank go to the *most* loaded rank where they stay within it (best fit), the least loaded where none does."""
    w, local, cap = problem.world, problem.local, problem.capacity
    if c.kind == UNIFORM:
        return np.arange(w) if len(c.perf) == w and ((used + c.mem) <= cap).all() else None
    if c.kind == DEVICE:
        return _place_devices(c, load, used, cap, target)
    hosts = w // local
    if c.kind == HOST_UNIFORM:
        if len(c.perf) != local:
            return None
        ok = ((used.reshape(hosts, local, -1) + c.mem) <= cap.reshape(hosts, local, -1)).all((1, 2))
        if not ok.any():
            return None
        score = np.where(ok, (load.reshape(hosts, local) + c.perf).max(1), np.inf)
        return int(np.argmin(score)) * local + np.arange(local)
    if c.kind == HOST:
        return _place_host(c, load, used, cap, local)
    return _place_multi_host(c, load, used, cap, local)


def _place_host(c: Choice, load: np.ndarray, used: np.ndarray, cap: np.ndarray, local: int) -> Optional[np.ndarray]:
    """Every shard within one host: on each host, each shard (the largest first) on its least loaded rank
    where it fits (:func:`_place_devices` on that host's ranks, for all hosts at once); the host whose
    touched ranks end least loaded (the first of equals), or None where no host holds them all."""
    hosts = len(load) // local
    lo, us = load.reshape(hosts, local).copy(), used.reshape(hosts, local, -1).copy()
    capacity = cap.reshape(hosts, local, -1)
    chosen = np.empty((hosts, len(c.perf)), dtype=np.int64)
    ok_hosts = np.ones(hosts, dtype=bool)
    rows = np.arange(hosts)
    within = not (used > cap).any()  # stays so on the hosts still in the running (a host's rows are its own)
    for j in np.argsort(-c.perf, kind="stable"):
        ok = fits(us, c.mem[j], capacity, within)
        ok_hosts &= ok.any(1)
        i = np.argmin(np.where(ok, lo, np.inf), axis=1)
        chosen[:, j] = i
        lo[rows, i] += c.perf[j]
        us[rows, i] += c.mem[j]
    if not ok_hosts.any():
        return None
    score = np.where(ok_hosts, np.take_along_axis(lo, chosen, axis=1).max(1, initial=-np.inf), np.inf)
    h = int(np.argmin(score))
    return h * local + chosen[h]


def loads_after(load: np.ndarray, ranks: np.ndarray, perf: np.ndarray) -> np.ndarray:
    """The load of each of ``ranks`` once shards of ``perf`` are placed there, one per entry."""
    out = load[ranks].copy()
    for i, r in enumerate(ranks):  # shards of one option may share a rank
        out[i] = load[r] + perf[ranks == r].sum()
    return out


def _place_devices(c: Choice, load: np.ndarray, used: np.ndarray, cap: np.ndarray,
                   target: Optional[float] = None) -> Optional[np.ndarray]:
    lo, us = load, used  # copied once a shard is placed and another is still to come (one shard: never)
    within = not (used > cap).any()  # stays so: a shard goes only where it fits
    order = np.argsort(-c.perf, kind="stable")
    ranks = np.empty(len(c.perf), dtype=np.int64)
    for n, j in enumerate(order):
        ok = fits(us, c.mem[j], cap, within)
        if not ok.any():
            return None
        under = ok & (lo + c.perf[j] <= target) if target is not None else None
        if under is not None and under.any():  # best fit: the fullest rank it leaves within the target
            i = int(np.argmax(np.where(under, lo, -np.inf)))
        else:
            i = int(np.argmin(np.where(ok, lo, np.inf)))
        ranks[j] = i
        if n + 1 < len(order):
            if lo is load:
                lo, us = load.copy(), used.copy()
            lo[i] += c.perf[j]
            us[i] += c.mem[j]
    return ranks


def _place_multi_host(c: Choice, load: np.ndarray, used: np.ndarray, cap: np.ndarray,
                      local: int) -> Optional[np.ndarray]:
    hosts = len(load) // local
    blocks = len(c.perf) // local
    if blocks * local != len(c.perf) or blocks > hosts:
        return None
    lo, us = load.reshape(hosts, local), used.reshape(hosts, local, -1)
    capacity, free = cap.reshape(hosts, local, -1), np.ones(hosts, dtype=bool)
    ranks = np.empty(len(c.perf), dtype=np.int64)
    order = np.argsort(-c.perf.reshape(blocks, local).max(1), kind="stable")
    for b in order:
        sl = slice(b * local, (b + 1) * local)
        ok = free & fits(us, c.mem[sl], capacity).all(1)
        if not ok.any():
            return None
        h = int(np.argmin(np.where(ok, (lo + c.perf[sl]).max(1), np.inf)))
        free[h] = False
        ranks[sl] = h * local + np.arange(local)
    return ranks
