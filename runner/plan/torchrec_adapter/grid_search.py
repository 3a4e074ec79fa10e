"""``sharding.proposer=grid_search`` and ``uniform``: TorchRec's proposers, the grid search failing loudly where
TorchRec's silently proposes nothing."""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, List, Optional

from torchrec.distributed.planner.proposers import GridSearchProposer, UniformProposer
from torchrec.distributed.planner.types import ShardingOption

from runner.config.errors import PlanError

if TYPE_CHECKING:
    from torchrec.distributed.planner.types import Enumerator

    from runner.config.schema import ShardingSchema


class BoundedGridSearchProposer(GridSearchProposer):
    """TorchRec's grid search; above ``max_proposals`` combinations TorchRec's proposer skips itself, and the
    planner then reports a misleading "insufficient storage": here that is one line naming the limit."""

    def load(self, search_space: List[ShardingOption], enumerator: Optional[Enumerator] = None) -> None:
        per_table = Counter(option.fqn for option in search_space)
        total = math.prod(per_table.values())
        if total > self._max_proposals:
            raise PlanError(
                f"sharding.proposer=grid_search: {total:.3g} combinations of {len(per_table)} tables exceed "
                f"sharding.grid_max_proposals={self._max_proposals}; raise it, constrain sharding.types, or use "
                "greedy or dynamic_programming")
        super().load(search_space, enumerator)


def build(sharding: ShardingSchema, device_type: str, world_size: int) -> BoundedGridSearchProposer:
    return BoundedGridSearchProposer(max_proposals=sharding.grid_max_proposals)


def build_uniform(sharding: ShardingSchema, device_type: str, world_size: int) -> UniformProposer:
    return UniformProposer()
