"""The ``balanced`` proposer's search: the plan whose busiest rank has the least estimated work.

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

The search (:func:`improve`), from a start of its own (:func:`construct`: the cheapest option of each table,
the largest first, each on the least loaded ranks where it fits) and from any plan handed to it (TorchRec's
answer, other points' plans): repeatedly take the busiest rank and make the move that lowers it most while
every rank it touches stays below the old maximum: move one of its shards, swap one with a smaller shard
elsewhere, or take one of its tables off and place it again with any of its options (TorchRec's
row-wise/table-row-wise/column-wise alternatives). Each move lowers the sorted vector of rank loads, so
the search ends; it stops at a local optimum or at its time budget.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

import numpy as np

UNIFORM, DEVICE, HOST_UNIFORM, HOST, MULTI_HOST = range(5)
REL_EPS = 1e-9  # a move must lower the busiest rank by more than this fraction of its load
ACCEPT_WORSE = 0.0


@dataclass
class Choice:
    """One sharding option of a table: its placement rule, each shard's perf (ms) and storage (bytes)."""

    kind: int
    perf: np.ndarray  # (shards,) float64
    mem: np.ndarray  # (shards, kinds) int64: hbm, ddr (ssd) per shard


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


def loads(problem: Problem, solution: Solution) -> Tuple[np.ndarray, np.ndarray]:
    """Each rank's summed shard perf and storage under ``solution``."""
    load = np.zeros(problem.world)
    used = np.zeros_like(problem.capacity)
    for t, (o, ranks) in enumerate(zip(solution.picks, solution.ranks, strict=True)):
        c = problem.tables[t][o]
        np.add.at(load, ranks, c.perf)
        np.add.at(used, ranks, c.mem)
    return load, used


def rating(problem: Problem, solution: Solution) -> float:
    """TorchRec's rating: the busiest rank's summed shard perf."""
    return float(loads(problem, solution)[0].max())


def valid(problem: Problem, solution: Solution) -> Optional[str]:
    """None when every shard is placed by its option's rule and every rank's storage is within capacity;
    else what is wrong."""
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
    _, used = loads(problem, solution)
    if (used > problem.capacity).any():
        return f"rank {int(np.flatnonzero((used > problem.capacity).any(1))[0])}: storage over capacity"
    return None


def _fits(used: np.ndarray, mem: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    return ((used + mem) <= capacity).all(-1)


def place(problem: Problem, c: Choice, load: np.ndarray, used: np.ndarray) -> Optional[np.ndarray]:
    """Ranks for ``c``'s shards by its rule, on the least loaded ranks where they fit (the largest shard
    first); None where it fits nowhere. ``load`` and ``used`` are not changed."""
    w, local, cap = problem.world, problem.local, problem.capacity
    if c.kind == UNIFORM:
        return np.arange(w) if len(c.perf) == w and _fits(used, c.mem, cap).all() else None
    if c.kind == DEVICE:
        return _place_devices(c, np.arange(w), load, used, cap)
    hosts = w // local
    if c.kind == HOST_UNIFORM:
        if len(c.perf) != local:
            return None
        ok = _fits(used.reshape(hosts, local, -1), c.mem, cap.reshape(hosts, local, -1)).all(1)
        if not ok.any():
            return None
        score = np.where(ok, (load.reshape(hosts, local) + c.perf).max(1), np.inf)
        return int(np.argmin(score)) * local + np.arange(local)
    if c.kind == HOST:
        best, best_score = None, np.inf
        for h in range(hosts):
            ranks = _place_devices(c, np.arange(h * local, (h + 1) * local), load, used, cap)
            if ranks is not None:
                score = _after(load, ranks, c.perf).max()
                if score < best_score:
                    best, best_score = ranks, score
        return best
    return _place_multi_host(c, load, used, cap, local)


def _after(load: np.ndarray, ranks: np.ndarray, perf: np.ndarray) -> np.ndarray:
    out = load[ranks].copy()
    for i, r in enumerate(ranks):  # shards of one option may share a rank
        out[i] = load[r] + perf[ranks == r].sum()
    return out


def _place_devices(c: Choice, pool: np.ndarray, load: np.ndarray, used: np.ndarray,
                   cap: np.ndarray) -> Optional[np.ndarray]:
    lo, us = load[pool].copy(), used[pool].copy()
    ranks = np.empty(len(c.perf), dtype=np.int64)
    for j in np.argsort(-c.perf, kind="stable"):
        ok = _fits(us, c.mem[j], cap[pool])
        if not ok.any():
            return None
        i = int(np.argmin(np.where(ok, lo, np.inf)))
        ranks[j] = pool[i]
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
        ok = free & _fits(us, c.mem[sl], capacity).all(1)
        if not ok.any():
            return None
        h = int(np.argmin(np.where(ok, (lo + c.perf[sl]).max(1), np.inf)))
        free[h] = False
        ranks[sl] = h * local + np.arange(local)
    return ranks


def _storage_share(problem: Problem, c: Choice) -> float:
    """The largest fraction of one rank's capacity, of any storage kind, that ``c`` takes where it lands."""
    cap = np.maximum(problem.capacity.max(0), 1)
    if c.kind == UNIFORM:
        return float((c.mem / np.maximum(problem.capacity, 1)).max())
    return float((c.mem / cap).max())


def construct(problem: Problem, by_storage: bool = False, rng: Optional[random.Random] = None) -> Optional[Solution]:
    """A start: each table's option of least total perf (``by_storage``: of least storage share per rank,
    for memory-bound problems), uniform ones first, then the rest largest shard (or storage) first, each
    placed by :func:`place`, the next option tried where one fits nowhere; None where a table fits nowhere.
    With ``rng``: the tables in a random order, each option tried in a random order (for tight storage)."""
    tables = problem.tables

    def cost(t: int, o: int) -> Tuple[float, float]:
        c = tables[t][o]
        return (_storage_share(problem, c), c.perf.sum()) if by_storage else (c.perf.sum(), 0.0)

    choose = [min(range(len(options)), key=lambda o, t=t: cost(t, o)) for t, options in enumerate(tables)]
    load, used = np.zeros(problem.world), np.zeros_like(problem.capacity)
    picks, ranks = list(choose), [np.empty(0, dtype=np.int64)] * len(tables)

    def size(t: int) -> float:
        c = tables[t][picks[t]]
        return _storage_share(problem, c) if by_storage else c.perf.max(initial=0.0)

    order = sorted(range(len(tables)), key=lambda t: (tables[t][picks[t]].kind != UNIFORM, -size(t)))
    if rng is not None:
        rng.shuffle(order)
    for t in order:
        tried = [picks[t]] + sorted((o for o in range(len(tables[t])) if o != picks[t]), key=lambda o: cost(t, o))
        if rng is not None:
            rng.shuffle(tried)
        for o in tried:
            found = place(problem, tables[t][o], load, used)
            if found is not None:
                picks[t], ranks[t] = o, found
                c = tables[t][o]
                np.add.at(load, found, c.perf)
                np.add.at(used, found, c.mem)
                break
        else:
            return None
    return Solution(picks, ranks)


@dataclass
class _State:
    problem: Problem
    solution: Solution
    load: np.ndarray = field(init=False)
    used: np.ndarray = field(init=False)
    members: List[set] = field(init=False)  # per rank, the tables with a shard there

    def __post_init__(self) -> None:
        self.load, self.used = loads(self.problem, self.solution)
        self.members = [set() for _ in range(self.problem.world)]
        for t, ranks in enumerate(self.solution.ranks):
            for r in set(ranks.tolist()):
                self.members[r].add(t)

    def choice(self, t: int) -> Choice:
        return self.problem.tables[t][self.solution.picks[t]]

    def take(self, t: int) -> None:
        c, ranks = self.choice(t), self.solution.ranks[t]
        np.subtract.at(self.load, ranks, c.perf)
        np.subtract.at(self.used, ranks, c.mem)
        for r in set(ranks.tolist()):
            self.members[r].discard(t)

    def put(self, t: int, o: int, ranks: np.ndarray) -> None:
        self.solution.picks[t], self.solution.ranks[t] = o, ranks
        c = self.choice(t)
        np.add.at(self.load, ranks, c.perf)
        np.add.at(self.used, ranks, c.mem)
        for r in set(ranks.tolist()):
            self.members[r].add(t)


Move = Tuple[float, int, int, np.ndarray]  # (worst load it leaves on the ranks it touches, table, option, ranks)


def _best_move(s: _State, r: int, limit: float) -> Optional[Move]:
    """The move that lowers rank ``r`` and leaves every rank it touches below ``limit``, with the lowest
    such load: a table of ``r`` placed again with any of its options, or one of its device shards moved."""
    best: Optional[Move] = None
    tables = s.problem.tables
    for t in sorted(s.members[r]):
        old_o, old_ranks = s.solution.picks[t], s.solution.ranks[t]
        old = s.choice(t)
        if old.kind == DEVICE:
            for j in np.flatnonzero(old_ranks == r):
                ok = _fits(s.used, old.mem[j], s.problem.capacity)
                ok[r] = False
                after = np.where(ok, s.load + old.perf[j], np.inf)
                q = int(np.argmin(after))
                score = max(after[q], s.load[r] - old.perf[j])
                if score < limit and (best is None or score < best[0]):
                    ranks = old_ranks.copy()
                    ranks[j] = q
                    best = (score, t, old_o, ranks)
        s.take(t)
        try:
            for o, c in enumerate(tables[t]):
                ranks = place(s.problem, c, s.load, s.used)
                if ranks is None:
                    continue
                touched = np.union1d(ranks, [r])
                after = s.load[touched].copy()
                np.add.at(after, np.searchsorted(touched, ranks), c.perf)
                score = float(after.max())
                if score < limit and (best is None or score < best[0]):
                    best = (score, t, o, ranks)
        finally:
            s.put(t, old_o, old_ranks)
    return best


def _best_swap(s: _State, r: int, limit: float) -> Optional[Tuple[float, int, int, int, int]]:
    """The swap of a device shard of rank ``r`` with a smaller device shard elsewhere that leaves both ranks
    below ``limit``, with the lowest such load: (load, table a, shard a, table b, shard b)."""
    shards = [(t, j) for t in range(len(s.solution.picks)) if s.choice(t).kind == DEVICE
              for j in range(len(s.solution.ranks[t]))]
    if not shards:
        return None
    tb = np.array([t for t, _ in shards])
    jb = np.array([j for _, j in shards])
    rb = np.array([s.solution.ranks[t][j] for t, j in shards])
    pb = np.array([s.choice(t).perf[j] for t, j in shards])
    mb = np.array([s.choice(t).mem[j] for t, j in shards])
    cap, best = s.problem.capacity, None
    for k in np.flatnonzero(rb == r):
        pa, ma = pb[k], mb[k]
        new_r = s.load[r] - pa + pb
        new_q = s.load[rb] - pb + pa
        score = np.maximum(new_r, new_q)
        ok = (rb != r) & (pb < pa) & (score < limit)
        ok &= ((s.used[r] - ma + mb) <= cap[r]).all(1) & ((s.used[rb] - mb + ma) <= cap[rb]).all(1)
        if ok.any():
            i = int(np.argmin(np.where(ok, score, np.inf)))
            if best is None or score[i] < best[0]:
                best = (float(score[i]), int(tb[k]), int(jb[k]), int(tb[i]), int(jb[i]))
    return best


def improve(problem: Problem, start: Solution, budget_s: float, max_moves: int = 100000) -> Tuple[Solution, int]:
    """Local search from ``start`` (see the module doc) until no move lowers the busiest rank, ``max_moves``
    moves or ``budget_s`` seconds; the solution found and the moves made."""
    s = _State(problem, start.copy())
    deadline = time.perf_counter() + budget_s
    moves = 0
    while moves < max_moves and time.perf_counter() < deadline:
        r = int(np.argmax(s.load))
        limit = s.load[r] * (1 - REL_EPS)
        move = _best_move(s, r, limit)
        swap = _best_swap(s, r, limit if move is None else min(limit, move[0]))
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
            break
        moves += 1
    return s.solution, moves


def _reinsert(s: _State, tables: List[int]) -> bool:
    """Each of ``tables`` (taken off ``s``) placed again, in order, with the option and placement that leave
    the least load on the ranks they touch (then the least total perf); False where one fits nowhere."""
    for t in tables:
        best: Optional[Tuple[float, float, int, np.ndarray]] = None
        for o, c in enumerate(s.problem.tables[t]):
            ranks = place(s.problem, c, s.load, s.used)
            if ranks is None:
                continue
            key = (float(_after(s.load, ranks, c.perf).max()), float(c.perf.sum()))
            if best is None or key < best[:2]:
                best = (*key, o, ranks)
        if best is None:
            return False
        s.put(t, best[2], best[3])
    return True


def perturb(problem: Problem, start: Solution, budget_s: float, rounds: int, seed: int = 0) -> Tuple[Solution, int]:
    """Ruin and recreate around :func:`improve`'s local optimum, for ``rounds`` rounds or ``budget_s``: take
    off one to three tables of the busiest rank and up to two others (chosen by a generator seeded with
    ``seed``), place them again (:func:`_reinsert`, the largest first), improve; keep the result when it
    rates no worse (so the search walks plateaus) and the best seen. The best solution and rounds run."""
    rng = random.Random(seed)
    deadline = time.perf_counter() + budget_s
    best, _ = improve(problem, start, budget_s)
    best_rating = rating(problem, best)
    current, current_rating = best, best_rating
    done = 0
    while done < rounds and time.perf_counter() < deadline:
        done += 1
        s = _State(problem, current.copy())
        r = int(np.argmax(s.load))
        mine = sorted(s.members[r])
        chosen = set(rng.sample(mine, min(len(mine), rng.randint(1, 3))))
        if rng.random() < 0.5:  # with the tables of a less loaded rank, to trade places with
            q = int(rng.choice(np.argsort(s.load)[: max(1, problem.world // 4)]))
            chosen |= set(s.members[q])
        chosen |= set(rng.sample(range(len(problem.tables)), min(len(problem.tables), rng.randint(0, 2))))
        for t in chosen:
            s.take(t)
        order = sorted(chosen, key=lambda t: -max(c.perf.max(initial=0.0) for c in problem.tables[t]))
        if not _reinsert(s, order):
            continue
        found, _ = improve(problem, s.solution, max(deadline - time.perf_counter(), 0.0))
        found_rating = rating(problem, found)
        if found_rating <= current_rating * (1 + REL_EPS + ACCEPT_WORSE * (1 - done / rounds)):
            current, current_rating = found, found_rating
        if found_rating < best_rating * (1 - REL_EPS):
            best, best_rating = found, found_rating
    return best, done


def _placements(problem: Problem, c: Choice, load: np.ndarray, used: np.ndarray) -> List[np.ndarray]:
    """Every placement of ``c`` by its rule that fits (one order of the ranks of shards that are alike)."""
    w, local, cap = problem.world, problem.local, problem.capacity
    hosts, k = w // local, len(c.perf)

    found: List[np.ndarray] = []
    if c.kind == UNIFORM:
        found = [np.arange(w)]
    elif c.kind in (DEVICE, HOST):
        pools = [np.arange(w)] if c.kind == DEVICE else [np.arange(h * local, (h + 1) * local) for h in range(hosts)]
        alike = bool((c.perf == c.perf[0]).all() and (c.mem == c.mem[0]).all())
        for pool in pools:
            if alike:  # shards alike: one order of their ranks is enough
                found += [np.array(p) for p in itertools.combinations_with_replacement(pool.tolist(), k)]
            else:
                found += [np.array(p) for p in itertools.product(pool.tolist(), repeat=k)]
    elif c.kind == HOST_UNIFORM and k == local:
        found = [h * local + np.arange(local) for h in range(hosts)]
    elif c.kind == MULTI_HOST and k % local == 0 and k // local <= hosts:
        found = [np.concatenate([h * local + np.arange(local) for h in hs])
                 for hs in itertools.permutations(range(hosts), k // local)]
    out = []
    for ranks in found:
        after = used.copy()
        np.add.at(after, ranks, c.mem)
        if (after <= cap).all():
            out.append(ranks)
    return out


def exact(problem: Problem, incumbent: float, node_limit: int) -> Tuple[Optional[Solution], bool]:
    """Branch and bound over every option and placement (the largest tables first, cheap options first;
    cut where the busiest rank or the mean rank is no better than the best so far): a
    solution strictly better than ``incumbent`` or None, and whether the search was complete (then nothing
    better than what it returns, or than ``incumbent``, exists) within ``node_limit`` nodes."""
    tables = problem.tables
    order = sorted(range(len(tables)), key=lambda t: -max(c.perf.max(initial=0.0) for c in tables[t]))
    rest = [sum(min(c.perf.sum() for c in tables[t]) for t in order[i:]) for i in range(len(order) + 1)]
    best: List[Any] = [incumbent * (1 - REL_EPS), None]
    load, used = np.zeros(problem.world), np.zeros_like(problem.capacity)
    picks, ranks = [0] * len(tables), [np.empty(0, dtype=np.int64)] * len(tables)
    nodes = [0]

    def go(i: int) -> bool:
        nodes[0] += 1
        if nodes[0] > node_limit:
            return False
        if max(load.max(initial=0.0), (load.sum() + rest[i]) / problem.world) >= best[0]:
            return True
        if i == len(order):
            best[:] = [float(load.max()), Solution(list(picks), [r.copy() for r in ranks])]
            return True
        t = order[i]
        for o in sorted(range(len(tables[t])), key=lambda o: tables[t][o].perf.sum()):
            c = tables[t][o]
            for r in _placements(problem, c, load, used):
                np.add.at(load, r, c.perf)
                np.add.at(used, r, c.mem)
                picks[t], ranks[t] = o, r
                complete = go(i + 1)
                np.subtract.at(load, r, c.perf)
                np.subtract.at(used, r, c.mem)
                if not complete:
                    return False
        return True

    complete = go(0)
    return best[1], complete
