"""TorchRec's dynamic-programming proposer at the scale of hundreds of tables on a hundred GPUs, with
TorchRec's answers.

Three exact speed-ups, and one step further where TorchRec finds nothing:

1. :class:`VectorisedDynamicProgrammingProposer` fills TorchRec's table (tables x options x HBM bins,
   12,800 bins at 128 GPUs) with NumPy instead of a Python loop: the same float64 arithmetic, the same
   strict comparisons in the same order (ties keep the earlier option and the lower bin), so the same
   proposals in the same order.
2. :class:`SkippingProposer` hands the planner only the proposals that can change its answer. A proposal
   is skipped when one of its shards fits on no device of the reserved topology (TorchRec's partitioner
   would fail it: devices only fill up as shards are placed), or when it cannot rate strictly better than
   the best plan so far (the planner keeps the first best: a plan's rating, TorchRec's ``NoopPerfModel``,
   is the busiest rank's perf, at least the mean over ranks and at least any one shard's). The dynamic
   programming proposer's feedback only moves to its next proposal, so skipping changes nothing else.
3. Where every proposal fails, :func:`placeable_only` drops the options with a shard that fits on no
   device and proposes again: TorchRec's proposer bins options by total HBM only, so it can fill every
   proposal with a table-wise option of a table larger than one GPU. The plan found then is partitioned
   and rated by TorchRec's own code; the run says it was found this way.

``tests/plan/test_search.py`` compares proposals, plans and estimates with TorchRec's own calls.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.proposers import DynamicProgrammingProposer
from torchrec.distributed.planner.types import PartitionByType, ShardingOption, Storage, Topology

if TYPE_CHECKING:
    from torch import nn
    from torchrec.distributed.planner.types import DeviceHardware, Enumerator, Proposer
    from torchrec.distributed.types import ModuleSharder

    from runner.config.schema import ShardingSchema

RATING_MARGIN = 1e-9  # relative: a bound within rounding of the best plan is never skipped


class VectorisedDynamicProgrammingProposer(DynamicProgrammingProposer):
    """TorchRec's ``DynamicProgrammingProposer`` with its table filled by NumPy (see the module doc)."""

    _inited: bool  # TorchRec's: whether the table was filled

    def feedback(self, partitionable: bool, plan: Optional[List[ShardingOption]] = None,
                 perf_rating: Optional[float] = None, storage_constraint: Optional[Topology] = None) -> None:
        if self._inited:
            super().feedback(partitionable, plan, perf_rating, storage_constraint)
            return
        self._inited = True
        assert storage_constraint is not None
        hbm_total = sum([x.storage.hbm for x in storage_constraint.devices])
        bin_count = self._hbm_bins_per_device * len(storage_constraint.devices)
        bin_size = float(hbm_total) / bin_count
        options = list(self._sharding_options_by_fqn.values())
        option_count = max(len(x) for x in options)
        hbm, perf = np.full((len(options), option_count), np.inf), np.full((len(options), option_count), np.inf)
        for t, table_options in enumerate(options):
            for o, option in enumerate(table_options):
                hbm[t, o] = float(option.total_storage.hbm) / bin_size
                perf[t, o] = option.total_perf
        self._proposal_list = _proposals(*_fill(hbm, perf, bin_count))
        if self._proposal_list:
            self._current_proposal = 0


def _fill(hbm: np.ndarray, perf: np.ndarray, bins: int) -> Tuple[np.ndarray, np.ndarray]:
    """TorchRec's DP: per table and bin, the best (perf, hbm) and how it was reached (option, previous bin)."""
    tables, options = hbm.shape
    best_perf, best_hbm = np.full(bins, np.inf), np.full(bins, np.inf)
    option_of, prev_of = np.full((tables, bins), -1, dtype=np.int64), np.full((tables, bins), -1, dtype=np.int64)
    for o in range(options):  # table 0: an option fills the bin of its own HBM
        if hbm[0, o] < bins:
            i = int(hbm[0, o])
            if best_perf[i] > perf[0, o]:
                best_perf[i], best_hbm[i], option_of[0, i] = perf[0, o], hbm[0, o], o
    sources = np.arange(bins)
    for t in range(1, tables):
        last_perf, last_hbm = best_perf, best_hbm
        best_perf, best_hbm = np.full(bins, np.inf), np.full(bins, np.inf)
        live = last_perf < np.inf
        for o in range(options):
            new_hbm = last_hbm + hbm[t, o]
            ok = live & (new_hbm < bins)
            if not ok.any():
                continue
            src, target = sources[ok], new_hbm[ok].astype(np.int64)
            new_perf = last_perf[ok] + perf[t, o]
            # sources in bin order reach targets in non-decreasing order (a bin's hbm lies in [bin, bin + 1)),
            # so each target's candidates are one run; TorchRec keeps the run's first minimum
            starts = np.flatnonzero(np.r_[True, target[1:] != target[:-1]])
            mins = np.minimum.reduceat(new_perf, starts)
            hits = np.flatnonzero(new_perf == np.repeat(mins, np.diff(np.r_[starts, len(target)])))
            first = hits[np.searchsorted(hits, starts)]
            k = target[first]
            better = best_perf[k] > new_perf[first]  # strictly: an earlier option keeps a tie
            k, first = k[better], first[better]
            best_perf[k], best_hbm[k] = new_perf[first], new_hbm[src[first]]
            option_of[t, k], prev_of[t, k] = o, src[first]
    return option_of, prev_of


def _proposals(option_of: np.ndarray, prev_of: np.ndarray) -> List[List[int]]:
    """Back-tracked proposals, from the highest HBM bin to the lowest (TorchRec's order)."""
    tables, bins = option_of.shape
    ends = np.flatnonzero(option_of[tables - 1] >= 0)[::-1]
    if len(ends) == 0:
        return []
    picks = np.empty((len(ends), tables), dtype=np.int64)
    at = ends
    for t in range(tables - 1, -1, -1):
        picks[:, t] = option_of[t, at]
        at = prev_of[t, at]
    return picks.tolist()


class _ProposalFacts:
    """Per (table, option) of a loaded dynamic-programming (or greedy) proposer, as arrays: what each option's uniform
    shards (row-wise, data-parallel: shard i goes to device i) add to each device's storage, its other
    shards' storage (total and largest, per storage kind), its perf (total and largest shard), and whether
    every shard fits on some device at all."""

    def __init__(self, proposer: DynamicProgrammingProposer, devices: List[DeviceHardware]) -> None:
        options = list(proposer._sharding_options_by_fqn.values())
        tables, count, world = len(options), max(len(x) for x in options), len(devices)
        storages = device_storages_of(devices)
        self.capacity = np.array([_kinds(d.storage) for d in devices], dtype=np.int64)
        self.uniform = np.zeros((tables, count, world, 3), dtype=np.int64)
        self.rest_total = np.zeros((tables, count, 3), dtype=np.int64)
        self.rest_largest = np.zeros((tables, count, 3), dtype=np.int64)
        self.perf_total = np.zeros((tables, count))
        self.perf_largest = np.zeros((tables, count))
        self.placeable = np.ones((tables, count), dtype=bool)
        self.is_uniform = np.zeros((tables, count), dtype=bool)
        self.tables = np.arange(tables)
        for t, table_options in enumerate(options):
            for o, option in enumerate(table_options):
                sizes = np.array([_kinds(s.storage) for s in option.shards], dtype=np.int64).reshape(-1, 3)
                perfs = [s.perf.total for s in option.shards]
                self.perf_total[t, o], self.perf_largest[t, o] = sum(perfs), max(perfs, default=0.0)
                self.placeable[t, o] = _placeable(option, storages)
                if option.partition_by == PartitionByType.UNIFORM.value and len(option.shards) == world:
                    self.uniform[t, o], self.is_uniform[t, o] = sizes, True
                elif len(sizes):
                    self.rest_total[t, o], self.rest_largest[t, o] = sizes.sum(0), sizes.max(0)

    def cannot_place(self, t: np.ndarray, o: np.ndarray) -> bool:
        """Whether TorchRec's greedy partitioner must fail: it places the uniform shards first, on fixed
        devices, and devices only fill up; so it fails when they overflow a device, when the other shards
        exceed what is left on all devices together, or when one of them is larger, in some storage kind,
        than what is left of that kind on every device."""
        uniform = self.is_uniform[t, o]
        left = self.capacity - self.uniform[t[uniform], o[uniform]].sum(0)
        return bool((left < 0).any() or (self.rest_total[t, o].sum(0) > left.sum(0)).any()
                    or (self.rest_largest[t, o].max(0) > left.max(0)).any())


def _kinds(storage: Storage) -> Tuple[int, int, int]:
    return storage.hbm, storage.ddr, storage.ssd


def _placeable(option: ShardingOption, storages: List[Storage]) -> bool:
    """Whether every shard of ``option`` fits on some device (of these distinct storages) when it is empty."""
    return all(any(s.storage.fits_in(d) for d in storages) for s in option.shards)


def device_storages_of(devices: List[DeviceHardware]) -> List[Storage]:
    seen: Dict[Tuple[int, int, int], Storage] = {}
    for d in devices:
        seen.setdefault(_kinds(d.storage), d.storage)
    return list(seen.values())


class SkippingProposer:
    """A dynamic-programming proposer that hands the planner only the proposals that can change its answer
    (see the module doc); counts what it skipped. ``exact_partitioner``: the planner partitions with
    TorchRec's greedy partitioner, whose failures :meth:`_ProposalFacts.cannot_place` predicts."""

    name = "dynamic-programming"

    def __init__(self, inner: DynamicProgrammingProposer, world_size: int, exact_partitioner: bool = True) -> None:
        self.inner, self.world_size, self.exact_partitioner = inner, world_size, exact_partitioner
        self.best: Optional[float] = None
        self.facts: Optional[_ProposalFacts] = None
        self.skipped_unplaceable = self.skipped_no_room = self.skipped_bound = 0
        self._constraint: Optional[Topology] = None

    @property
    def skipped(self) -> int:
        return self.skipped_unplaceable + self.skipped_no_room + self.skipped_bound

    def load(self, search_space: List[ShardingOption], enumerator: Optional[Enumerator] = None) -> None:
        self.inner.load(search_space, enumerator)
        self.best, self.facts, self._constraint = None, None, None
        self.skipped_unplaceable = self.skipped_no_room = self.skipped_bound = 0

    def _skip_options(self, o: np.ndarray) -> bool:
        """Whether the proposal with option ``o[t]`` of each table ``t`` (in the facts' order) cannot change
        the planner's answer; counted by why."""
        facts = self.facts
        assert facts is not None
        t = facts.tables
        if not facts.placeable[t, o].all():
            self.skipped_unplaceable += 1
            return True
        if self.exact_partitioner and facts.cannot_place(t, o):
            self.skipped_no_room += 1
            return True
        if self.best is not None:
            bound = max(float(facts.perf_total[t, o].sum()) / self.world_size, float(facts.perf_largest[t, o].max()))
            if bound > self.best * (1 + RATING_MARGIN):
                self.skipped_bound += 1
                return True
        return False

    def propose(self) -> Optional[List[ShardingOption]]:
        proposal = self.inner.propose()
        # once the proposer's first feedback built its proposals: the option index per table, as proposed
        while proposal is not None and self.facts is not None and self._skip_options(
                np.asarray(self.inner._proposal_list[self.inner._current_proposal])):
            self.inner.feedback(partitionable=False, plan=proposal, storage_constraint=self._constraint)
            proposal = self.inner.propose()
        return proposal

    def feedback(self, partitionable: bool, plan: Optional[List[ShardingOption]] = None,
                 perf_rating: Optional[float] = None, storage_constraint: Optional[Topology] = None) -> None:
        if storage_constraint is not None and self.facts is None:
            self._constraint, self.facts = storage_constraint, _ProposalFacts(self.inner, storage_constraint.devices)
        if partitionable and perf_rating is not None and (self.best is None or perf_rating < self.best):
            self.best = perf_rating
        self._proposing().feedback(partitionable, plan, perf_rating, storage_constraint)

    def _proposing(self) -> Proposer:
        return self.inner


def placeable_only(search_space: List[ShardingOption], reserved: Topology) -> List[ShardingOption]:
    """The options whose every shard fits on some device of the reserved topology."""
    storages = device_storages_of(reserved.devices)
    return [o for o in search_space if _placeable(o, storages)]


class FixedEnumerator(EmbeddingEnumerator):
    """An enumerator that hands out a search space already enumerated (the placeable options of a planner
    whose proposer found no plan), with the state TorchRec's own enumerate leaves behind."""

    def __init__(self, space: List[ShardingOption], done: EmbeddingEnumerator, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._space, self._done = space, done

    def enumerate(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]]) -> List[ShardingOption]:
        self._sharder_map = self._done._sharder_map
        if hasattr(self._done, "_sharder_data_map"):  # TorchRec 1.7 on
            self._sharder_data_map = self._done._sharder_data_map
        self._last_stored_module, self._last_stored_sharders = module, sharders
        self._last_stored_search_space = self._space
        return copy.deepcopy(self._space)


def build(sharding: ShardingSchema, device_type: str, world_size: int) -> SkippingProposer:
    """``sharding.proposer=dynamic_programming``: TorchRec's, vectorised and skipping what cannot change its answer."""
    return SkippingProposer(VectorisedDynamicProgrammingProposer(hbm_bins_per_device=sharding.dp_hbm_bins), world_size)
