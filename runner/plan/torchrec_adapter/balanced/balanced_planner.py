"""The planner of ``sharding.proposer=balanced``: TorchRec's planner whose loop is the balanced search.

TorchRec's storage reservation and enumeration, then :func:`.proposer.search` from the runner's start,
TorchRec's plans for ``sharding.balanced_compare`` (found as the runner finds them for those proposers:
:mod:`runner.plan.torchrec_adapter.planning_loop`, :mod:`runner.plan.torchrec_adapter.dp_proposer`) and earlier
points' plans; or, in a sweep planned together (:mod:`runner.launch.sweep.plan_together`), the best of the sweep's
plans. The winner's shards get their ranks on TorchRec's options, its rating is checked against TorchRec's perf
model and its storage against every device, and TorchRec's ``to_sharding_plan`` and stats end it, as TorchRec's
loop ends.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np
from torch import nn
from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.types import PlannerError, PlannerErrorType, ShardingOption, Storage, Topology
from torchrec.distributed.planner.utils import reset_shard_rank
from torchrec.distributed.types import ModuleSharder, ShardingPlan

from runner.config.errors import ConfigError
from runner.config.parts import part
from runner.config.proposers import BALANCED_STARTS, PROPOSERS
from runner.plan.analysis import summed_per_rank
from runner.plan.torchrec_adapter.balanced import bound
from runner.plan.torchrec_adapter.balanced.effort import Effort, ticker
from runner.plan.torchrec_adapter.balanced.problem import Problem, Solution, rating, valid, valid_rating
from runner.plan.torchrec_adapter.balanced.proposer import (
    COMPARE_MAX_SHARDS,
    BalancedProposer,
    forget_problem,
    from_torchrec,
    option_index,
    pooled,
    problem_of,
    remember,
    search,
    solution_of,
)
from runner.plan.torchrec_adapter.compact_enumeration import expand, expand_all, shard_count
from runner.plan.torchrec_adapter.dataclass_copies import quick_copies
from runner.plan.torchrec_adapter.dp_proposer import placeable_only
from runner.plan.torchrec_adapter.planning_loop import SearchLoopPlanner
from runner.plan.torchrec_adapter.shared_placements import shared_uniform_prefixes
from runner.runtime.cores import collector_paused, may_fork, return_freed_memory

if TYPE_CHECKING:
    from runner.config.schema import ShardingSchema


class BalancedPlanner(SearchLoopPlanner):
    """TorchRec's planner whose loop is :func:`search` (see the module doc): the same storage reservation,
    enumeration, perf model, ``to_sharding_plan`` and stats as TorchRec's; the plan's shards placed by the
    search instead of TorchRec's partitioner."""

    def __init__(self, *args: Any, balanced: BalancedProposer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.balanced = balanced

    def plan(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]]) -> ShardingPlan:
        if self.plan_loader is not None:
            return super().plan(module, sharders)
        try:
            with quick_copies(), collector_paused():
                return self._plan_balanced(module, sharders)
        finally:  # the bound's fork, where the plan failed or nothing took its bound, ended now: not left for
            bound.end_bound_fork()  # the next plan of this process to reap

    def _plan_balanced(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]]) -> ShardingPlan:
        start_time = time.perf_counter()
        reserved, space = self._reserve_and_enumerate(module, sharders, start_time)
        if not space:
            return ShardingPlan({})
        problem, table_options = problem_of(space, reserved, ticker(self._phase, "the search's problem"))
        largest = problem.capacity.max(0)
        if len(table_options) != len({o.fqn for o in space}) or any(
                not any((c.peak <= largest).all() for c in options) for options in problem.tables):
            raise PlannerError(error_type=PlannerErrorType.INSUFFICIENT_STORAGE,
                               message="a table has no sharding option whose every shard fits on a device")
        for c in (c for options in problem.tables for c in options):  # read by the bound and the starts alike:
            c.total, c.largest, c.storage  # noqa: B018  (computed before the bound's fork, once for both)
        known = self.balanced.choose_from[1].get("bound") if self.balanced.choose_from is not None else None
        if known:  # a sweep planned together found this point's bound in its first pass
            bound.remember_bound(space, problem, (float(known[0]), str(known[1])))
        if may_fork() and not bound.known(space, problem):  # the plan's bound, on the core the search leaves idle
            bound.start_bound(space, problem, bound.lower_bound_of, self._phase)
        if self.balanced.choose_from is not None:
            chosen = self._choose(problem, table_options)
            if chosen is not None:
                ours = self._settled(problem, table_options, space, chosen[0])
                del problem  # (let go, where _settled let its numbers go)
                return self._done(module, sharders, table_options, reserved, *chosen, *ours, start_time)
        facts: Dict[str, Any] = {"torchrec": {}, "skipped": {}}
        starts: Dict[str, Solution] = {}
        shards = sum(shard_count(o) for o in space)
        full: Optional[List[ShardingOption]] = None
        for name in self.balanced.compare:
            if self.balanced.auto and shards > COMPARE_MAX_SHARDS:  # TorchRec's objects per shard: too costly
                facts["skipped"][name] = shards
                continue
            self._phase(f"TorchRec's {name} plan as a start")
            full = full if full is not None else expand_all(space)
            found = self._torchrec_plan(name, full, reserved)
            solution = from_torchrec(table_options, *found) if found is not None else None
            facts["torchrec"][name] = None if solution is None else rating(problem, solution)
            if solution is not None and valid(problem, solution) is None:
                starts[f"torchrec_{name}"] = solution
            self._report()
        del full
        for i, solution in enumerate(pooled(problem, table_options)):
            starts[f"point_{i}"] = solution
        self._phase("balanced search")
        try:
            b = self.balanced
            effort = Effort(b.work, b.timeout_s, progress=self._phase)
            solution, found_facts = search(problem, starts, effort, patience=b.patience, gap=b.gap,
                                           report=self._phase)
        except ValueError:
            raise PlannerError(error_type=PlannerErrorType.INSUFFICIENT_STORAGE,
                               message="the balanced search found no placement that fits") from None
        facts.update(found_facts, pooled=sum(k.startswith("point_") for k in starts))
        ours = self._settled(problem, table_options, space, solution)
        del problem, starts
        return self._done(module, sharders, table_options, reserved, solution, facts, *ours, start_time)

    def _report(self) -> None:
        if self._counts:
            self._phase(f"{self._counts['options']} sharding options of {self._counts['tables']} tables",
                        self._counts.get("best"))

    def _phase(self, text: str, best: Optional[float] = None) -> None:
        """Progress: the phase the plan is in (with the best rating so far, where there is one)."""
        if self._progress is not None:
            self._progress({"phase": "balanced", "detail": text, "best": best})

    def _choose(self, problem: Problem, table_options: List[List[ShardingOption]]
                ) -> Optional[Tuple[Solution, Dict[str, Any]]]:
        """The best, rated here, of the sweep's plans that are valid here (ties: the first); None where none is."""
        assert self.balanced.choose_from is not None
        plans, known = self.balanced.choose_from
        best: Optional[Tuple[float, Solution]] = None
        count, index = 0, option_index(table_options)
        for plan in plans:
            solution = solution_of(table_options, {k: (v[0], v[1], tuple(v[2])) for k, v in plan.items()}, index)
            r = None if solution is None else valid_rating(problem, solution)
            if solution is None or r is None:
                continue
            count += 1
            if best is None or r < best[0]:
                best = (r, solution)
        if best is None:
            return None
        facts = {"torchrec": dict(known.get("torchrec", {})), "skipped": dict(known.get("skipped", {})),
                 "winner": "sweep", "optimal": False, "pooled": 0,
                 "starts": {"sweep": {"rating": best[0], "improved": best[0], "changed": True}}, "chosen_of": count}
        return best[1], facts

    RELEASE_SHARDS = 50_000_000  # shards in a problem's options above which its numbers are let go once planned

    @staticmethod
    def _settled(problem: Problem, table_options: List[List[ShardingOption]], space: List[ShardingOption],
                 solution: Solution) -> Tuple[float, bool]:
        """The chosen plan checked on the search's numbers and remembered for later points: its rating there, and
        whether those numbers are let go (above :attr:`RELEASE_SHARDS` shards: a later point of this process builds
        them again), so that the chosen plan's TorchRec objects are not built on top of them (20,000 x 8,192: 5 GB)."""
        ours = valid_rating(problem, solution)
        assert ours is not None, f"the balanced search's plan is not valid: {valid(problem, solution)}"
        remember(problem, table_options, solution)
        released = sum(len(c.perf) for options in problem.tables for c in options) > BalancedPlanner.RELEASE_SHARDS
        if released:
            forget_problem(space)
        return ours, released

    def _done(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]],
              table_options: List[List[ShardingOption]], reserved: Topology, solution: Solution,
              facts: Dict[str, Any], ours: float, released: bool, start_time: float) -> ShardingPlan:
        if released:  # the search's numbers, freed: their pages back before TorchRec's objects are built
            return_freed_memory()
        # TorchRec's full options (every shard, with its own estimates), private copies, for the chosen plan only
        options = [expand(options[o]) for options, o in zip(table_options, solution.picks, strict=True)]
        ranks = [r.tolist() for r in solution.ranks]
        facts["rating"] = self._torchrec_rating(options, ranks, reserved, ours)
        self.balanced.facts = facts
        self._counts.update(best=facts["rating"], seconds=time.perf_counter() - start_time)
        self._report()
        return self._finish(module, sharders, options, ranks, start_time, private=True)

    def _torchrec_rating(self, options: List[ShardingOption], ranks: List[List[int]], reserved: Topology,
                         ours: float) -> float:
        """TorchRec's perf model's rating of the plan, after checking every device's storage as TorchRec's
        partitioner checks it (``Storage.fits_in``); it must equal the search's own."""
        for option, option_ranks in zip(options, ranks, strict=True):
            for shard, rank in zip(option.shards, option_ranks, strict=True):
                shard.rank = rank
        try:
            used = summed_per_rank((s for option in options for s in option.shards), lambda s: id(s.storage),
                                   lambda s: (s.storage.hbm, s.storage.ddr, s.storage.ssd), 3, len(reserved.devices),
                                   np.int64)  # whole bytes
            torchrec_rating = self._perf_model.rate(plan=options)
        finally:
            reset_shard_rank(options)
        over = [d.rank for d, u in zip(reserved.devices, used.tolist(), strict=True)
                if not Storage(hbm=u[0], ddr=u[1], ssd=u[2]).fits_in(d.storage)]
        assert not over, f"the balanced plan overfills ranks {over}"
        assert abs(torchrec_rating - ours) <= 1e-9 * max(1.0, abs(ours)), (torchrec_rating, ours)
        return float(torchrec_rating)

    def _torchrec_plan(self, name: str, space: List[ShardingOption], reserved: Topology
                       ) -> Optional[Tuple[List[ShardingOption], List[List[int]]]]:
        """TorchRec's plan with proposer ``name`` for these options (chosen options and their shards' ranks), found as
        ``sharding.proposer=<name>`` finds it (the runner's loop, :mod:`runner.plan.torchrec_adapter.dp_proposer`,
        :mod:`runner.plan.torchrec_adapter.greedy_proposers`); None where it finds none."""
        world, declared = len(reserved.devices), PROPOSERS[name]

        def make() -> Any:
            return part(str(declared.builds))(self.balanced.sharding, self.balanced.device_type, world)

        # where it finds none (and its declaration says so), again without the options no device can hold
        tries = [space, placeable_only(space, reserved)] if declared.retries_placeable else [space]
        for candidates in tries:
            proposer = make()
            proposer.load(search_space=candidates, enumerator=self._enumerator)
            proposer.exact_partitioner = type(self._partitioner) is GreedyPerfPartitioner
            with shared_uniform_prefixes(reserved.devices):
                found = self._search(proposer, reserved, time.perf_counter(), candidates)
            if found is not None:
                return found
        return None


def build(sharding: ShardingSchema, device_type: str, world_size: int) -> BalancedProposer:
    """``sharding.proposer=balanced``, with the TorchRec plans it starts from (``sharding.balanced_compare``)."""
    compare = sharding.balanced_compare
    here = [n for n in BALANCED_STARTS if device_type == "cuda" or PROPOSERS[n].cpu]  # those these workers may use
    if compare is None:
        compare = [n for n in here if PROPOSERS[n].balanced_default]
    if any(n not in here for n in compare):
        raise ConfigError("sharding.balanced_compare", list(compare), f"[] or a list of {', '.join(here)} on "
                          "CPU workers (a proposer binning HBM does not run there)")
    timeout = sharding.planner_timeout_s
    return BalancedProposer(int(sharding.balanced_work), list(compare), patience=int(sharding.balanced_patience),
                            gap=float(sharding.balanced_gap), timeout_s=None if timeout is None else float(timeout),
                            auto=sharding.balanced_compare is None, sharding=sharding, device_type=device_type)
