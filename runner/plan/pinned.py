"""A plan given as a file (``sharding.plan``), rated as the planner rates the plans it finds: each table's sharding
option enumerated by TorchRec's own enumerator and estimators with the job's topology, constants and pipeline, its
shards placed on the file's ranks. A pinned plan's run then shows the same estimates (TorchRec's per-rank perf and
storage, and with a calibration the whole step) as the plan would have had if the planner had chosen it, so that
plans can be compared by estimate and by measurement one by one (``make bench-estimates``' ranking study).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Tuple

from torchrec.distributed.planner import Topology
from torchrec.distributed.planner.types import ShardingOption
from torchrec.distributed.types import ShardingPlan

if TYPE_CHECKING:
    from torch import nn

    from runner.plan.spec import PlanSpec


def _sizes(parameter_sharding: Any) -> List[Tuple[int, ...]]:
    """The shard sizes a plan's table holds, in shard order (none for a data-parallel table)."""
    spec = parameter_sharding.sharding_spec
    return [tuple(s.shard_sizes) for s in spec.shards] if spec is not None else []


def _matches(option: ShardingOption, parameter_sharding: Any) -> bool:
    """``option`` is the plan's choice for its table: the same sharding type, compute kernel and shards."""
    if option.sharding_type != parameter_sharding.sharding_type:
        return False
    if option.compute_kernel != parameter_sharding.compute_kernel:
        return False
    sizes = _sizes(parameter_sharding)
    return not sizes or [tuple(s.size) for s in option.shards] == sizes


def pinned_options(spec: PlanSpec, model: nn.Module, plan: ShardingPlan, sharders: List[Any],
                   inputs: Tuple[Topology, int, Dict[str, Any]]) -> List[ShardingOption]:
    """``plan``'s tables as the planner's chosen options: TorchRec's enumeration of ``model`` with ``inputs``, the
    topology, batch and constraints every planner of ``spec`` plans with (:func:`runner.plan.planner.planner_inputs`),
    each table's option that the plan chose, its shards on the plan's ranks. Empty where a table's choice is not
    among the options (a plan written with settings this job's enumerator does not offer): the run then shows no
    estimate, as before."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

    from runner.plan.plan_memory import stock_estimators

    topology, batch, constraints = inputs
    enumerator = EmbeddingEnumerator(topology=topology, batch_size=batch, constraints=constraints,
                                     estimator=stock_estimators(topology, constraints, spec.pipeline))
    options: Dict[Tuple[str, str], List[ShardingOption]] = {}
    for option in enumerator.enumerate(model, sharders):
        options.setdefault((option.path, option.name), []).append(option)
    chosen: List[ShardingOption] = []
    for path, module_plan in plan.plan.items():
        for table, parameter_sharding in module_plan.items():
            found = next((o for o in options.get((path, table), []) if _matches(o, parameter_sharding)), None)
            ranks = parameter_sharding.ranks or []
            if found is None or len(ranks) != len(found.shards):
                return []
            for shard, rank in zip(found.shards, ranks, strict=True):
                shard.rank = rank
            chosen.append(found)
    return chosen
