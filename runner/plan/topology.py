"""The machines as TorchRec's planner sees them: a ``Topology`` from the cluster config (how much of each device's
memory the sharding policy keeps free is :mod:`.plan_memory`'s).

Config bandwidths are GiB/s and memory caps GiB per worker; they are converted to TorchRec's units
(bytes per millisecond, bytes) here and nowhere else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

from torchrec.distributed.planner import Topology

from runner.plan.calibration import GIB, topology_knobs

if TYPE_CHECKING:
    from torch import nn

    from runner.config.schema_model import ClusterSchema
    from runner.plan.calibration import Calibration


def gibps_to_bytes_per_ms(gib_per_s: float) -> float:
    """Config bandwidths are GiB/s; TorchRec's ``Topology`` takes bytes per millisecond."""
    return gib_per_s * GIB / 1000.0


def build_topology(cluster: ClusterSchema, world_size: int, local_world_size: int, device_type: str,
                   hbm_cap: Optional[int] = None, calibration: Optional[Calibration] = None) -> Topology:
    """TorchRec topology from the cluster config, for the world the workers really form. ``hbm_cap``
    (bytes per GPU, read from the job's devices) stands in for ``cluster.hbm_cap_gib``; ``calibration``: the
    constants it sets (:func:`runner.plan.calibration.topology_knobs`; None: TorchRec's defaults, untouched)."""
    knobs, bandwidths = topology_knobs(calibration, device_type, cluster.intra_node_bandwidth,
                                       cluster.cross_node_bandwidth, world_size, local_world_size)
    kwargs: Dict[str, Any] = dict(
        world_size=world_size,
        local_world_size=local_world_size,
        compute_device=device_type,
        intra_host_bw=gibps_to_bytes_per_ms(bandwidths["intra"]),
        inter_host_bw=gibps_to_bytes_per_ms(bandwidths["cross"]),
        **knobs,
    )
    if hbm_cap is not None:
        kwargs["hbm_cap"] = int(hbm_cap)
    elif cluster.hbm_cap_gib is not None:
        kwargs["hbm_cap"] = int(cluster.hbm_cap_gib * GIB)
    if cluster.ddr_cap_gib is not None:
        kwargs["ddr_cap"] = int(cluster.ddr_cap_gib * GIB)
    return Topology(**kwargs)


def dense_bytes(model: nn.Module) -> int:
    """Bytes of the parameters that are not embedding tables (sizes are known on meta too)."""
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embedding_bag_collection" not in n)
