"""TorchRec's planning loop for the dynamic-programming proposer, at the scale of a thousand tables.

:class:`SearchLoopPlanner` is TorchRec's ``EmbeddingShardingPlanner`` whose ``plan`` runs the same loop
(reserve storage, enumerate, propose, partition, rate, keep the first strictly best plan, feed back)
without the two costs that grow with tables x GPUs and change nothing:

- TorchRec deep-copies a plan each time one rates better than the best so far (a thousand options, up to
  128 shards each: a third of a 1000-table plan's time). Here each better plan's shard ranks are kept
  and the best one is deep-copied once, at the end, in the state TorchRec would have copied.
- TorchRec keys its proposal cache on each proposal's content hash (every shard's sizes, storage and perf,
  per proposal). Within one search space every option is a distinct object with a distinct
  (table, sharding type, kernel), so the options' identities key the same cache.

Deep copies of shards, storage, perf and devices take :func:`.dataclass_copies.quick_copies` meanwhile (the same
copies, faster), and TorchRec's greedy partitioner places each prefix of uniform options once
(:func:`.shared_placements.shared_uniform_prefixes`: the same states, reused). Every other step is TorchRec's own
call: its storage reservation, enumerator, proposer, partitioner, perf model, ``to_sharding_plan``, stats
and checks. Other proposers run TorchRec's own ``plan``.
``tests/plan/test_search.py`` compares plans and per-rank estimates with TorchRec's planner.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from torch import nn
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.constants import MAX_SIZE
from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.planners import to_sharding_plan
from torchrec.distributed.planner.types import (
    Partitioner,
    PlannerError,
    PlannerErrorType,
    ShardingOption,
    Topology,
)
from torchrec.distributed.planner.utils import reset_shard_rank
from torchrec.distributed.types import ModuleSharder, ShardingPlan

from runner.plan.torchrec_adapter.dataclass_copies import quick_copies
from runner.plan.torchrec_adapter.dp_proposer import SkippingProposer
from runner.plan.torchrec_adapter.partition_helper import PartitionHelper, rate
from runner.plan.torchrec_adapter.shared_placements import shared_uniform_prefixes
from runner.runtime.cores import may_fork

Progress = Callable[[Dict[str, Any]], None]
HELPER_AFTER_S = 2.0  # a search still running after this many seconds partitions in two processes


class SearchLoopPlanner(EmbeddingShardingPlanner):
    """See the module doc. ``progress``, when given, is called once the options are enumerated and then
    about once a second with the search's counts: tables, options, proposals partitioned and skipped, the
    best rating so far (the busiest rank's estimated ms per step) and the seconds since the plan began."""

    _partitioner: Partitioner  # TorchRec's, set by its constructor

    def __init__(self, *args: Any, progress: Optional[Progress] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._progress = progress
        self._counts: Dict[str, Any] = {}
        self.cut_short: Optional[str] = None  # the words of a search the safety stop cut (planner_timeout_s)

    def plan(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]]) -> ShardingPlan:
        proposers = self._proposers
        with quick_copies():
            if len(proposers) != 1 or not isinstance(proposers[0], SkippingProposer) or self.plan_loader is not None:
                return self._torchrec_loop(module, sharders)
            return self._plan(module, sharders, proposers[0])

    def _torchrec_loop(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]]) -> ShardingPlan:
        """TorchRec's own ``plan`` (its proposers' loop), its proposals counted as its partitioner takes each one and
        reported about once a second (300 tables on 64 GPUs search for minutes)."""
        if self._progress is None:
            return super().plan(module, sharders)
        partitioner = self._partitioner
        self._partitioner = _Counted(partitioner, self._progress)
        try:
            return super().plan(module, sharders)
        finally:
            self._partitioner = partitioner

    def _plan(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]], proposer: SkippingProposer
              ) -> ShardingPlan:
        proposer.exact_partitioner = type(self._partitioner) is GreedyPerfPartitioner
        start_time = time.perf_counter()
        storage_constraint, search_space = self._reserve_and_enumerate(module, sharders, start_time)
        if not search_space:
            return ShardingPlan({})
        proposer.load(search_space=search_space, enumerator=self._enumerator)
        if proposer.exact_partitioner:
            with shared_uniform_prefixes(storage_constraint.devices) as prefixes:
                best = self._search(proposer, storage_constraint, start_time, search_space)
            self._counts.update(uniform_reused=prefixes.reused, uniform_placed=prefixes.placed)
        else:
            best = self._search(proposer, storage_constraint, start_time, search_space)
        if best is None:
            raise PlannerError(
                error_type=PlannerErrorType.INSUFFICIENT_STORAGE,
                message=f"the {proposer.name} proposer's {self._num_proposals} proposals found no plan "
                        f"({proposer.skipped_unplaceable} held a shard no device can hold)")
        return self._finish(module, sharders, *best, start_time)

    def _reserve_and_enumerate(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]],
                               start_time: float) -> Tuple[Topology, List[ShardingOption]]:
        """TorchRec's first two steps: the storage reservation (the devices' storage left for tables) and the
        enumerated options; the counts reported (progress) from here on start."""
        self._num_proposals = self._num_plans = 0
        reserved: Topology = self._storage_reservation.reserve(
            topology=self._topology, batch_size=self._batch_size, module=module, sharders=sharders,
            constraints=self._constraints)
        space = self._enumerator.enumerate(module=module, sharders=sharders)
        self._counts = {"tables": len({o.name for o in space}), "options": len(space), "partitioned": 0,
                        "skipped": 0, "best": None, "seconds": time.perf_counter() - start_time}
        if space:
            self._report()
        return reserved, space

    def _report(self) -> None:
        if self._progress is not None:
            self._progress(dict(self._counts))

    def _finish(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]], options: List[ShardingOption],
                ranks: List[List[int]], start_time: float, private: bool = False) -> ShardingPlan:
        """TorchRec's end of a plan: the chosen options with their shards' ranks, copied once (``private``: the options
        are already this plan's own copies); callbacks, ``to_sharding_plan`` and stats as TorchRec's loop calls them."""
        for option, option_ranks in zip(options, ranks, strict=True):
            for shard, rank in zip(option.shards, option_ranks, strict=True):
                shard.rank = rank
        best_plan = options if private else copy.deepcopy(options)
        if not private:
            reset_shard_rank(options)
        for callback in self._callbacks:
            best_plan = callback(best_plan)
        self._best_plan = best_plan
        sharding_plan = to_sharding_plan(best_plan, self._topology)
        for stats in self._stats:
            stats.log(sharding_plan=sharding_plan, topology=self._topology, batch_size=self._batch_size,
                      storage_reservation=self._storage_reservation, num_proposals=self._num_proposals,
                      num_plans=self._num_plans, run_time=time.perf_counter() - start_time, best_plan=best_plan,
                      constraints=self._constraints, enumerator=self._enumerator, sharders=sharders,
                      debug=self._debug)
        return sharding_plan

    def _search(self, proposer: SkippingProposer, storage_constraint: Topology, start_time: float,
                search_space: List[ShardingOption]) -> Optional[Tuple[List[ShardingOption], List[List[int]]]]:
        """TorchRec's loop: the first plan with the strictly lowest rating, as (options, their shards' ranks). A search
        still running after :data:`HELPER_AFTER_S` in a process that may fork (:func:`runner.runtime.cores.may_fork`)
        hands proposals to a :class:`.partition_helper.PartitionHelper` while it partitions others here."""
        rated: Dict[int, float] = {}  # proposal index -> rating, for those that partitioned
        kept: Dict[int, Tuple[List[ShardingOption], List[List[int]]]] = {}  # those rated here that may win
        handed: Dict[int, List[ShardingOption]] = {}
        cache: Dict[Tuple[int, ...], Tuple[bool, Optional[float]]] = {}
        helper: Optional[PartitionHelper] = None
        may_help = may_fork()
        start = last_report = time.time()
        index = 0
        try:
            proposal = proposer.propose()
            while proposal:
                now = time.time()
                if self._timeout_seconds and now - start > self._timeout_seconds:
                    self.cut_short = (f"the search was cut short by sharding.planner_timeout_s="
                                      f"{self._timeout_seconds:g} after {self._num_proposals:,} proposals: another "
                                      "machine or load may give another plan")
                    break
                if self._progress is not None and now - last_report >= 1.0:
                    last_report = now
                    best = min(rated.values(), default=None)
                    self._counts.update(partitioned=self._num_proposals, skipped=proposer.skipped, best=best,
                                        seconds=time.perf_counter() - start_time)
                    self._report()
                key = tuple(sorted(map(id, proposal)))
                if key in cache:  # the same proposal again: an earlier one rated the same, never strictly better
                    partitionable, rating = cache[key]
                    proposer.feedback(partitionable=partitionable, plan=proposal, perf_rating=rating,
                                      storage_constraint=storage_constraint)
                    proposal = proposer.propose()
                    continue
                self._num_proposals += 1
                index += 1
                if helper is None and may_help and now - start > HELPER_AFTER_S:
                    helper = PartitionHelper(search_space, self._partitioner, self._perf_model, storage_constraint)
                if helper is not None and not helper.failed and len(helper.held) < 2 and helper.hand(index, proposal):
                    handed[index] = helper.held[index]
                    cache[key] = (False, None)
                    proposer.feedback(partitionable=False, plan=proposal, storage_constraint=storage_constraint)
                else:
                    rating = self._partition(index, proposal, storage_constraint, rated, kept)
                    cache[key] = (rating is not None, rating)
                    proposer.feedback(partitionable=rating is not None, plan=proposal, perf_rating=rating,
                                      storage_constraint=storage_constraint)
                if helper is not None:
                    self._take(helper.answers(), proposer, rated)
                proposal = proposer.propose()
            if helper is not None:
                self._take(helper.answers(wait=True), proposer, rated)
                for i in sorted(helper.held):  # the helper failed: what it held is partitioned here
                    self._partition(i, helper.held.pop(i), storage_constraint, rated, kept)
        finally:
            if helper is not None:
                helper.close()
        self._counts["helped"] = len(handed)  # proposals handed to the helper
        return self._first_best(rated, kept, handed, storage_constraint)

    def _partition(self, index: int, proposal: List[ShardingOption], storage_constraint: Topology,
                   rated: Dict[int, float], kept: Dict[int, Any]) -> Optional[float]:
        """TorchRec's partition and rating of one proposal here (None: it does not partition); its shard
        ranks kept when no earlier proposal rated as well."""
        rating = rate(self._partitioner, self._perf_model, proposal, storage_constraint)
        if rating is not None:
            self._num_plans += 1
            rated[index] = rating
            if rating < min((r for i, r in rated.items() if i < index), default=MAX_SIZE):
                kept[index] = (list(proposal), [[shard.rank for shard in option.shards] for option in proposal])
        reset_shard_rank(proposal)
        return rating

    def _take(self, answers: List[Any], proposer: SkippingProposer, rated: Dict[int, float]) -> None:
        for index, partitionable, rating in answers:
            if partitionable:
                self._num_plans += 1
                rated[index] = rating
                if proposer.best is None or rating < proposer.best:
                    proposer.best = rating  # the skips' bound: the best rating found so far

    def _first_best(self, rated: Dict[int, float], kept: Dict[int, Any], handed: Dict[int, List[ShardingOption]],
                    storage_constraint: Topology) -> Optional[Tuple[List[ShardingOption], List[List[int]]]]:
        """The first plan in proposal order with the strictly lowest rating (TorchRec's choice); one the
        helper rated is partitioned here again for its ranks."""
        best_rating, winner = MAX_SIZE, None
        for index in sorted(rated):
            if rated[index] < best_rating:
                best_rating, winner = rated[index], index
        if winner is None:
            return None
        if winner not in kept:
            again: Dict[int, float] = {}
            self._num_plans -= 1  # counted when the helper answered
            self._partition(winner, handed[winner], storage_constraint, again, kept)
            assert again.get(winner) == rated[winner], "the helper's partition differs from this process's"
        return kept[winner]


class _Counted(Partitioner):
    """TorchRec's partitioner ``inner``, the proposals it partitions counted for ``progress`` every :data:`EVERY_S`."""

    EVERY_S = 1.0

    def __init__(self, inner: Partitioner, progress: Progress) -> None:
        self.inner, self.progress, self.partitioned = inner, progress, 0
        self.start = self.last = time.perf_counter()

    def partition(self, proposal: List[ShardingOption], storage_constraint: Topology, *args: Any, **kwargs: Any
                  ) -> List[ShardingOption]:
        self.partitioned += 1
        if (now := time.perf_counter()) - self.last >= self.EVERY_S:
            self.last = now
            self.progress({"phase": "searching", "seconds": now - self.start,
                           "detail": f"TorchRec's proposers, {self.partitioned:,} proposals partitioned"})
        return self.inner.partition(proposal, storage_constraint, *args, **kwargs)
