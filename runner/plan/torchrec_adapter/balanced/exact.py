"""The ``balanced`` proposer's exact search: branch and bound over every option and placement of a small
:class:`.problem.Problem` (:func:`exact`), used before the local search (:mod:`.moves`) where the problem has
few tables."""

from __future__ import annotations

import itertools
from typing import Any, List, Optional, Tuple

import numpy as np

from runner.plan.torchrec_adapter.balanced.problem import (
    DEVICE,
    HOST,
    HOST_UNIFORM,
    MULTI_HOST,
    REL_EPS,
    UNIFORM,
    Choice,
    Problem,
    Solution,
)


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
