"""``sharding.proposer=balanced``: the best plan the runner can find, by TorchRec's own yardstick.

TorchRec's enumerated options (each shard's storage and perf from its estimators) and the storage the
reservation leaves on each device become a :class:`.balance.Problem`; the search of :mod:`.balance` runs
from several starts and the plan with the lowest rating wins:

1. the runner's own start (:func:`.balance.construct`);
2. TorchRec's own plans for the same inputs, for each proposer in ``sharding.balanced_compare``
   (``dynamic_programming`` by default on GPU clusters: its plan, found as ``sharding.proposer=
   dynamic_programming`` finds it);
3. the plans of earlier points of this process (a sweep's points), re-rated with this point's estimates
   where they are still valid here (:func:`remember`, :func:`pooled`): a sweep's points agree with each
   other.

The winner is placed on TorchRec's options (each shard's ``rank``), rated again by TorchRec's perf model
and checked against every device's reserved storage before the planner turns it into a ``ShardingPlan``
(:meth:`.search_loop.SearchLoopPlanner.plan`). What each start rated is kept in
:attr:`BalancedProposer.facts` for the report.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from torch import nn
from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.proposers import GreedyProposer
from torchrec.distributed.planner.types import (
    PartitionByType,
    PlannerError,
    PlannerErrorType,
    ShardingOption,
    Storage,
    Topology,
)
from torchrec.distributed.planner.utils import reset_shard_rank
from torchrec.distributed.types import ShardingPlan

from runner.plan.balance import (
    DEVICE,
    HOST,
    HOST_UNIFORM,
    MULTI_HOST,
    UNIFORM,
    Choice,
    Problem,
    Solution,
    construct,
    exact,
    improve,
    perturb,
    rating,
    valid,
)
from runner.plan.copies import quick_copies
from runner.plan.helper import rate
from runner.plan.prefixes import shared_uniform_prefixes
from runner.plan.search import SkippingProposer, VectorisedDynamicProgrammingProposer, placeable_only
from runner.plan.search_loop import SearchLoopPlanner

_KIND = {PartitionByType.UNIFORM.value: UNIFORM, PartitionByType.DEVICE.value: DEVICE,
         PartitionByType.HOST.value: HOST, PartitionByType.MULTI_HOST.value: MULTI_HOST}
POOL_SIZE = 32  # plans kept per problem shape for later points
ROUNDS = 200  # ruin-and-recreate rounds per start (the time budget ends them first at a thousand tables)
EXACT_TABLES, EXACT_NODES = 12, 20000  # problems this small are solved by branch and bound first
CONSTRUCT_TRIES = 50  # random construction orders tried where the runner's two starts fit nowhere
_POOL: Dict[Tuple[Any, ...], List[Dict[str, Tuple[str, str, Tuple[int, ...]]]]] = {}


@dataclass
class BalancedProposer:
    """The settings of one balanced plan (``budget_s``: the search's time, ``compare``: TorchRec's proposers
    whose plans are starts too) and, after it, what it found (:attr:`facts`)."""

    budget_s: float
    compare: List[str]
    facts: Dict[str, Any] = field(default_factory=dict)
    choose_from: Optional[Tuple[List[Dict[str, Any]], Dict[str, Any]]] = None
    """A sweep planned together (:mod:`.sweep_plans`): its plans, of which the best valid here is taken
    instead of a search, and what this point compared when it was planned."""


def _kind(option: ShardingOption) -> Optional[int]:
    kind = _KIND.get(option.partition_by)
    if kind == HOST and option.sharding_type == "table_row_wise":
        return HOST_UNIFORM
    if option.compute_kernel == "key_value" and option.sharding_type == "column_wise":
        return None  # TorchRec's partitioner gives its shards distinct ranks: left to TorchRec's proposers
    return kind


def problem_of(search_space: List[ShardingOption], reserved: Topology) -> Tuple[Problem, List[List[ShardingOption]]]:
    """The search's numbers for TorchRec's options and reserved devices, and the options per table in the
    problem's order (tables in first-seen order, options as enumerated)."""
    by_table: Dict[str, List[ShardingOption]] = {}
    for option in search_space:
        if _kind(option) is not None:
            by_table.setdefault(option.fqn, []).append(option)
    tables = [[Choice(_kind(o), np.array([s.perf.total for s in o.shards], dtype=np.float64),  # type: ignore[arg-type]
                      np.array([(s.storage.hbm, s.storage.ddr, s.storage.ssd) for s in o.shards],
                               dtype=np.int64).reshape(-1, 3))
               for o in options] for options in by_table.values()]
    capacity = np.array([(d.storage.hbm, d.storage.ddr, d.storage.ssd) for d in reserved.devices], dtype=np.int64)
    return Problem(tables, capacity, reserved.local_world_size), list(by_table.values())


def _signature(option: ShardingOption) -> Tuple[str, str]:
    return option.sharding_type, option.compute_kernel


def solution_of(table_options: List[List[ShardingOption]], plan: Dict[str, Tuple[str, str, Tuple[int, ...]]]
                ) -> Optional[Solution]:
    """A plan given as table -> (sharding type, kernel, shard ranks) on this problem's options; None where
    one of its options is not among them (or has another shard count)."""
    picks, ranks = [], []
    for options in table_options:
        entry = plan.get(options[0].fqn)
        if entry is None:
            return None
        found = [o for o, opt in enumerate(options) if _signature(opt) == entry[:2]
                 and len(opt.shards) == len(entry[2])]
        if not found:
            return None
        picks.append(found[0])
        ranks.append(np.array(entry[2], dtype=np.int64))
    return Solution(picks, ranks)


PlanEntries = Dict[str, Tuple[str, str, Tuple[int, ...]]]  # table -> (sharding type, kernel, shard ranks)


def plan_of(table_options: List[List[ShardingOption]], solution: Solution) -> PlanEntries:
    return {options[0].fqn: (*_signature(options[o]), tuple(int(r) for r in ranks))
            for options, o, ranks in zip(table_options, solution.picks, solution.ranks, strict=True)}


def from_torchrec(table_options: List[List[ShardingOption]], chosen: List[ShardingOption],
                  ranks: List[List[int]]) -> Optional[Solution]:
    """TorchRec's plan (its chosen options and their shards' ranks) as a solution of this problem."""
    return solution_of(table_options, {o.fqn: (*_signature(o), tuple(r)) for o, r in zip(chosen, ranks, strict=True)})


def _pool_key(problem: Problem, table_options: List[List[ShardingOption]]) -> Tuple[Any, ...]:
    return (problem.world, problem.local, tuple((opts[0].fqn, tuple(_signature(o) for o in opts))
                                                for opts in table_options))


def pooled(problem: Problem, table_options: List[List[ShardingOption]]) -> List[Solution]:
    """Earlier points' plans (this process) that are valid on this problem."""
    out = []
    for plan in _POOL.get(_pool_key(problem, table_options), []):
        s = solution_of(table_options, plan)
        if s is not None and valid(problem, s) is None:
            out.append(s)
    return out


def remember(problem: Problem, table_options: List[List[ShardingOption]], solution: Solution) -> None:
    plans = _POOL.setdefault(_pool_key(problem, table_options), [])
    plan = plan_of(table_options, solution)
    if plan not in plans:
        plans.append(plan)
        del plans[:-POOL_SIZE]


def search(problem: Problem, starts: Dict[str, Solution], budget_s: float,
           rounds: int = ROUNDS) -> Tuple[Solution, Dict[str, Any]]:
    """The best plan the search finds from ``starts`` (name -> solution, each valid) and the runner's own
    start: small problems solved exactly first (:func:`.balance.exact`, within :data:`EXACT_NODES`); each
    start taken to its local optimum (:func:`.balance.improve`); the best of those searched further
    (:func:`.balance.perturb`, ``rounds`` rounds) in what is left of ``budget_s``. Returns the winner and,
    per start, its rating before and after. Ties keep the earlier start (the runner's own first)."""
    t0 = time.perf_counter()
    own = construct(problem)
    rng = random.Random(0)
    tries = [lambda: construct(problem, by_storage=True)] + [
        lambda: construct(problem, by_storage=True, rng=rng)] * (CONSTRUCT_TRIES if not starts else 0)
    for make in tries if own is None else []:  # tight storage: the smallest first, then random orders
        own = make()
        if own is not None:
            break
    candidates = ({"runner": own} if own is not None else {}) | starts
    facts: Dict[str, Any] = {"starts": {}, "optimal": False}
    if len(problem.tables) <= EXACT_TABLES:  # small: solved exactly where the node budget allows
        incumbent = min((rating(problem, c) for c in candidates.values()), default=float("inf"))
        found, facts["optimal"] = exact(problem, incumbent, EXACT_NODES)
        if found is not None:
            candidates["exact"] = found
    if not candidates:
        raise ValueError("no start")  # where no plan fits: the caller says so
    improved: Dict[str, Solution] = {}
    for name, start in candidates.items():
        found, moves = (start, 0) if facts["optimal"] else improve(problem, start, budget_s)
        improved[name] = found
        facts["starts"][name] = {"rating": rating(problem, start), "improved": rating(problem, found),
                                 "moves": moves, "changed": _changed(start, found)}
    first = min(improved, key=lambda k: (facts["starts"][k]["improved"], list(improved).index(k)))
    rest = 0 if facts["optimal"] else rounds
    best, done = perturb(problem, improved[first], max(budget_s - (time.perf_counter() - t0), 0.0), rest)
    facts["starts"][first].update(improved=rating(problem, best), rounds=done,
                                  changed=_changed(candidates[first], best))
    facts["winner"] = first
    facts["search_s"] = time.perf_counter() - t0
    return best, facts


def _changed(a: Solution, b: Solution) -> bool:
    return a.picks != b.picks or any(not np.array_equal(x, y) for x, y in zip(a.ranks, b.ranks, strict=True))


class BalancedPlanner(SearchLoopPlanner):
    """TorchRec's planner whose loop is :func:`search` (see the module doc): the same storage reservation,
    enumeration, perf model, ``to_sharding_plan`` and stats as TorchRec's; the plan's shards placed by the
    search instead of TorchRec's partitioner."""

    def __init__(self, *args: Any, balanced: BalancedProposer, dp_hbm_bins: int = 100, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.balanced, self._dp_hbm_bins = balanced, dp_hbm_bins

    def plan(self, module: nn.Module, sharders: List[Any]) -> ShardingPlan:
        if self.plan_loader is not None:
            return super().plan(module, sharders)
        with quick_copies():
            return self._plan_balanced(module, sharders)

    def _plan_balanced(self, module: nn.Module, sharders: List[Any]) -> ShardingPlan:
        self._num_proposals = self._num_plans = 0
        start_time = time.perf_counter()
        reserved: Topology = self._storage_reservation.reserve(
            topology=self._topology, batch_size=self._batch_size, module=module, sharders=sharders,
            constraints=self._constraints)
        space = self._enumerator.enumerate(module=module, sharders=sharders)
        if not space:
            return ShardingPlan({})
        problem, table_options = problem_of(space, reserved)
        self._counts = {"tables": len(table_options), "options": len(space), "partitioned": 0, "skipped": 0,
                        "best": None, "seconds": time.perf_counter() - start_time}
        self._report()
        largest = problem.capacity.max(0)
        if len(table_options) != len({o.fqn for o in space}) or any(
                not any((c.mem <= largest).all() for c in options) for options in problem.tables):
            raise PlannerError(error_type=PlannerErrorType.INSUFFICIENT_STORAGE,
                               message="a table has no sharding option whose every shard fits on a device")
        if self.balanced.choose_from is not None:
            chosen = self._choose(problem, table_options)
            if chosen is not None:
                return self._done(module, sharders, problem, table_options, reserved, *chosen, start_time)
        facts: Dict[str, Any] = {"torchrec": {}}
        starts: Dict[str, Solution] = {}
        for name in self.balanced.compare:
            found = self._torchrec_plan(name, space, reserved)
            solution = from_torchrec(table_options, *found) if found is not None else None
            facts["torchrec"][name] = None if solution is None else rating(problem, solution)
            if solution is not None and valid(problem, solution) is None:
                starts[f"torchrec_{name}"] = solution
            self._report()
        for i, solution in enumerate(pooled(problem, table_options)):
            starts[f"point_{i}"] = solution
        try:
            solution, found_facts = search(problem, starts, self.balanced.budget_s)
        except ValueError:
            raise PlannerError(error_type=PlannerErrorType.INSUFFICIENT_STORAGE,
                               message="the balanced search found no placement that fits") from None
        facts.update(found_facts, pooled=sum(k.startswith("point_") for k in starts))
        return self._done(module, sharders, problem, table_options, reserved, solution, facts, start_time)

    def _choose(self, problem: Problem, table_options: List[List[ShardingOption]]
                ) -> Optional[Tuple[Solution, Dict[str, Any]]]:
        """The best, rated here, of the sweep's plans that are valid here (ties: the first); None where none is."""
        assert self.balanced.choose_from is not None
        plans, known = self.balanced.choose_from
        best: Optional[Tuple[float, Solution]] = None
        count = 0
        for plan in plans:
            solution = solution_of(table_options, {k: (v[0], v[1], tuple(v[2])) for k, v in plan.items()})
            if solution is None or valid(problem, solution) is not None:
                continue
            count += 1
            r = rating(problem, solution)
            if best is None or r < best[0]:
                best = (r, solution)
        if best is None:
            return None
        facts = {"torchrec": dict(known.get("torchrec", {})), "winner": "sweep", "optimal": False, "pooled": 0,
                 "starts": {"sweep": {"rating": best[0], "improved": best[0], "changed": True}}, "chosen_of": count}
        return best[1], facts

    def _done(self, module: nn.Module, sharders: List[Any], problem: Problem, table_options: List[List[ShardingOption]],
              reserved: Topology, solution: Solution, facts: Dict[str, Any], start_time: float) -> ShardingPlan:
        problem_check = valid(problem, solution)
        assert problem_check is None, f"the balanced search's plan is not valid: {problem_check}"
        remember(problem, table_options, solution)
        options = [options[o] for options, o in zip(table_options, solution.picks, strict=True)]
        ranks = [r.tolist() for r in solution.ranks]
        facts["rating"] = self._torchrec_rating(options, ranks, reserved, rating(problem, solution))
        self.balanced.facts = facts
        self._counts.update(best=facts["rating"], seconds=time.perf_counter() - start_time)
        self._report()
        return self._finish(module, sharders, options, ranks, start_time)

    def _report(self) -> None:
        if self._progress is not None:
            self._progress(dict(self._counts))

    def _torchrec_rating(self, options: List[ShardingOption], ranks: List[List[int]], reserved: Topology,
                         ours: float) -> float:
        """TorchRec's perf model's rating of the plan, after checking every device's storage as TorchRec's
        partitioner checks it (``Storage.fits_in``); it must equal the search's own."""
        used = [Storage(hbm=0, ddr=0, ssd=0) for _ in reserved.devices]
        for option, option_ranks in zip(options, ranks, strict=True):
            for shard, rank in zip(option.shards, option_ranks, strict=True):
                shard.rank = rank
                used[rank] += shard.storage
        try:
            torchrec_rating = self._perf_model.rate(plan=options)
        finally:
            reset_shard_rank(options)
        over = [d.rank for d, u in zip(reserved.devices, used, strict=True) if not u.fits_in(d.storage)]
        assert not over, f"the balanced plan overfills ranks {over}"
        assert abs(torchrec_rating - ours) <= 1e-9 * max(1.0, abs(ours)), (torchrec_rating, ours)
        return float(torchrec_rating)

    def _torchrec_plan(self, name: str, space: List[ShardingOption], reserved: Topology
                       ) -> Optional[Tuple[List[ShardingOption], List[List[int]]]]:
        """TorchRec's plan with proposer ``name`` for these options (chosen options and their shards' ranks),
        found as ``sharding.proposer=<name>`` finds it; None where it finds none."""
        if name == "dynamic_programming":
            for candidates in (space, placeable_only(space, reserved)):
                proposer = SkippingProposer(VectorisedDynamicProgrammingProposer(
                    hbm_bins_per_device=self._dp_hbm_bins), len(reserved.devices))
                proposer.load(search_space=candidates, enumerator=self._enumerator)
                proposer.exact_partitioner = type(self._partitioner) is GreedyPerfPartitioner
                with shared_uniform_prefixes(reserved.devices):
                    found = self._search(proposer, reserved, time.perf_counter(), candidates)
                if found is not None:
                    return found
            return None
        return self._proposers_plan([GreedyProposer(), GreedyProposer(use_depth=False)], space, reserved)

    def _proposers_plan(self, proposers: List[Any], space: List[ShardingOption], reserved: Topology
                        ) -> Optional[Tuple[List[ShardingOption], List[List[int]]]]:
        """TorchRec's loop over ``proposers``: the first plan with the strictly lowest rating."""
        best: Optional[Tuple[float, List[ShardingOption], List[List[int]]]] = None
        for proposer in proposers:
            proposer.load(search_space=space, enumerator=self._enumerator)
            seen: Dict[Tuple[int, ...], Tuple[bool, Optional[float]]] = {}
            proposal = proposer.propose()
            while proposal:
                key = tuple(sorted(map(id, proposal)))
                if key not in seen:
                    found = rate(self._partitioner, self._perf_model, proposal, reserved)
                    seen[key] = (found is not None, found)
                    if found is not None and (best is None or found < best[0]):
                        best = (found, list(proposal), [[s.rank for s in o.shards] for o in proposal])
                    reset_shard_rank(proposal)
                proposer.feedback(partitionable=seen[key][0], plan=proposal, perf_rating=seen[key][1],
                                  storage_constraint=reserved)
                proposal = proposer.propose()
        return None if best is None else (best[1], best[2])


def entries_of(best_plan: List[ShardingOption]) -> PlanEntries:
    """A planner's chosen options (with their shards' ranks) as table -> (sharding type, kernel, ranks)."""
    return {o.fqn: (*_signature(o), tuple(int(s.rank) for s in o.shards)) for o in best_plan}


def compared_metrics(facts: Dict[str, Any]) -> Dict[str, float]:
    """``plan/torchrec_<proposer>_ms``: the rating of TorchRec's plan for each proposer compared (where it
    found one)."""
    return {f"plan/torchrec_{name}_ms": float(r) for name, r in facts.get("torchrec", {}).items() if r is not None}


def balanced_note(facts: Dict[str, Any]) -> str:
    """The report's line on how a balanced plan was found and how it compares with TorchRec's."""
    starts = facts["starts"]
    winner = facts["winner"]
    compared = "; ".join(f"TorchRec's {name}: " + ("no plan" if r is None else f"{r:.3f} ms")
                         for name, r in facts.get("torchrec", {}).items())
    if winner == "sweep":
        return (f"sharding.proposer=balanced: the best, rated here, of the {facts['chosen_of']} plans this sweep's "
                f"points found when planned together, estimated step {facts['rating']:.3f} ms"
                + (f" ({compared})" if compared else ""))
    if winner.startswith("torchrec_") and not starts[winner]["changed"]:
        return (f"sharding.proposer=balanced kept TorchRec's {winner[len('torchrec_'):]} plan: no move lowered its "
                f"busiest rank ({facts['rating']:.3f} ms)")
    origin = {"runner": "the runner's own start", "exact": "a branch and bound"}.get(
        winner, f"TorchRec's {winner[len('torchrec_'):]} plan" if winner.startswith("torchrec_")
        else "an earlier point's plan")
    return (f"sharding.proposer=balanced: the runner's plan, not a TorchRec proposer's, estimated step "
            f"{facts['rating']:.3f} ms" + (f" ({compared})" if compared else "")
            + f"; found from {origin}" + (", proved optimal" if facts.get("optimal") else "")
            + (f", {facts['pooled']} earlier points' plans tried" if facts.get("pooled") else ""))
