"""The machines as TorchRec's planner sees them: a ``Topology`` from the cluster config, and how much of each
device's memory the sharding policy keeps free (the storage reservation).

Config bandwidths are GiB/s and memory caps GiB per worker; they are converted to TorchRec's units
(bytes per millisecond, bytes) here and nowhere else.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Dict, Optional

from torchrec.distributed.planner import Topology
from torchrec.distributed.planner.storage_reservations import (
    FixedPercentageStorageReservation,
    HeuristicalStorageReservation,
)

if TYPE_CHECKING:
    from runner.config.schema_model import ClusterSchema, ShardingSchema


GIB = 1024**3
HEURISTIC_DENSE_MULTIPLIER = 6.0  # TorchRec's default: parameters, grads, optimizer state, activations


def gibps_to_bytes_per_ms(gib_per_s: float) -> float:
    """Config bandwidths are GiB/s; TorchRec's ``Topology`` takes bytes per millisecond."""
    return gib_per_s * GIB / 1000.0


def build_topology(cluster: ClusterSchema, world_size: int, local_world_size: int, device_type: str,
                   hbm_cap: Optional[int] = None) -> Topology:
    """TorchRec topology from the cluster config, for the world the workers really form. ``hbm_cap``
    (bytes per GPU, read from the job's devices) stands in for ``cluster.hbm_cap_gib``."""
    kwargs: Dict[str, Any] = dict(
        world_size=world_size,
        local_world_size=local_world_size,
        compute_device=device_type,
        intra_host_bw=gibps_to_bytes_per_ms(cluster.intra_node_bandwidth),
        inter_host_bw=gibps_to_bytes_per_ms(cluster.cross_node_bandwidth),
    )
    if hbm_cap is not None:
        kwargs["hbm_cap"] = int(hbm_cap)
    elif cluster.hbm_cap_gib is not None:
        kwargs["hbm_cap"] = int(cluster.hbm_cap_gib * GIB)
    if cluster.ddr_cap_gib is not None:
        kwargs["ddr_cap"] = int(cluster.ddr_cap_gib * GIB)
    return Topology(**kwargs)


def dense_bytes(model: Any) -> int:
    """Bytes of the parameters that are not embedding tables (sizes are known on meta too)."""
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters()
               if "embedding_bag_collection" not in n)


class _HostMemoryToo:
    """TorchRec's percentage reservations shrink only HBM; CPU workers plan in host memory (DDR), so
    the same fraction of DDR is kept free there too, or ``storage_reserve_percent`` would do nothing."""

    _percentage: float
    _last_reserved_topology: Optional[Topology]

    def reserve(self, topology: Topology, *args: Any, **kwargs: Any) -> Topology:
        reserved = super().reserve(topology, *args, **kwargs)  # type: ignore[misc]
        if topology.compute_device == "cpu":
            for device in reserved.devices:
                device.storage.ddr = int((1 - self._percentage) * device.storage.ddr)
            self._last_reserved_topology = copy.deepcopy(reserved)
        return reserved


class FixedReservation(_HostMemoryToo, FixedPercentageStorageReservation):
    pass


class HeuristicReservation(_HostMemoryToo, HeuristicalStorageReservation):
    pass


def build_storage_reservation(sharding: ShardingSchema, dense_tensor_bytes: Optional[int] = None) -> Any:
    """``fixed``: exactly the percent. ``heuristic``: the percent plus TorchRec's estimate of dense
    parameters, their optimizer state and activations (6 x the dense parameters' bytes)."""
    if sharding.storage_reserve_policy == "fixed":
        return FixedReservation(percentage=sharding.storage_reserve_percent)
    estimate = int(dense_tensor_bytes * HEURISTIC_DENSE_MULTIPLIER) if dense_tensor_bytes else None
    return HeuristicReservation(percentage=sharding.storage_reserve_percent,
                                         parameter_multiplier=HEURISTIC_DENSE_MULTIPLIER,
                                         dense_tensor_estimate=estimate)
