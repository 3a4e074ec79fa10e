"""The machines as TorchRec's planner sees them: a ``Topology`` from the cluster config (how much of each device's
memory the sharding policy keeps free is :mod:`.plan_memory`'s).

Config bandwidths are GiB/s and memory caps GiB per worker; they are converted to TorchRec's units
(bytes per millisecond, bytes) here and nowhere else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from torchrec.distributed.planner import Topology
from torchrec.distributed.planner.types import BasicCommsBandwidths, CollectiveType

from runner.plan.cost.calibration import GIB

if TYPE_CHECKING:
    from torch import nn

    from runner.config.schema import ClusterSchema
    from runner.plan.cost.calibration import Calibration


TORCHREC_INTRA_GIBPS, TORCHREC_CROSS_GIBPS = 600.0, 12.5  # TorchRec's defaults, the cluster keys' defaults too


def topology_knobs(cal: Optional[Calibration], device_kind: str, intra_gibps: Optional[float],
                   cross_gibps: Optional[float], world: int = 1, local: int = 1
                   ) -> Tuple[Dict[str, float], Dict[str, float]]:
    """TorchRec ``Topology`` arguments (its units: bytes per ms) that ``cal`` sets, and the bandwidths (GiB/s) in
    effect. A bandwidth the config sets wins (a sweep over it with a calibration asks "what if"); null is the
    calibration's measured one, else TorchRec's default. On one node TorchRec reads ``inter_host_bw`` only for
    all-reduces (as ``inter_host_bw`` x workers per node): it is set so that those take the measured all-reduce's
    bandwidth."""
    bandwidths = {"intra": TORCHREC_INTRA_GIBPS if intra_gibps is None else float(intra_gibps),
                  "cross": TORCHREC_CROSS_GIBPS if cross_gibps is None else float(cross_gibps)}
    if cal is None:
        return {}, bandwidths
    c = cal.constants
    knobs: Dict[str, float] = {}
    if "device_bw_gibps" in c:  # the kernels' part (absent where it fell back: TorchRec's, untouched)
        knobs = {"hbm_mem_bw" if device_kind == "cuda" else "ddr_mem_bw": c["device_bw_gibps"] * GIB / 1000.0,
                 "bwd_compute_multiplier": float(c["bwd_compute_multiplier"])}
    h2d = (c.get("uvm_caching") or {}).get("hbm_to_ddr_gibps")
    if device_kind == "cuda" and h2d:  # the UVM-caching kernel, measured on a GPU
        knobs["hbm_to_ddr_mem_bw"] = float(h2d) * GIB / 1000.0
    for side, configured in (("intra", intra_gibps), ("cross", cross_gibps)):
        if configured is None and c.get(f"{side}_node_bandwidth"):
            bandwidths[side] = float(c[f"{side}_node_bandwidth"])
    reduce = c.get("collectives", {}).get("all_reduce", {}).get("intra")
    if cross_gibps is None and world <= local and reduce and reduce.get("bandwidth_gibps"):
        bandwidths["cross"] = float(reduce["bandwidth_gibps"]) / max(local, 1)
    return knobs, bandwidths


class MeasuredCommsBandwidths(BasicCommsBandwidths):
    """TorchRec's comms bandwidths (``Topology(generalized_comms_bandwidths=...)``) with each collective a
    calibration measured answered as measured in its scope (all ranks on one node: ``intra``, else ``cross``), and
    TorchRec's two numbers (``BasicCommsBandwidths``) for the rest. Why: a row-wise shard's forward is a
    reduce-scatter and its backward an all-gather, which on 2 CPU ranks moved 1.0 GiB/s where the all-to-all moved
    1.8-2.3; given the all-to-all's number for every collective, TorchRec put a row-wise lookup's outputs at half
    their time."""

    def __init__(self, intra_host_bw: float, inter_host_bw: float, measured: Dict[str, Dict[str, float]]) -> None:
        super().__init__(inter_host_bw=inter_host_bw, intra_host_bw=intra_host_bw)
        self.name = "MeasuredCommsBandwidths"
        self.measured = {k: dict(v) for k, v in measured.items()}

    def get_bw(self, local_world_size: int, world_size: int, collective_type: CollectiveType) -> float:
        found = self.measured.get(collective_type.value, {}).get("intra" if world_size <= local_world_size else "cross")
        return found if found else super().get_bw(local_world_size, world_size, collective_type)

    def __str__(self) -> str:
        return f"{super().__str__()}, measured={sorted(self.measured.items())}"

    def __hash__(self) -> int:
        return hash(str(self))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MeasuredCommsBandwidths) and str(self) == str(other)


TORCHREC_SCOPES = ("intra", "cross")  # the scopes TorchRec's comms terms ask for (not the all-reduce over every worker)


def measured_comms(cal: Optional[Calibration], intra_gibps: Optional[float], cross_gibps: Optional[float]
                   ) -> Dict[str, Dict[str, float]]:
    """Each collective's measured bandwidth (bytes per ms) by scope in ``cal``, for the scopes whose bandwidth the
    config leaves null (a bandwidth the config sets wins for every collective of its scope: a sweep's "what if")."""
    configured = dict(zip(TORCHREC_SCOPES, (intra_gibps, cross_gibps), strict=True))
    out: Dict[str, Dict[str, float]] = {}
    for name, by_scope in ((cal.constants.get("collectives") or {}) if cal else {}).items():
        for scope, fit in (by_scope or {}).items():
            if scope in TORCHREC_SCOPES and configured[scope] is None and (fit or {}).get("bandwidth_gibps"):
                out.setdefault(name, {})[scope] = gibps_to_bytes_per_ms(float(fit["bandwidth_gibps"]))
    return out


def gibps_to_bytes_per_ms(gib_per_s: float) -> float:
    """Config bandwidths are GiB/s; TorchRec's ``Topology`` takes bytes per millisecond."""
    return gib_per_s * GIB / 1000.0


def build_topology(cluster: ClusterSchema, world_size: int, local_world_size: int, device_type: str,
                   hbm_cap: Optional[int] = None, calibration: Optional[Calibration] = None,
                   ddr_cap_gib: Optional[float] = None) -> Topology:
    """TorchRec topology from the cluster config, for the world the workers really form. ``hbm_cap`` (bytes per GPU,
    from the job's devices) stands in for ``cluster.hbm_cap_gib``, ``ddr_cap_gib`` is the plan's host memory per
    worker; ``calibration``: the constants it sets (:func:`topology_knobs`; None: TorchRec's defaults, untouched)."""
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
    measured = measured_comms(calibration, cluster.intra_node_bandwidth, cluster.cross_node_bandwidth)
    if measured:
        kwargs["generalized_comms_bandwidths"] = MeasuredCommsBandwidths(kwargs["intra_host_bw"],
                                                                         kwargs["inter_host_bw"], measured)
    if hbm_cap is not None:
        kwargs["hbm_cap"] = int(hbm_cap)
    elif cluster.hbm_cap_gib is not None:
        kwargs["hbm_cap"] = int(cluster.hbm_cap_gib * GIB)
    if ddr_cap_gib is not None:
        kwargs["ddr_cap"] = int(ddr_cap_gib * GIB)
    return Topology(**kwargs)


def dense_bytes(model: nn.Module) -> int:
    """Bytes of the parameters that are not embedding tables (sizes are known on meta too)."""
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embedding_bag_collection" not in n)
