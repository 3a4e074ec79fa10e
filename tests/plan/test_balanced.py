"""The balanced proposer: the optimum on tiny cases (solved exhaustively), only valid plans, never worse than
TorchRec's proposers, a lower bound never above a plan, and a bandwidth study whose points agree."""

from __future__ import annotations

import functools
import itertools
import random
from typing import Iterator, List, Optional, Tuple

import numpy as np
import pytest
from conftest import cfg_for

from runner.launch.sweep import plan_together as sweep_plans
from runner.plan.cost.topology import dense_bytes
from runner.plan.planner import PlanEstimates, build_planner, make_plan, torchrec_planner
from runner.plan.sharders import sharders_for
from runner.plan.spec import plan_spec
from runner.plan.torchrec_adapter.balanced import proposer as balanced_proposer
from runner.plan.torchrec_adapter.balanced.bound import lower_bound, lower_bound_of, lp_bound, simple_bound
from runner.plan.torchrec_adapter.balanced.effort import Effort
from runner.plan.torchrec_adapter.balanced.problem import (
    DEVICE,
    HOST,
    HOST_UNIFORM,
    MULTI_HOST,
    UNIFORM,
    Choice,
    Problem,
    Solution,
    rating,
    valid,
    valid_rating,
)
from runner.plan.torchrec_adapter.balanced.proposer import entries_of, problem_of, search, solution_of
from runner.train.models import planning_model

GIB = 2**30


def _random_problem(rng: random.Random) -> Problem:
    """Up to 6 tables on up to 4 ranks, with the option kinds TorchRec enumerates and tight memory."""
    world = rng.choice([2, 3, 4])
    local = rng.choice([d for d in (1, 2, world) if world % d == 0])
    tables = []
    for _ in range(rng.randint(1, 6)):
        base, size = rng.uniform(0.5, 6.0), rng.randint(1, 8) * GIB // 4
        options = [Choice(DEVICE, np.array([base]), np.array([[size, 0, 0]]))]
        if rng.random() < 0.6:  # column-wise: two halves, a little dearer
            options.append(Choice(DEVICE, np.full(2, base * rng.uniform(0.5, 0.6)), np.array([[size // 2, 0, 0]] * 2)))
        if rng.random() < 0.6:  # row-wise on every rank
            options.append(Choice(UNIFORM, np.full(world, base * rng.uniform(1.0, 2.0) / world),
                                  np.array([[size // world + GIB // 64, 0, 0]] * world)))
        if rng.random() < 0.5:  # table-row-wise within a host
            options.append(Choice(HOST_UNIFORM, np.full(local, base * rng.uniform(1.0, 1.5) / local),
                                  np.array([[size // local + GIB // 64, 0, 0]] * local)))
        if rng.random() < 0.3:  # table-column-wise: two shards within a host
            options.append(Choice(HOST, np.full(2, base * 0.55), np.array([[size // 2, 0, 0]] * 2)))
        if rng.random() < 0.3:  # data-parallel: cheap, whole table everywhere
            options.append(Choice(UNIFORM, np.full(world, base * rng.uniform(0.1, 0.5)),
                                  np.array([[size, 0, 0]] * world)))
        if rng.random() < 0.2 and world // local >= 2:  # a grid over two hosts
            options.append(Choice(MULTI_HOST, np.full(2 * local, base * 0.6 / local),
                                  np.array([[size // (2 * local), 0, 0]] * (2 * local))))
        rng.shuffle(options)
        tables.append(options)
    total = sum(min(int(c.mem[:, 0].sum()) for c in options) for options in tables)
    cap = int(total / world * rng.uniform(1.05, 2.5)) + GIB // 8
    return Problem(tables, np.array([[cap, 0, 0]] * world, dtype=np.int64), local)


def _placements(problem: Problem, c: Choice) -> Iterator[np.ndarray]:
    w, local = problem.world, problem.local
    hosts, k = w // local, len(c.perf)
    if c.kind == UNIFORM:
        yield np.arange(w)
    elif c.kind == DEVICE:
        yield from (np.array(r) for r in itertools.product(range(w), repeat=k))
    elif c.kind == HOST_UNIFORM:
        yield from (h * local + np.arange(local) for h in range(hosts))
    elif c.kind == HOST:
        for h in range(hosts):
            yield from (h * local + np.array(r) for r in itertools.product(range(local), repeat=k))
    else:
        for hs in itertools.permutations(range(hosts), k // local):
            yield np.concatenate([h * local + np.arange(local) for h in hs])


def _optimum(problem: Problem, start: float) -> Tuple[float, Optional[Solution]]:
    """Every option and placement of every table (depth first, cut where the busiest rank or the mean is
    already no better than the best): the least rating of a valid plan, and one such plan."""
    order = sorted(range(len(problem.tables)), key=lambda t: -max(c.perf.max() for c in problem.tables[t]))
    rest = [sum(min(c.perf.sum() for c in problem.tables[t]) for t in order[i:]) for i in range(len(order) + 1)]
    best: List = [start * (1 - 1e-9), None]  # only a strictly better plan is recorded
    load, used = np.zeros(problem.world), np.zeros_like(problem.capacity)
    picks, ranks = [0] * len(order), [np.empty(0, dtype=np.int64)] * len(order)

    def go(i: int) -> None:
        if max(load.max(), (load.sum() + rest[i]) / problem.world) >= best[0]:
            return
        if i == len(order):
            best[:] = [load.max(), Solution(list(picks), [r.copy() for r in ranks])]
            return
        t = order[i]
        for o, c in enumerate(problem.tables[t]):
            for r in _placements(problem, c):
                np.add.at(used, r, c.mem)
                if (used <= problem.capacity).all():
                    np.add.at(load, r, c.perf)
                    picks[t], ranks[t] = o, r
                    go(i + 1)
                    np.subtract.at(load, r, c.perf)
                np.subtract.at(used, r, c.mem)

    go(0)
    return best[0], best[1]


def test_tiny_cases_find_the_optimum_and_the_bound_stays_below_it() -> None:
    found = solved = raised = 0
    missed = []
    for seed in range(100):
        problem = _random_problem(random.Random(seed))
        try:
            ours, _ = search(problem, {}, Effort(200_000))
        except ValueError:  # no start fits: a miss where some plan does
            optimum, plan = _optimum(problem, float("inf"))
            solved += plan is not None
            if plan is not None:
                missed.append(seed)
            continue
        assert valid(problem, ours) is None, (seed, valid(problem, ours))
        mine = rating(problem, ours)
        assert valid_rating(problem, ours) == mine  # (a sweep's point rates the sweep's plans so)
        wider = Solution(ours.picks, [r + problem.world for r in ours.ranks])  # a larger cluster's plan: refused
        assert valid_rating(problem, wider) is None and valid(problem, wider) is not None
        optimum, better = _optimum(problem, mine)
        assert better is None or valid(problem, better) is None
        solved += 1
        found += better is None  # nothing strictly better than ours exists
        if better is not None:
            missed.append(seed)
        bound = lower_bound(problem)
        assert bound <= (mine if better is None else optimum) * (1 + 1e-9), seed
        assert simple_bound(problem) <= bound * (1 + 1e-5), seed
        raised += bound > max(simple_bound(problem), lp_bound(problem)) * (1 + 1e-3)  # the configuration bound's
    assert solved >= 90 and found >= 0.95 * solved, (found, solved, missed)
    assert raised >= 5, raised  # whole shards bind in some of these: the bound above the LP's, still below the optimum


BASE = ["model=dnn_many", "cluster=gpu_2x8", "train.batch_size=512", "sharding.compute_kernels=[fused,dense]",
        "sharding.proposer=balanced"]


def _rated(cfg, proposer: str) -> Optional[float]:
    """The rating of TorchRec's own planner with ``proposer`` on the same inputs (None: no plan)."""
    model = planning_model(cfg)
    estimates = PlanEstimates()
    other = cfg.copy()
    other.sharding.proposer = proposer
    try:
        torchrec_planner(plan_spec(other), 16, 8, "cuda", estimates, dense_bytes(model)).plan(
            model, sharders_for(cfg.precision))
    except Exception:  # noqa: BLE001 - TorchRec found no plan
        return None
    totals = [0.0] * 16
    for option in estimates.best_plan:
        for shard in option.shards:
            totals[shard.rank] += shard.perf.total
    return max(totals)


@pytest.mark.parametrize("point", [("12", "1.0", "0.3"), ("20", "12.5", "0.15"), ("8", "3", "0.6"),
                                   ("16", "50", "0.45")])
def test_never_worse_than_torchrec_and_valid(point: Tuple[str, str, str]) -> None:
    tables, bandwidth, reserve = point
    cfg = cfg_for(*BASE, f"model.generated_tables.count={tables}", f"cluster.cross_node_bandwidth={bandwidth}",
                  f"sharding.storage_reserve_percent={reserve}", "sharding.balanced_compare=[]")
    model = planning_model(cfg)
    notes, facts = [], {}
    plan, best, _, _ = make_plan(plan_spec(cfg), model, 16, 8, "cuda", notes=notes, facts=facts)
    planner = build_planner(plan_spec(cfg), 16, 8, "cuda", None, dense_bytes(model))
    reserved = planner._storage_reservation.reserve(topology=planner._topology, batch_size=planner._batch_size,
                                                    module=model, sharders=sharders_for(cfg.precision),
                                                    constraints=planner._constraints)
    problem, options = problem_of(planner._enumerator.enumerate(model, sharders_for(cfg.precision)), reserved)
    ours = solution_of(options, {o.fqn: (o.sharding_type, o.compute_kernel, tuple(s.rank for s in o.shards))
                                 for o in best})
    assert ours is not None and valid(problem, ours) is None
    mine = rating(problem, ours)
    for proposer in ("dynamic_programming", "greedy"):
        theirs = _rated(cfg, proposer)
        assert theirs is None or mine <= theirs * (1 + 1e-9), (proposer, mine, theirs)
    assert facts["lower_bound_ms"] <= mine * (1 + 1e-9)
    assert facts["lower_bound_kind"] in ("mean rank", "largest shard", "LP relaxation", "whole shards")
    assert "not a TorchRec proposer's" in notes[0] or "kept TorchRec's" in notes[0]
    placed = {name: p for module in plan.plan.values() for name, p in module.items()}
    assert len(placed) == int(tables)  # every table in the ShardingPlan DMP gets, with its chosen type and ranks
    for o in best:
        assert placed[o.name].sharding_type == o.sharding_type
        assert [s.placement.rank() for s in placed[o.name].sharding_spec.shards] == [s.rank for s in o.shards]


def _point(cfg, choose_from=None):
    """A point's balanced plan (as table -> entry) and the point's problem, for rating other points' plans."""
    model = planning_model(cfg)
    _, best, _, _ = make_plan(plan_spec(cfg), model, 16, 8, "cuda", reuse=True, choose_from=choose_from)
    planner = build_planner(plan_spec(cfg), 16, 8, "cuda", None, dense_bytes(model), reuse=True)
    reserved = planner._storage_reservation.reserve(topology=planner._topology, batch_size=planner._batch_size,
                                                    module=model, sharders=sharders_for(cfg.precision),
                                                    constraints=planner._constraints)
    problem, options = problem_of(planner._enumerator.enumerate(model, sharders_for(cfg.precision)), reserved)
    return entries_of(best), problem, options


def test_a_sweep_planned_together_agrees_and_is_monotone(monkeypatch: pytest.MonkeyPatch) -> None:
    balanced_proposer._POOL.clear()
    monkeypatch.delenv(sweep_plans.PLAN_SET_ENV, raising=False)
    grid = [(b, r) for b in ("25", "3", "12.5", "1") for r in ("0.1", "0.5")]  # 25 first: the order that failed
    points = [[*BASE, "model.generated_tables.count=24", f"cluster.cross_node_bandwidth={b}",
               f"sharding.storage_reserve_percent={r}"] for b, r in grid]
    cfgs = [cfg_for(*p) for p in points]
    path = sweep_plans.plan_together([(p, plan_spec(c), functools.partial(planning_model, c))
                                      for p, c in zip(points, cfgs, strict=True)])
    try:
        found = {(float(b), float(r)): _point(cfg_for(*p), sweep_plans.choices_for(p))
                 for (b, r), p in zip(grid, points, strict=True)}
        carried = {(float(b), float(r)): sweep_plans.choices_for(p)[1]["bound"]
                   for (b, r), p in zip(grid, points, strict=True)}
    finally:
        path.unlink()
    for k, (_, problem, _) in found.items():  # the bound the first pass found, which the second pass reuses
        assert tuple(carried[k]) == lower_bound_of(problem), k
    rated = {k: rating(problem, solution_of(options, plan)) for k, (plan, problem, options) in found.items()}
    for (b, r), mine in rated.items():
        for (b2, r2), theirs in rated.items():
            if b2 >= b and r2 <= r:  # more bandwidth and no more reserve: never slower
                assert theirs <= mine * (1 + 1e-9), ((b, r), (b2, r2), mine, theirs)
    for here, (_, problem, options) in found.items():
        for there, (plan, _, _) in found.items():
            other = solution_of(options, plan)
            if other is not None and valid(problem, other) is None:  # another point's plan, valid here
                assert rated[here] <= rating(problem, other) * (1 + 1e-9), (here, there)


def test_a_packing_start_beats_the_least_loaded_start_where_whole_shards_and_a_uniform_sliver_bind() -> None:
    """Shards of 3, 3, 2, 2, 2 and a table whose uniform option (0.1 on each rank) is cheaper in total than its
    one shard of 0.25: the runner's own start (least loaded, cheapest options) rates 7.1; packing 3 + 3 and
    2 + 2 + 2 best fit rates 6.1 (6.25 with uniform options at twice their cost); the search keeps the best."""
    import numpy as np

    from runner.plan.torchrec_adapter.balanced.packing import construct, packing_starts
    from runner.plan.torchrec_adapter.balanced.problem import DEVICE, UNIFORM, Choice, Problem

    mem = np.array([[1, 0]])
    tables = [[Choice(DEVICE, np.array([size]), mem)] for size in (3.0, 3.0, 2.0, 2.0, 2.0)]
    tables.append([Choice(UNIFORM, np.array([0.1, 0.1]), np.repeat(mem, 2, 0)), Choice(DEVICE, np.array([0.25]), mem)])
    problem = Problem(tables, np.array([[100, 0], [100, 0]]), 1)
    own = construct(problem)
    assert rating(problem, own) == pytest.approx(7.1)
    assert rating(problem, construct(problem, target=6.6, uniform_weight=2.0)) == pytest.approx(6.25)  # 0.25 whole
    starts = packing_starts(problem, own)  # the better of the two: 3 + 3 and 2 + 2 + 2, the uniform sliver on both
    assert list(starts) == ["packing"] and rating(problem, starts["packing"]) == pytest.approx(6.1)
    assert valid(problem, starts["packing"]) is None
    best, facts = search(problem, {}, Effort(100_000))
    assert rating(problem, best) == pytest.approx(6.1) and "packing" in facts["starts"]


def test_the_configuration_bound_knows_shards_are_whole() -> None:
    """Three shards of 0.6 on two ranks: the mean rank is 0.9 and the largest shard 0.6, so the LP bound is 0.9;
    two whole shards must share a rank, so every plan's busiest rank is 1.2, and the configuration bound finds
    it (to the bisection's 0.1%), never above."""
    import numpy as np

    from runner.plan.torchrec_adapter.balanced.problem import DEVICE, UNIFORM, Choice, Problem

    problem = Problem([[Choice(DEVICE, np.array([0.6]), np.array([[1, 0]]))]] * 3, np.array([[9, 0], [9, 0]]), 1)
    assert lp_bound(problem) == pytest.approx(0.9, rel=1e-5)
    assert 1.2 * (1 - 2e-3) <= lower_bound(problem) <= 1.2
    assert lower_bound_of(problem)[1] == "whole shards"
    spread = Problem([[Choice(UNIFORM, np.array([0.1, 0.1]), np.array([[1, 0], [1, 0]]))]] * 20,
                     np.array([[99, 0], [99, 0]]), 1)  # no shard of T/16 or more, to be placed whole: volume alone
    assert lower_bound_of(spread) == (pytest.approx(2.0, rel=1e-5), "mean rank")


def test_a_plan_that_fails_after_its_bound_fork_started_leaves_no_process(monkeypatch) -> None:
    """The lower bound's fork (started beside the search) is ended and reaped when the plan fails, not left
    computing until this process's next plan."""
    import os

    from runner.config.errors import PlanError
    from runner.plan.torchrec_adapter.balanced import balanced_planner
    from runner.plan.torchrec_adapter.balanced import bound as bound_ahead

    started: List[int] = []
    start = bound_ahead.start_bound

    def recorded(*args, **kwargs) -> None:
        start(*args, **kwargs)
        started.append(bound_ahead._AHEAD[2])

    def no_placement(*_, **__):
        raise ValueError("no start")

    monkeypatch.setattr(bound_ahead, "start_bound", recorded)
    monkeypatch.setattr(balanced_planner, "may_fork", lambda: True)
    monkeypatch.setattr(balanced_planner, "search", no_placement)
    cfg = cfg_for(*BASE, "model.generated_tables.count=8", "sharding.balanced_compare=[]")
    with pytest.raises(PlanError):
        make_plan(plan_spec(cfg), planning_model(cfg), 16, 8, "cuda")
    assert len(started) == 1 and not bound_ahead._AHEAD
    with pytest.raises(ChildProcessError):
        os.waitpid(started[0], os.WNOHANG)  # reaped
