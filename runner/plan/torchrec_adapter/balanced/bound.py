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

:func:`lower_bound` gives the larger of the two, raised by the configuration bound (below) where
shards are whole. docs/planning.md defines them for users.

One concept in three parts, kept together because each needs the others' numbers: the simple and LP bounds, the
configuration bound that knows shards are whole (it starts from the LP bound and shares its margin), and the bound
computed beside the search in a fork (the same call, its answer matched to the same options).

**The configuration bound** knows shards are whole: a linear program over the ranks' contents. The LP bound splits
shards as fractions, so where a rank holds only two or three large shards
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

**Beside the search**, on the core the search leaves idle. The bound reads only the search's problem, which is
known before the search starts; at 5,384
tables on 1,024 GPUs its linear program takes about 2 s, after a 5 s search, on a machine where one core
searches and the other waits. :func:`start_bound` forks the planning process once the problem is built (only where
a fork is safe and there is a core to spare: :func:`runner.runtime.cores.may_fork`); the fork computes the bound
with the same call and sends it back; :func:`taken` gives it to :func:`plan_bound` for the same options
and devices. Where the fork fails or dies, the bound is computed here as before: the same number either way.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from runner.plan.torchrec_adapter.balanced.problem import UNIFORM, Problem, placeable, simple_bound, simple_parts
from runner.plan.torchrec_adapter.balanced.proposer import capacity_of, problem_of
from runner.runtime.process_end import fork_answer, give_up, helper_answer

if TYPE_CHECKING:
    from torchrec.distributed.planner.types import Enumerator, StorageReservation

__all__ = ["lower_bound", "lower_bound_of", "lp_bound", "plan_bound", "simple_bound"]


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
    :func:`config_bound` (nan where no option of a table fits)."""
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
    """The lower bound (:func:`lower_bound`) on the rating of any plan of the options ``enumerator`` enumerated last
    on the devices ``reservation`` reserved last, and which bound it is (:func:`lower_bound_of`); None where either is
    unknown."""
    space = getattr(enumerator, "last_stored_search_space", None)
    reserved = getattr(reservation, "_last_reserved_topology", None)
    if not space or reserved is None:
        return None
    key = _key(space, reserved.local_world_size, capacity_of(reserved))
    found = _KNOWN.get(key)
    if found is None:
        found = taken(space, reserved)  # computed beside the search, where it was
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


WAIT_STEP_S = 1.0  # the wait for it says so this often (the job prints a line every 10 s)

_AHEAD: List[Any] = []  # [search space, its devices, pid, the answer's pipe, progress], the latest only


def start_bound(search_space: List[Any], problem: Problem, bound: Callable[[Problem], Tuple[float, str]],
                progress: Optional[Callable[[str], None]] = None) -> None:
    """Fork a process that computes ``bound(problem)`` (:func:`lower_bound_of`) for the problem of these
    options; ``progress`` is told, every second, that the plan waits for it (where it does). Where no fork can be
    made, nothing: the bound is computed here when asked."""
    end_bound_fork()
    try:
        pid, answer = fork_answer(lambda: bound(problem))
    except OSError:
        return
    _AHEAD[:] = [search_space, Problem([], problem.capacity, problem.local), pid, answer, progress]  # its devices


def taken(search_space: Any, reserved: Any) -> Optional[Tuple[float, str]]:
    """The bound the fork computed for these options (the same object) on devices like these (the same
    storage left), waiting for it; None where none was started for them or the fork gave none."""
    if not _AHEAD or _AHEAD[0] is not search_space or not _same_devices(_AHEAD[1], reserved):
        end_bound_fork()
        return None
    pid, answer, progress = _AHEAD[2:]
    _AHEAD.clear()
    said = [time.monotonic()]

    def meanwhile() -> None:
        if progress is not None and time.monotonic() - said[0] >= WAIT_STEP_S:
            said[0] = time.monotonic()
            progress("the plan's lower bound (computed beside the search)")

    found = helper_answer(pid, answer, meanwhile, "the lower bound's process")  # None: computed here
    return None if found is None else (float(found[0]), str(found[1]))


def _same_devices(devices: Problem, reserved: Any) -> bool:  # the bound's devices are like ``reserved``?
    return devices.local == reserved.local_world_size and np.array_equal(devices.capacity, capacity_of(reserved))


def end_bound_fork() -> None:
    """End the fork (if any is left) and drop what it was for."""
    if not _AHEAD:
        return
    pid, answer = _AHEAD[2], _AHEAD[3]
    _AHEAD.clear()
    give_up(pid, answer)
