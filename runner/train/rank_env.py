"""Where a rank sits (:class:`RankEnv`): its rank, node-local rank, world and restarts, from the launcher's
environment, checked against the cluster config."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runner.config.errors import ConfigError

if TYPE_CHECKING:
    from runner.config.schema import ClusterSchema


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


@dataclass(frozen=True)
class RankEnv:
    """Where this rank sits: from the launcher's environment, checked against the cluster config."""

    rank: int
    local_rank: int
    world: int
    local_world: int
    restarts: int
    host_workers: int

    @classmethod
    def from_environment(cls, cluster: ClusterSchema) -> "RankEnv":
        rank, local_rank = env_int("RANK", 0), env_int("LOCAL_RANK", 0)
        world, local_world = env_int("WORLD_SIZE", 1), env_int("LOCAL_WORLD_SIZE", 1)
        expected = cluster.nodes * cluster.workers_per_node
        if world != expected:
            raise ConfigError("cluster.nodes*cluster.workers_per_node", expected,
                              f"the launcher's WORLD_SIZE ({world})")
        if local_world != cluster.workers_per_node:
            raise ConfigError("cluster.workers_per_node", cluster.workers_per_node,
                              f"the launcher's LOCAL_WORLD_SIZE ({local_world})")
        # RUNNER_HOST_WORKERS: set by the runner's agents (all of a host's workers, emulated nodes included)
        return cls(rank, local_rank, world, local_world, env_int("TORCHELASTIC_RESTART_COUNT", 0),
                   env_int("RUNNER_HOST_WORKERS", local_world))
