"""A lower bound on the estimated step of any valid plan: how far a plan can be from the best.

The estimated step of a plan is TorchRec's rating: its busiest rank's summed shard perf. Every valid plan
picks one sharding option per table, so, with the options TorchRec's enumerator gave (only those whose
every shard fits on some device after the reservation):

- **simple**: the larger of (a) the sum over tables of their cheapest option's total perf, divided by the
  ranks (the busiest rank carries at least the mean), and (b) the largest, over tables, of their cheapest
  largest-shard perf (some rank holds that shard);
- **LP**: the linear-programming relaxation of the same choice with the storage limits: fractions
  ``x[t, o]`` of each table's options summing to one, ``T`` at least the mean rank's perf and at least each
  table's largest shard, the chosen options' storage of each kind within all devices' capacity together,
  and the uniform (row-wise, data-parallel) shards within each device's capacity. Every valid plan is a
  0/1 point of it, so its optimum (SciPy's HiGHS) is at most any plan's rating; it is taken a hair lower
  (:data:`LP_MARGIN`) so that the solver's tolerance cannot lift it above one.

:func:`lower_bound` gives the larger of the two, raised by the configuration bound (:mod:`.config_bound`) where
shards are whole. docs/planning.md defines them for users.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np

from runner.plan.torchrec_adapter.balanced.config_bound import LP_MARGIN, config_bound
from runner.plan.torchrec_adapter.balanced.problem import UNIFORM, Problem, placeable, simple_bound, simple_parts

if TYPE_CHECKING:
    from torchrec.distributed.planner.types import Enumerator, StorageReservation

__all__ = ["lower_bound", "lower_bound_of", "lp_bound", "plan_bound", "simple_bound"]



def lp_bound(problem: Problem, kept: Optional[List[List[int]]] = None) -> float:
    """The LP relaxation's optimum (see the module doc), or nan where the solver gives none."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    kept = placeable(problem) if kept is None else kept
    if any(not k for k in kept):
        return float("nan")
    cols = [(t, o) for t, k in enumerate(kept) for o in k]
    n, tables, w = len(cols) + 1, len(problem.tables), problem.world  # the last column is T
    kinds = problem.capacity.shape[1]
    choices = [problem.tables[t][o] for t, o in cols]
    every = np.arange(len(cols))
    parts: List[Tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (rows, columns, values) of A_ub, row by row
    b: List[float] = []

    def row(columns: np.ndarray, values: np.ndarray, rhs: float) -> None:
        parts.append((np.full(len(columns), len(b)), columns, values))
        b.append(rhs)

    last = np.array([n - 1])
    row(np.append(every, last), np.append([c.total for c in choices], -float(w)), 0.0)
    table_of = np.array([t for t, _ in cols])
    largest = np.array([c.largest for c in choices], dtype=float)
    for members in np.split(every, np.flatnonzero(np.diff(table_of)) + 1):
        row(np.append(members, last), np.append(largest[members], -1.0), 0.0)
    scale = np.maximum(problem.capacity.sum(0).astype(float), 1.0)
    totals = np.array([c.storage for c in choices], dtype=float).reshape(len(choices), kinds)
    for k in range(kinds):
        row(every, totals[:, k] / scale[k], 1.0)
    uniform = [i for i, c in enumerate(choices) if c.kind == UNIFORM and len(c.mem) == w]
    if uniform:
        # the uniform shards' storage per device: one row per distinct (device, kind) where they could bind
        columns = np.array(uniform)
        for k in range(kinds):
            cap = np.maximum(problem.capacity[:, k].astype(float), 1.0)
            binding = np.unique([_fullest(choices[i].mem, k, cap) for i in uniform])
            for d in binding:
                row(columns, np.array([float(choices[i].mem[d, k]) for i in uniform]) / cap[d], 1.0)
    rows, col_of, data = (np.concatenate(x) for x in zip(*parts, strict=True))
    eq_rows, eq_cols = table_of, every
    a_ub = coo_matrix((data, (rows, col_of)), shape=(len(b), n)).tocsr()
    a_eq = coo_matrix((np.ones(len(cols)), (eq_rows, eq_cols)), shape=(tables, n)).tocsr()
    cost = np.zeros(n)
    cost[-1] = 1.0
    found = linprog(cost, A_ub=a_ub, b_ub=np.array(b), A_eq=a_eq, b_eq=np.ones(tables),
                    bounds=[(0.0, 1.0)] * (n - 1) + [(0.0, None)], method="highs")
    if found.status != 0:
        return float("nan")
    return float(found.fun) * (1 - LP_MARGIN)


def _fullest(mem: np.ndarray, k: int, cap: np.ndarray) -> int:
    """``argmax(mem[:, k] / cap)``: the device a uniform option fills most of, in kind ``k``. Every shard the same (a
    broadcast view) and more than 0: the first device of least capacity, as the division finds it (distinct whole
    capacities below 2**52 give distinct quotients, in the reverse order)."""
    m = mem[0, k] if len(mem) and mem.strides[0] == 0 else None
    if m is not None and 0 < m < 2**52 and cap.max() < 2**52:
        return int(np.argmin(cap))
    return int(np.argmax(mem[:, k] / cap))


def lower_bound(problem: Problem) -> float:
    """The larger of :func:`simple_bound` and :func:`lp_bound`, raised where shards are whole by
    :func:`.config_bound.config_bound` (nan where no option of a table fits)."""
    return lower_bound_of(problem)[0]


def lower_bound_of(problem: Problem) -> Tuple[float, str]:
    """:func:`lower_bound` and which bound gave it: ``mean rank``, ``largest shard``, ``LP relaxation`` or
    ``whole shards`` (the configuration bound), for the report."""
    kept = placeable(problem)
    mean, largest = simple_parts(problem, kept)
    simple = max(mean, largest)  # simple_bound's, from its parts (nan where some table fits nowhere)
    lp = lp_bound(problem, kept)
    start = simple if lp != lp else max(simple, lp)
    found = config_bound(problem, kept, start)
    if found > start:
        return found, "whole shards"
    if lp == lp and lp > simple * (1 + 1e-9):
        return found, "LP relaxation"
    if simple != simple:  # some table fits nowhere: no bound
        return found, ""
    return found, "mean rank" if mean >= largest else "largest shard"


def plan_bound(enumerator: Optional[Enumerator],
               reservation: Optional[StorageReservation]) -> Optional[Tuple[float, str]]:
    """The lower bound (:mod:`.bound`) on the rating of any plan of the options ``enumerator`` enumerated last
    on the devices ``reservation`` reserved last, and which bound it is (:func:`lower_bound_of`); None where either is
    unknown."""
    space = getattr(enumerator, "last_stored_search_space", None)
    reserved = getattr(reservation, "_last_reserved_topology", None)
    if not space or reserved is None:
        return None
    from runner.plan.torchrec_adapter.balanced import bound_ahead
    from runner.plan.torchrec_adapter.balanced.proposer import (  # the search's problem of the options
        capacity_of,
        problem_of,
    )

    key = _key(space, reserved.local_world_size, capacity_of(reserved))
    found = _KNOWN.get(key)
    if found is None:
        found = bound_ahead.taken(space, reserved)  # computed beside the search, where it was
    if found is None:
        found = lower_bound_of(problem_of(space, reserved)[0])
    _KNOWN[key] = found
    return found if found[0] == found[0] else None


# bounds found in this process, by the options (the same object: reused options are handed out as they are) and
# the devices' storage: a sweep planned together asks again for each point in its second pass
_KNOWN: Dict[Tuple[int, int, bytes], Tuple[float, str]] = {}
_KEPT: List[Any] = []  # the options of those keys, kept alive so that their ids stay theirs


def known(space: Any, problem: Problem) -> bool:
    """Whether the bound for these options on the problem's devices was found in this process already."""
    return _key(space, problem.local, problem.capacity) in _KNOWN


def remember_bound(space: Any, problem: Problem, found: Tuple[float, str]) -> None:
    """Keep ``found`` as the bound for these options on the problem's devices (a sweep's point whose bound its
    first pass found, in another process)."""
    _KNOWN[_key(space, problem.local, problem.capacity)] = found


def _key(space: Any, local: int, capacity: np.ndarray) -> Tuple[int, int, bytes]:
    if not any(s is space for s in _KEPT):
        _KEPT.append(space)
        if len(_KEPT) > KEEP:  # the oldest options let go, with their bounds
            gone = id(_KEPT.pop(0))
            for k in [k for k in _KNOWN if k[0] == gone]:
                del _KNOWN[k]
    return id(space), local, np.ascontiguousarray(capacity).tobytes()


KEEP = 16  # option sets whose bounds are kept (a sweep's bandwidths: their options are kept for reuse anyway)
