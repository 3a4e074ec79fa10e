"""A lower bound that knows shards are whole: the configuration linear program over the ranks' contents.

The LP bound (:mod:`.bound`) splits shards as fractions, so where a rank holds only two or three large shards
(6,400 tables on 2,048 GPUs: shards of 166.7, 83.4, 42.0 and 21.5 ms, against a mean rank of 243.2 ms) it can
sit several per cent below every plan. This one asks, for a busiest rank ``T``, whether the ranks can hold the
tables at all:

- a shard of at least :data:`LARGE` x ``T`` is an *item*, placed whole; smaller shards are *volume*, which may
  be split. Items of nearly one size (within :data:`SAME_SIZE`) count as the smallest of them, the rest of
  each going to volume;
- a *pattern* is a multiset of item sizes that fits within ``T`` on one rank; ``x[p]`` ranks take pattern
  ``p`` (at most the ranks in all), each with ``T`` minus its items' sum left for volume;
- ``y[t, o]``: table ``t`` takes option ``o`` (summing to one per table); the chosen options' items of each
  size are at most the patterns' slots of that size, and their volume at most the patterns' room.

Every valid plan gives a 0/1 point of it at its own busiest rank (placement rules and storage are dropped: a
relaxation), so where the program has no solution for ``T`` no plan's busiest rank is ``T`` or less. Whether it
does is monotone in ``T``; the bound is the largest ``T`` found infeasible by bisection (SciPy's HiGHS, at most
:data:`MAX_SOLVES` solves: counted, not timed, so that the bound is the same on any machine), a hair lower
(:data:`LP_MARGIN`). A solver status other than "feasible" or "infeasible", or more patterns than
:data:`MAX_PATTERNS` at every item threshold tried, proves nothing: the bound is then the one it started from.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from runner.plan.torchrec_adapter.balanced.problem import Problem

LP_MARGIN = 1e-6  # relative: a bound from a solver is taken this much lower (HiGHS's feasibility tolerance: 1e-7)
LARGE = (1 / 16, 1 / 8, 1 / 4)  # item thresholds tried, as fractions of T, until the patterns are few enough
SAME_SIZE = 1e-3  # item sizes within this fraction of the smallest of them count as that one
MAX_PATTERNS = 20_000
TOP = 64  # each option's largest shards considered as items; the rest are volume
MAX_SOLVES = 24  # the bisection stops here with what it has proved (9 solves, 3 s at 6,400 tables on 2,048 GPUs)
FIRST_STEP, GROWTH, PRECISION = 0.002, 0.08, 0.001  # relative: the first probe above the start, the search's
# steps upward, and where the bisection stops


def _options(problem: Problem, kept: List[List[int]]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each kept option's table, total perf and largest :data:`TOP` shards (descending, zero-padded)."""
    table, total, top = [], [], []
    for t, k in enumerate(kept):
        for o in k:
            perf = problem.tables[t][o].perf
            largest = np.sort(perf)[::-1][:TOP]
            table.append(t)
            total.append(float(perf.sum()))
            top.append(np.pad(largest, (0, TOP - len(largest))))
    return np.array(table), np.array(total), np.array(top).reshape(len(table), TOP)


def _patterns(sizes: np.ndarray, limit: float) -> Optional[List[Tuple[Tuple[int, ...], float]]]:
    """Every multiset of ``sizes`` (descending) whose sum is within ``limit``: (counts, sum); None past
    :data:`MAX_PATTERNS`."""
    found: List[Tuple[Tuple[int, ...], float]] = []
    counts = [0] * len(sizes)

    def walk(i: int, room: float) -> bool:
        if i >= len(sizes) - 1:  # the last size (or none): each count of it, without a level more
            most = int(room // sizes[i]) if i < len(sizes) else 0
            head = tuple(counts[:i])
            found.extend(((*head, n) if i < len(sizes) else head, limit - room + n * (sizes[i] if n else 0.0))
                         for n in range(most, -1, -1))
            return len(found) <= MAX_PATTERNS
        for n in range(int(room // sizes[i]), -1, -1):
            counts[i] = n
            if not walk(i + 1, room - n * sizes[i]):
                return False
        counts[i] = 0
        return True

    return found if walk(0, limit) else None


def feasible(problem: Problem, options: Tuple[np.ndarray, np.ndarray, np.ndarray], target: float) -> Optional[bool]:
    """Whether the configuration program has a solution with every rank within ``target`` (module doc); None
    where it cannot tell (too many patterns, or the solver gave no answer)."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    table, total, top = options
    tables, limit = len(problem.tables), target * (1 + 1e-9)  # a hair of room: more plans allowed, still a bound
    mins = np.full(tables, np.inf)
    np.minimum.at(mins, table, total)
    room = problem.world * limit - mins.sum()
    usable = (top[:, 0] <= limit) & (total - mins[table] <= room)  # an option past either fits in no plan
    if room < 0 or len(np.unique(table[usable])) < tables:
        return False
    table, total, top = table[usable], total[usable], top[usable]
    for large in LARGE:
        items = np.where(top >= large * target, top, 0.0)
        sizes = np.unique(items[items > 0])
        reps = sizes.copy()
        for i in range(1, len(sizes)):  # nearly equal sizes count as the smallest of their run
            reps[i] = reps[i - 1] if sizes[i] <= reps[i - 1] * (1 + SAME_SIZE) else sizes[i]
        classes = np.unique(reps)[::-1]
        patterns = _patterns(classes, limit)
        if patterns is not None:
            break
    else:
        return None
    rounded = np.where(items > 0, reps[np.searchsorted(sizes, items).clip(0, len(sizes) - 1)], 0.0) if len(
        sizes) else np.zeros_like(items)  # no shard large enough to be an item: volume alone
    volume = total - rounded.sum(1)
    n_opt, n_pat, k = len(table), len(patterns), len(classes)
    counts = np.zeros((n_opt, k))
    if k:
        cls = np.searchsorted(-classes, -rounded)  # the class of each item (classes descending)
        rows, cols = np.nonzero(rounded > 0)
        np.add.at(counts, (rows, cls[rows, cols]), 1.0)
    slots = np.array([p for p, _ in patterns], dtype=float).reshape(n_pat, k)
    left = np.array([limit - s for _, s in patterns]) / target
    # rows: 0 the ranks; 1..k each item size's slots; k+1 the volume. Columns: patterns, then options.
    a_ub = np.zeros((k + 2, n_pat + n_opt))
    a_ub[0, :n_pat] = 1.0
    a_ub[1:k + 1, :n_pat] = -slots.T
    a_ub[1:k + 1, n_pat:] = counts.T
    a_ub[k + 1, :n_pat] = -left
    a_ub[k + 1, n_pat:] = volume / target
    b_ub = np.zeros(k + 2)
    b_ub[0] = problem.world
    _, table_row = np.unique(table, return_inverse=True)
    a_eq = coo_matrix((np.ones(n_opt), (table_row, n_pat + np.arange(n_opt))), shape=(tables, n_pat + n_opt))
    found = linprog(np.zeros(n_pat + n_opt), A_ub=a_ub, b_ub=b_ub, A_eq=a_eq.tocsr(), b_eq=np.ones(tables),
                    bounds=[(0.0, None)] * n_pat + [(0.0, 1.0)] * n_opt, method="highs")
    return {0: True, 2: False}.get(found.status)


def config_bound(problem: Problem, kept: List[List[int]], start: float) -> float:
    """The configuration bound (module doc), or ``start`` (a valid bound) where it proves nothing higher."""
    if not start == start or start <= 0:
        return start
    options = _options(problem, kept)
    probe = start * (1 + FIRST_STEP)
    if feasible(problem, options, probe) is not False:  # within 0.2% of the start: not worth the bisection
        return start
    low, high = probe, probe * (1 + GROWTH)
    solves = 1
    while feasible(problem, options, high) is False:  # proven infeasible: the bound is at least there
        low, high = high, high * (1 + GROWTH)
        solves += 1
        if high > 4 * start or solves >= MAX_SOLVES:
            return low * (1 - LP_MARGIN)
    solves += 1
    while high - low > PRECISION * low and solves < MAX_SOLVES:
        solves += 1
        middle = (low + high) / 2
        if feasible(problem, options, middle) is False:
            low = middle
        else:
            high = middle
    return low * (1 - LP_MARGIN)
