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
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.proposers import DynamicProgrammingProposer
from torchrec.distributed.planner.types import ShardingOption, Storage, Topology

RATING_MARGIN = 1e-9  # relative: a bound within rounding of the best plan is never skipped


class VectorisedDynamicProgrammingProposer(DynamicProgrammingProposer):
    """TorchRec's ``DynamicProgrammingProposer`` with its table filled by NumPy (see the module doc)."""

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
        hbm = np.full((len(options), option_count), np.inf)
        perf = np.full((len(options), option_count), np.inf)
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
    option_of = np.full((tables, bins), -1, dtype=np.int64)
    prev_of = np.full((tables, bins), -1, dtype=np.int64)
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


class _OptionFacts:
    """Per option, what skipping reads: whether each shard fits on some device, its perf (total, largest)."""

    def __init__(self, devices: List[Storage]) -> None:
        self.devices = devices
        self._facts: Dict[int, Tuple[ShardingOption, bool, float, float]] = {}

    def __call__(self, option: ShardingOption) -> Tuple[bool, float, float]:
        kept = self._facts.get(id(option))
        if kept is None or kept[0] is not option:
            placeable = all(any(s.storage.fits_in(d) for d in self.devices) for s in option.shards)
            perfs = [s.perf.total for s in option.shards]
            kept = (option, placeable, sum(perfs), max(perfs, default=0.0))
            self._facts[id(option)] = kept
        return kept[1:]


def device_storages(topology: Topology) -> List[Storage]:
    """The distinct storages of a (reserved) topology's devices."""
    seen: Dict[Tuple[int, int, int], Storage] = {}
    for d in topology.devices:
        seen.setdefault((d.storage.hbm, d.storage.ddr, d.storage.ssd), d.storage)
    return list(seen.values())


class SkippingProposer:
    """A dynamic-programming proposer that hands the planner only the proposals that can change its answer
    (see the module doc); counts what it skipped."""

    def __init__(self, inner: DynamicProgrammingProposer, world_size: int) -> None:
        self.inner, self.world_size = inner, world_size
        self.best: Optional[float] = None
        self.facts: Optional[_OptionFacts] = None
        self.skipped_unplaceable = self.skipped_bound = 0
        self._constraint: Optional[Topology] = None

    def load(self, search_space: List[ShardingOption], enumerator: Any = None) -> None:
        self.inner.load(search_space, enumerator)
        self.best, self.facts, self._constraint = None, None, None
        self.skipped_unplaceable = self.skipped_bound = 0

    def _skip(self, proposal: List[ShardingOption]) -> bool:
        assert self.facts is not None
        total, largest = 0.0, 0.0
        for option in proposal:
            placeable, option_total, option_largest = self.facts(option)
            if not placeable:
                self.skipped_unplaceable += 1
                return True
            total, largest = total + option_total, max(largest, option_largest)
        if self.best is not None and max(total / self.world_size, largest) > self.best * (1 + RATING_MARGIN):
            self.skipped_bound += 1
            return True
        return False

    def propose(self) -> Optional[List[ShardingOption]]:
        proposal = self.inner.propose()
        while proposal is not None and self.facts is not None and self._skip(proposal):
            self.inner.feedback(partitionable=False, plan=proposal, storage_constraint=self._constraint)
            proposal = self.inner.propose()
        return proposal

    def feedback(self, partitionable: bool, plan: Optional[List[ShardingOption]] = None,
                 perf_rating: Optional[float] = None, storage_constraint: Optional[Topology] = None) -> None:
        if storage_constraint is not None and self.facts is None:
            self._constraint, self.facts = storage_constraint, _OptionFacts(device_storages(storage_constraint))
        if partitionable and perf_rating is not None and (self.best is None or perf_rating < self.best):
            self.best = perf_rating
        self.inner.feedback(partitionable, plan, perf_rating, storage_constraint)


def placeable_only(search_space: List[ShardingOption], reserved: Topology) -> List[ShardingOption]:
    """The options whose every shard fits on some device of the reserved topology."""
    facts = _OptionFacts(device_storages(reserved))
    return [o for o in search_space if facts(o)[0]]


class FixedEnumerator(EmbeddingEnumerator):
    """An enumerator that hands out a search space already enumerated (the placeable options of a planner
    whose proposer found no plan), with the state TorchRec's own enumerate leaves behind."""

    def __init__(self, space: List[ShardingOption], done: EmbeddingEnumerator, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._space, self._done = space, done

    def enumerate(self, module: Any, sharders: List[Any]) -> List[ShardingOption]:
        self._sharder_map, self._sharder_data_map = self._done._sharder_map, self._done._sharder_data_map
        self._last_stored_module, self._last_stored_sharders = module, sharders
        self._last_stored_search_space = self._space
        return copy.deepcopy(self._space)
