"""The proposer a config names: TorchRec's, at scale where the runner makes them fast with TorchRec's answers
(:mod:`.speedups.dp_proposer`, :mod:`.speedups.greedy_proposers`), or the runner's own (:mod:`.balanced`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, List

from torchrec.distributed.planner.proposers import GridSearchProposer, UniformProposer
from torchrec.distributed.planner.types import ShardingOption

from runner.config.errors import ConfigError, PlanError
from runner.plan.balanced import BalancedProposer
from runner.plan.speedups.dp_proposer import SkippingProposer, VectorisedDynamicProgrammingProposer
from runner.plan.speedups.greedy_proposers import SkippingGreedyProposer

if TYPE_CHECKING:
    from runner.config.schema_model import ShardingSchema



class BoundedGridSearchProposer(GridSearchProposer):
    """TorchRec's grid search, failing loudly where TorchRec's silently proposes nothing.

    Above ``max_proposals`` combinations TorchRec's proposer skips itself, and the planner then reports
    a misleading "insufficient storage".
    """

    def load(self, search_space: List[ShardingOption], enumerator: Any = None) -> None:
        per_table: Dict[str, int] = {}
        for option in search_space:
            per_table[option.fqn] = per_table.get(option.fqn, 0) + 1
        total = math.prod(per_table.values())
        if total > self._max_proposals:
            raise PlanError(
                f"sharding.proposer=grid_search: {total:.3g} combinations of {len(per_table)} tables exceed "
                f"sharding.grid_max_proposals={self._max_proposals}; raise it, constrain sharding.types, or use "
                "greedy or dynamic_programming")
        super().load(search_space, enumerator)


def build_proposer(sharding: ShardingSchema, device_type: str, world_size: int) -> Any:
    """TorchRec's proposer(s) for ``sharding.proposer``; None lets the planner use its default list. The
    dynamic-programming one is TorchRec's, vectorised and skipping what cannot change its answer
    (:mod:`.speedups.dp_proposer`)."""
    if sharding.proposer == "dynamic_programming":
        if device_type != "cuda":
            raise ConfigError("sharding.proposer", sharding.proposer,
                              "another proposer on CPU workers (it bins HBM, which they do not have)")
        return SkippingProposer(VectorisedDynamicProgrammingProposer(hbm_bins_per_device=sharding.dp_hbm_bins),
                                world_size)
    if sharding.proposer == "balanced":
        compare = sharding.balanced_compare
        if compare is None:
            compare = ["dynamic_programming"] if device_type == "cuda" else []
        if device_type != "cuda" and "dynamic_programming" in compare:
            raise ConfigError("sharding.balanced_compare", list(compare),
                              "[] or [greedy] on CPU workers (the dynamic-programming proposer bins HBM)")
        if not sharding.balanced_budget_s > 0:
            raise ConfigError("sharding.balanced_budget_s", sharding.balanced_budget_s, "a number of seconds > 0")
        return BalancedProposer(float(sharding.balanced_budget_s), list(compare),
                                auto=sharding.balanced_compare is None)
    if sharding.proposer == "greedy":
        return SkippingGreedyProposer(world_size)
    if sharding.proposer == "grid_search":
        return BoundedGridSearchProposer(max_proposals=sharding.grid_max_proposals)
    if sharding.proposer == "uniform":
        return UniformProposer()
    return None
