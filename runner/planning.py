"""Planning: cluster + sharding config in, TorchRec topology, planner and plan (with estimates) out.

The only place that builds a ``Topology`` or an ``EmbeddingShardingPlanner``. Pure with respect to
processes: :func:`build_planner` and :func:`plan_summary` need no process group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.planner.storage_reservations import (
    FixedPercentageStorageReservation,
    HeuristicalStorageReservation,
)
from torchrec.distributed.planner.types import ShardingOption, Stats
from torchrec.distributed.types import ShardingPlan

GIB = 1024**3


def gibps_to_bytes_per_ms(gib_per_s: float) -> float:
    """Config bandwidths are GiB/s; TorchRec's ``Topology`` takes bytes per millisecond."""
    return gib_per_s * GIB / 1000.0


class EmbeddingBagCollectionAnyDeviceSharder(EmbeddingBagCollectionSharder):
    """TorchRec's EBC sharder, offering the CUDA sharding types on CPU too.

    The stock sharder offers only data_parallel/table_wise/column_wise/table_column_wise when the
    compute device is CPU, although FBGEMM's CPU fused kernel runs row_wise, table_row_wise and
    grid_shard over gloo as well; without this, ``sharding=rowwise`` could not be honoured on CPU.
    """

    def sharding_types(self, compute_device_type: str) -> List[str]:
        return super().sharding_types("cuda" if compute_device_type == "cpu" else compute_device_type)


def build_topology(cluster: Any, world_size: int, local_world_size: int, device_type: str) -> Topology:
    """TorchRec topology from the cluster config, for the world the workers really form."""
    kwargs: Dict[str, Any] = dict(
        world_size=world_size,
        local_world_size=local_world_size,
        compute_device=device_type,
        intra_host_bw=gibps_to_bytes_per_ms(cluster.intra_node_bandwidth),
        inter_host_bw=gibps_to_bytes_per_ms(cluster.cross_node_bandwidth),
    )
    if cluster.hbm_cap_gib is not None:
        kwargs["hbm_cap"] = int(cluster.hbm_cap_gib * GIB)
    if cluster.ddr_cap_gib is not None:
        kwargs["ddr_cap"] = int(cluster.ddr_cap_gib * GIB)
    return Topology(**kwargs)


def build_constraints(sharding: Any, table_names: List[str]) -> Dict[str, ParameterConstraints]:
    """Per-table constraints from the sharding group's allowed types and kernels."""
    types = list(sharding.types) or None
    kernels = list(sharding.compute_kernels) or None
    if kernels is None and types == ["data_parallel"]:
        kernels = ["dense"]  # TorchRec runs data_parallel tables only with the dense kernel
    if types is None and kernels is None:
        return {}
    return {name: ParameterConstraints(sharding_types=types, compute_kernels=kernels) for name in table_names}


def build_storage_reservation(sharding: Any) -> Any:
    if sharding.storage_reserve_policy == "fixed":
        return FixedPercentageStorageReservation(percentage=sharding.storage_reserve_percent)
    return HeuristicalStorageReservation(percentage=sharding.storage_reserve_percent)


@dataclass
class PlanEstimates(Stats):
    """Planner stats hook that keeps the chosen sharding options, for per-rank estimates."""

    best_plan: List[ShardingOption] = field(default_factory=list)
    world_size: int = 0

    def log(self, sharding_plan: ShardingPlan, topology: Topology, *args: Any, **kwargs: Any) -> None:
        self.best_plan = list(kwargs.get("best_plan") or (args[5] if len(args) > 5 else []))
        self.world_size = topology.world_size


def build_planner(cfg: Any, world_size: int, local_world_size: int, device_type: str,
                  estimates: Optional[PlanEstimates] = None) -> EmbeddingShardingPlanner:
    """The planner for ``cfg`` on a world of ``world_size`` ranks, ``local_world_size`` per node."""
    topology = build_topology(cfg.cluster, world_size, local_world_size, device_type)
    return EmbeddingShardingPlanner(
        topology=topology,
        batch_size=cfg.sharding.planner_batch_size or cfg.train.batch_size,
        storage_reservation=build_storage_reservation(cfg.sharding),
        constraints=build_constraints(cfg.sharding, [t.name for t in cfg.model.tables]),
        stats=[estimates] if estimates is not None else None,
        debug=False,
    )


def plan_to_dict(plan: ShardingPlan) -> Dict[str, Dict[str, Any]]:
    """JSON-ready plan: per module, per table: type, kernel, ranks and every shard's offsets/sizes."""
    out: Dict[str, Dict[str, Any]] = {}
    for module_path, module_plan in plan.plan.items():
        tables: Dict[str, Any] = {}
        for table, ps in module_plan.items():  # type: ignore[union-attr]
            shards = []
            if ps.sharding_spec is not None:
                for md in ps.sharding_spec.shards:
                    shards.append({
                        "rank": md.placement.rank() if md.placement is not None else None,
                        "offsets": list(md.shard_offsets),
                        "sizes": list(md.shard_sizes),
                    })
            tables[table] = {
                "sharding_type": ps.sharding_type,
                "compute_kernel": ps.compute_kernel,
                "ranks": list(ps.ranks) if ps.ranks is not None else None,
                "shards": shards,
            }
        out[module_path] = tables
    return out


def plan_table(plan_dict: Dict[str, Dict[str, Any]]) -> str:
    """Readable fixed-width table of a plan dict: one line per table."""
    rows = [("module", "table", "sharding_type", "kernel", "ranks", "shards (offsets:sizes)")]
    for module, tables in plan_dict.items():
        for table, p in tables.items():
            ranks = "all" if p["ranks"] is None else ",".join(map(str, p["ranks"]))
            shards = " ".join(
                f"r{s['rank']}@{'x'.join(map(str, s['offsets']))}:{'x'.join(map(str, s['sizes']))}"
                for s in p["shards"]
            ) or "replicated"
            rows.append((module or "<root>", table, p["sharding_type"], p["compute_kernel"], ranks, shards))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines) + "\n"


def sharding_types_used(plan_dict: Dict[str, Dict[str, Any]]) -> Dict[str, int]:
    """Number of tables per sharding type."""
    counts: Dict[str, int] = {}
    for tables in plan_dict.values():
        for p in tables.values():
            counts[p["sharding_type"]] = counts.get(p["sharding_type"], 0) + 1
    return dict(sorted(counts.items()))


def per_rank_estimates(estimates: PlanEstimates) -> List[Dict[str, float]]:
    """Planner's estimates summed per rank: storage in bytes, perf in ms per step."""
    keys = ("hbm_bytes", "ddr_bytes", "fwd_compute_ms", "fwd_comms_ms", "bwd_compute_ms", "bwd_comms_ms",
            "total_ms")
    ranks = [dict.fromkeys(keys, 0.0) for _ in range(estimates.world_size)]
    for option in estimates.best_plan:
        for shard in option.shards:
            if shard.rank is None:
                continue
            r = ranks[shard.rank]
            if shard.storage is not None:
                r["hbm_bytes"] += shard.storage.hbm
                r["ddr_bytes"] += shard.storage.ddr
            if shard.perf is not None:
                r["fwd_compute_ms"] += shard.perf.fwd_compute
                r["fwd_comms_ms"] += shard.perf.fwd_comms
                r["bwd_compute_ms"] += shard.perf.bwd_compute
                r["bwd_comms_ms"] += shard.perf.bwd_comms
                r["total_ms"] += shard.perf.total
    return ranks
