"""What a plan costs: the planner's per-rank estimates, balance, and the communication it implies.

Communication is estimated from the plan itself with the collectives TorchRec uses per sharding type
(uniform ids, ``pooling_factor`` ids per sample, fp32 values, int64 ids), counted as bytes each rank
sends per step, split into traffic within its node and across nodes.
"""

from __future__ import annotations

from typing import Any, Dict, List

ESTIMATES, CHART = "estimates.json", "plan.png"  # in a run's plan/ folder

COLLECTIVES = {
    "table_wise": "ids all-to-all in; pooled embeddings all-to-all out; gradients all-to-all back",
    "column_wise": "ids all-to-all in (to every column shard); all-to-all out and back per column shard",
    "table_column_wise": "as column_wise, column shards placed table-wise",
    "row_wise": "bucketised ids all-to-all in; partial sums reduce-scatter out; gradients all-gather back",
    "table_row_wise": "ids to the owning node; node-local reduce-scatter, then cross-node all-to-all",
    "grid_shard": "table_row_wise per column shard",
    "data_parallel": "no lookup traffic; gradient all-reduce of the whole table every step",
}

ID_BYTES, VALUE_BYTES = 8, 4


def per_rank_estimates(best_plan: List[Any], world: int) -> List[Dict[str, float]]:
    """Planner's estimates summed per rank: storage in bytes, perf in ms per step."""
    keys = ("hbm_bytes", "ddr_bytes", "fwd_compute_ms", "fwd_comms_ms", "bwd_compute_ms", "bwd_comms_ms",
            "total_ms")
    ranks = [dict.fromkeys(keys, 0.0) for _ in range(world)]
    for option in best_plan:
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


class _Traffic:
    def __init__(self, world: int, local: int) -> None:
        self.world, self.local = world, local
        self.intra = [0.0] * world
        self.cross = [0.0] * world

    def send(self, src: int, dst: int, nbytes: float) -> None:
        if src == dst:
            return
        if src // self.local == dst // self.local:
            self.intra[src] += nbytes
        else:
            self.cross[src] += nbytes

    def to_all(self, src: int, dsts: List[int], nbytes_each: float) -> None:
        for d in dsts:
            self.send(src, d, nbytes_each)


def _lookup_traffic(t: _Traffic, owners: List[int], width: int, batch: int, pooling: float) -> None:
    """Table-wise style: every rank sends its ids to each owner; owners return B x width values."""
    everyone = list(range(t.world))
    for owner in owners:
        for r in everyone:
            t.send(r, owner, batch * pooling * ID_BYTES)  # ids in
            t.send(r, owner, batch * width * VALUE_BYTES)  # gradients back
        t.to_all(owner, everyone, batch * width * VALUE_BYTES)  # pooled embeddings out


def _row_traffic(t: _Traffic, owners: List[int], width: int, batch: int, pooling: float) -> None:
    """Row-wise style over ``owners``: ids bucketised to every owner, partial sums reduce-scattered."""
    everyone = list(range(t.world))
    n = len(owners)
    for r in everyone:
        t.to_all(r, owners, batch * pooling * ID_BYTES / n)
    for owner in owners:  # reduce-scatter of (world x batch) partial sums among owners, then to the rest
        t.to_all(owner, owners, t.world * batch * width * VALUE_BYTES / n)
        t.to_all(owner, [r for r in everyone if r not in owners], batch * width * VALUE_BYTES / n)
        for r in everyone:  # gradients back (all-gather) mirror the forward
            t.send(r, owner, batch * width * VALUE_BYTES / n)


def comms_per_rank(plan_dict: Dict[str, Dict[str, Any]], world: int, local: int, batch: int,
                   pooling: Dict[str, float]) -> Dict[str, List[float]]:
    """Estimated bytes each rank sends per step, within its node and across nodes."""
    t = _Traffic(world, local)
    for tables in plan_dict.values():
        for name, p in tables.items():
            kind, shards, pf = p["sharding_type"], p["shards"], pooling.get(name, 1.0)
            if kind == "data_parallel":
                size = p.get("rows", 0) * p.get("dim", 0) * VALUE_BYTES
                for r in range(world):  # ring all-reduce: 2 (W-1)/W of the table to the next rank
                    t.send(r, (r + 1) % world, 2 * (world - 1) / world * size)
                continue
            by_columns: Dict[int, List[Dict[str, Any]]] = {}
            for s in shards:
                by_columns.setdefault(s["offsets"][1], []).append(s)
            for col_shards in by_columns.values():
                owners = sorted({s["rank"] for s in col_shards})
                width = col_shards[0]["sizes"][1]
                if kind in ("row_wise", "table_row_wise", "grid_shard"):
                    _row_traffic(t, owners, width, batch, pf)
                else:
                    _lookup_traffic(t, owners, width, batch, pf)
    return {"intra_node_bytes": t.intra, "cross_node_bytes": t.cross}


def _imbalance(values: List[float]) -> float:
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else 1.0


def plan_metrics(ranks: List[Dict[str, float]], comms: Dict[str, List[float]], types: Dict[str, int],
                 device_type: str) -> Dict[str, float]:
    """Flat metrics for comparing plans across runs."""
    mem_key = "hbm_bytes" if device_type == "cuda" else "ddr_bytes"
    m: Dict[str, float] = {f"plan/tables_{k}": float(v) for k, v in types.items()}
    for r, est in enumerate(ranks):
        m.update({f"plan/rank{r}/{k}": v for k, v in est.items()})
        m[f"plan/rank{r}/intra_node_bytes"] = comms["intra_node_bytes"][r]
        m[f"plan/rank{r}/cross_node_bytes"] = comms["cross_node_bytes"][r]
    if ranks:
        totals, mem = [r["total_ms"] for r in ranks], [r[mem_key] for r in ranks]
        m["plan/est_step_ms"] = max(totals)
        m["plan/perf_imbalance"] = _imbalance(totals)
        m["plan/max_mem_bytes"] = max(mem)
        m["plan/mem_imbalance"] = _imbalance(mem)
    m["plan/max_intra_node_bytes"] = max(comms["intra_node_bytes"], default=0.0)
    m["plan/max_cross_node_bytes"] = max(comms["cross_node_bytes"], default=0.0)
    return m
