"""The proposer a config names, built from its declaration (:mod:`runner.config.proposers`): the runner's (a
function of the TorchRec adapter, imported only when the runner's planner plans), or TorchRec's own for
TorchRec's stock planner (public classes only)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List

from torchrec.distributed.planner.proposers import (
    DynamicProgrammingProposer,
    GreedyProposer,
    GridSearchProposer,
    UniformProposer,
)

from runner.config.errors import ConfigError
from runner.config.parts import part
from runner.config.proposers import PROPOSERS

if TYPE_CHECKING:
    from runner.config.schema import ShardingSchema


def stock_dynamic_programming(sharding: ShardingSchema) -> DynamicProgrammingProposer:
    return DynamicProgrammingProposer(hbm_bins_per_device=sharding.dp_hbm_bins)


def stock_greedy(sharding: ShardingSchema) -> List[GreedyProposer]:
    return [GreedyProposer(), GreedyProposer(use_depth=False)]


def stock_grid_search(sharding: ShardingSchema) -> GridSearchProposer:
    return GridSearchProposer(max_proposals=sharding.grid_max_proposals)


def stock_uniform(sharding: ShardingSchema) -> UniformProposer:
    return UniformProposer()


def build_proposer(name: str, sharding: ShardingSchema, device_type: str, world_size: int) -> Any:
    """The runner's proposer ``name`` with ``sharding``'s knobs (None: TorchRec's default list); refused on CPU
    workers where it does not run there."""
    proposer = PROPOSERS[name]
    if not proposer.cpu and device_type != "cuda":
        raise ConfigError("sharding.proposer", name,
                          "another proposer on CPU workers (it bins HBM, which they do not have)")
    if proposer.builds is None:
        return None
    return part(proposer.builds)(sharding, device_type, world_size)


def stock_proposer(name: str, sharding: ShardingSchema) -> Any:
    """TorchRec's own proposer(s) standing in for the proposer ``name`` on its stock planner, with ``sharding``'s
    knobs (None: its default list)."""
    stock = PROPOSERS[name].stock
    return part(stock)(sharding) if stock is not None else None
