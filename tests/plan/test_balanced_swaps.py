"""The balanced search's swaps over device shards kept in fixed slots (:mod:`.balanced.swaps`) find the same swap,
ties included, and count the same work, as gathering every table's device shards again for each swap did; and
the cheaper fit check of a placement gives TorchRec's ``fits_in`` answer."""

from __future__ import annotations

import random
from typing import Optional, Tuple

import numpy as np

from runner.plan.torchrec_adapter.balanced.effort import SWAP_SCAN
from runner.plan.torchrec_adapter.balanced.moves import _State
from runner.plan.torchrec_adapter.balanced.packing import construct
from runner.plan.torchrec_adapter.balanced.problem import DEVICE, HOST, UNIFORM, Choice, Problem, fits
from runner.plan.torchrec_adapter.balanced.swaps import best_swap


def _gathered(s: _State, r: int, limit: float) -> Tuple[Optional[Tuple[float, int, int, int, int]], int]:
    """The swap as the search found it before: every device shard gathered from the tables, table by table."""
    device = [t for t in range(len(s.solution.picks)) if s.choice(t).kind == DEVICE]
    counts = [len(s.solution.ranks[t]) for t in device]
    if not sum(counts):
        return None, 0
    tb = np.repeat(np.array(device, dtype=np.int64), counts)
    jb = np.concatenate([np.arange(n) for n in counts])
    rb = np.concatenate([s.solution.ranks[t] for t in device])
    pb = np.concatenate([s.choice(t).perf for t in device])
    mb = np.concatenate([s.choice(t).mem for t in device])
    cap, best = s.problem.capacity, None
    mine = np.flatnonzero(rb == r)
    work = len(mine) * (1 + len(pb) // SWAP_SCAN)
    for k in mine:
        pa, ma = pb[k], mb[k]
        score = np.maximum(s.load[r] - pa + pb, s.load[rb] - pb + pa)
        ok = (rb != r) & (pb < pa) & (score < limit)
        ok &= ((s.used[r] - ma + mb) <= cap[r]).all(1) & ((s.used[rb] - mb + ma) <= cap[rb]).all(1)
        if ok.any():
            i = int(np.argmin(np.where(ok, score, np.inf)))
            if best is None or score[i] < best[0]:
                best = (float(score[i]), int(tb[k]), int(jb[k]), int(tb[i]), int(jb[i]))
    return best, work


def _problem(rng: random.Random, world: int = 8, local: int = 4) -> Problem:
    tables = []
    for _ in range(rng.randint(5, 40)):
        size = rng.choice([1.0, 2.0, 3.0, rng.uniform(0.5, 4.0)])  # equal sizes: ties
        options = [Choice(DEVICE, np.array([size]), np.array([[rng.randint(1, 30), 0]]))]
        if rng.random() < 0.5:
            options.append(Choice(DEVICE, np.full(2, size / 2), np.array([[rng.randint(1, 15), 0]] * 2)))
        if rng.random() < 0.3:
            options.append(Choice(UNIFORM, np.full(world, size / world * 1.5), np.array([[1, 1]] * world)))
        if rng.random() < 0.2:
            options.append(Choice(HOST, np.full(2, size / 2 * 1.2), np.array([[rng.randint(1, 15), 0]] * 2)))
        rng.shuffle(options)
        tables.append(options)
    return Problem(tables, np.array([[rng.randint(60, 200), 50]] * world), local)


def test_the_slots_find_the_swap_the_gathering_found() -> None:
    rng = random.Random(3)
    compared = found = 0
    for _ in range(40):
        problem = _problem(rng)
        start = construct(problem, rng=random.Random(rng.random()))
        if start is None:
            continue
        s = _State(problem, start)
        for _ in range(30):  # tables moved about (take and put keep the slots), then every rank asked
            t = rng.randrange(len(problem.tables))
            o = rng.randrange(len(problem.tables[t]))
            s.take(t)
            c = problem.tables[t][o]
            ranks = np.arange(problem.world) if c.kind == UNIFORM else np.array(
                [rng.randrange(problem.world) for _ in c.perf])
            s.put(t, o, ranks)
        for r in range(problem.world):
            for limit in (float(s.load.max()) * (1 - 1e-9), float(s.load[r]), np.inf):
                swap = best_swap(s.shards, s.load, s.used, problem.capacity, r, limit)
                assert swap == _gathered(s, r, limit)
                compared, found = compared + 1, found + (swap[0] is not None)
    assert compared > 500 and found > 100


def test_the_fit_on_the_kinds_used_is_torchrecs_fit() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        capacity = rng.integers(0, 100, size=(16, 3))
        used = rng.integers(0, 100, size=(16, 3))
        mem = rng.integers(0, 40, size=3) * (rng.random(3) < 0.5)
        within = not (used > capacity).any()
        assert np.array_equal(fits(used, mem, capacity, within), ((used + mem) <= capacity).all(-1))
        used = np.minimum(used, capacity)  # no rank over: the cheaper path
        assert np.array_equal(fits(used, mem, capacity, True), ((used + mem) <= capacity).all(-1))
