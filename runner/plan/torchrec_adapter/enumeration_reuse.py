"""What a plan-only sweep computes once per process instead of once per point.

The points of a typical study (bandwidths x storage reserve x proposer) share the model, its tables'
sharding options (every table x sharding type x kernel, with each shard's size) and those options'
storage estimates; only the perf estimate (most of an enumeration's time) reads the bandwidths, and only
the proposers and partitioner read the reserve. :class:`ReusingEnumerator` is TorchRec's
``EmbeddingEnumerator`` that keeps the enumerated options of its key, with their estimates per pair of
bandwidths: a later call with the same key and bandwidths gets a copy, one with other bandwidths a copy
with the perf estimate redone. The planner then sees exactly what a fresh enumeration would give
(``tests/plan/test_reuse.py`` compares plans and estimates with fresh planner calls).

The key holds every config value enumeration reads: the model and its optimizer and precision, the
batch size and pooling, the sharding types, kernels and constraints, and the cluster's shape and
memory; not the bandwidths, the reserve or the proposer. Which keys those are is said once, in
:mod:`runner.config.roles` (``NOT_ENUMERATED``).
"""

from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Tuple

from torchrec.distributed.planner.types import ShardingOption, Topology

from runner.plan.torchrec_adapter import parallel_estimates
from runner.plan.torchrec_adapter.compact_enumeration import CompactEnumerator, estimator_input, search_space_kept

if TYPE_CHECKING:
    from torch import nn
    from torchrec.distributed.types import ModuleSharder

    from runner.plan.spec import PlanSpec

_OPTIONS: Dict[str, Tuple[List[ShardingOption], Any, Any]] = {}
_MODELS: Dict[str, Any] = {}


def model_key(spec: PlanSpec) -> str:
    """What the planning model depends on: the model, its tables' optimizer and dtype, the dense inputs."""
    tree = spec.enumerated
    return json.dumps({g: tree[g] for g in ("model", "optimizer", "precision")} |
                      {"num_dense": spec.num_dense}, sort_keys=True, default=str)


def enumeration_key(spec: PlanSpec, world: int, local_world: int, device_type: str, batch: int) -> str:
    """Everything enumeration and the storage estimate read; not bandwidths, reserve or proposer."""
    tree = spec.enumerated
    return json.dumps({"model": model_key(spec), "sharding": tree["sharding"], "cluster": tree["cluster"],
                       "data": tree["data"], "world": world, "local": local_world, "device": device_type,
                       "batch": batch, "accumulate": spec.accumulate}, sort_keys=True, default=str)


def reused_model(key: str, build: Callable[[], nn.Module]) -> nn.Module:
    """``build()``'s model on the meta device, built once per process for each :func:`model_key` (``key``)."""
    if key not in _MODELS:
        _MODELS[key] = build()
    return _MODELS[key]


def perf_knobs(topology: Topology) -> Tuple[Any, ...]:
    """The topology's values that TorchRec's perf estimator reads and its enumeration does not: the bandwidths
    (a sweep's points) and the constants a calibration sets (:mod:`runner.plan.cost.calibration`)."""
    return (topology.intra_host_bw, topology.inter_host_bw, topology.hbm_mem_bw, topology.ddr_mem_bw,
            topology.hbm_to_ddr_mem_bw, topology.bwd_compute_multiplier, str(getattr(topology, "comms_bandwidths", "")))


class ReusingEnumerator(CompactEnumerator):
    """TorchRec's enumerator (compact or not, :mod:`.compact_enumeration`), whose options and estimates are reused by
    later calls with its key: all of them for the same bandwidths, all but the perf estimate (redone) for others."""

    def __init__(self, key: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._key = f"{key}|compact={self.compact}"
        self._bw_key = f"{self._key}|{perf_knobs(kwargs['topology'])!r}"

    def enumerate(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]]) -> List[ShardingOption]:
        exact = _OPTIONS.get(self._bw_key)
        if exact is not None:
            return self._hand_out(exact, module, sharders)
        near = _OPTIONS.get(self._key)
        if near is None:
            with search_space_kept():  # what it returns is what it keeps: handed out as it is (below)
                options = super().enumerate(module, sharders)
            _OPTIONS[self._key] = _OPTIONS[self._bw_key] = (options, self._sharder_map, estimator_input(self))
            return options
        options = copy.deepcopy(near[0])
        perf = [e for e in self._estimators if "Storage" not in type(e).__name__]  # storage is the same
        parallel_estimates.estimate(perf, options, near[2], self.progress)  # perf reads this point's bandwidths
        _OPTIONS[self._bw_key] = (options, near[1], near[2])
        return self._hand_out(_OPTIONS[self._bw_key], module, sharders)

    def _hand_out(self, entry: Tuple[List[ShardingOption], Any, Any], module: nn.Module,
                  sharders: List[ModuleSharder[nn.Module]]) -> List[ShardingOption]:
        """A kept entry, with the state TorchRec's own enumerate leaves behind. Handed out as it is, not
        copied: planning only sets its shards' ranks, and puts them back (``reset_shard_rank``) before
        its next plan; the best plan is a copy."""
        self._sharder_map = entry[1]
        if "sharder_data_map" in entry[2]:
            self._sharder_data_map = entry[2]["sharder_data_map"]
        self._last_stored_module, self._last_stored_sharders = module, sharders
        self._last_stored_search_space = entry[0]  # read-only: TorchRec copies it when it reuses it
        return entry[0]
