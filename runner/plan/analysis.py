"""What a plan costs: the planner's per-rank estimates, balance, and the communication it implies.

Communication is estimated from the plan itself with the collectives TorchRec uses per sharding type
(uniform ids, ``pooling_factor`` ids per sample, fp32 values, int64 ids), counted as bytes each rank
sends per step, split into traffic within its node and across nodes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Hashable, Iterable, List, Sequence, Tuple

import numpy as np

if TYPE_CHECKING:
    from torchrec.distributed.planner.types import Shard, ShardingOption

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


ESTIMATE_KEYS = ("hbm_bytes", "ddr_bytes", "fwd_compute_ms", "fwd_comms_ms", "bwd_compute_ms", "bwd_comms_ms",
                 "total_ms")


def summed_per_rank(shards: Iterable[Shard], key: Callable[[Shard], Hashable],
                    values: Callable[[Shard], Sequence[float]], width: int, world: int, dtype: Any = np.float64
                    ) -> np.ndarray:
    """``(world, width)``: ``values(shard)`` summed over the shards on each rank (``shard.rank``; those without one
    passed over). Each distinct ``key(shard)`` is read once (a chosen plan's shards of one size share their storage
    and perf: 8,192 per data-parallel table at 8,192 GPUs), and the values are added shard after shard in the
    order given (``add.at`` is unbuffered): the sums a loop over the shards makes."""
    row_of: Dict[Hashable, int] = {}
    table: List[Sequence[float]] = []
    ranks: List[int] = []
    rows: List[int] = []
    for shard in shards:
        if shard.rank is None:
            continue
        row = row_of.get(k := key(shard))
        if row is None:
            row = row_of[k] = len(table)
            table.append(values(shard))
        ranks.append(shard.rank)
        rows.append(row)
    sums = np.zeros((world, width), dtype=dtype)
    at, picked = np.array(ranks, dtype=np.int64), np.array(rows, dtype=np.int64)
    by_row = np.array(table, dtype=dtype).reshape(-1, width)
    for k in range(width):
        np.add.at(sums[:, k], at, by_row[picked, k])
    return sums


def per_rank_estimates(best_plan: List[ShardingOption], world: int) -> List[Dict[str, float]]:
    """Planner's estimates summed per rank: storage in bytes, perf in ms per step (:func:`summed_per_rank`)."""
    sums = summed_per_rank((s for option in best_plan for s in option.shards), _pair, _estimates,
                           len(ESTIMATE_KEYS), world)
    return [dict(zip(ESTIMATE_KEYS, map(float, row), strict=True)) for row in sums]


def _pair(shard: Shard) -> Tuple[int, int]:
    return id(shard.storage), id(shard.perf)


def _estimates(shard: Shard) -> Tuple[float, ...]:
    """A shard's storage and perf as :data:`ESTIMATE_KEYS` orders them (0 for what it lacks)."""
    storage = (shard.storage.hbm, shard.storage.ddr) if shard.storage is not None else (0.0, 0.0)
    perf = shard.perf
    if perf is None:
        return (*storage, 0.0, 0.0, 0.0, 0.0, 0.0)
    return (*storage, perf.fwd_compute, perf.fwd_comms, perf.bwd_compute, perf.bwd_comms, perf.total)


class _Traffic:
    """Bytes each rank sends per step, within its node and across nodes, summed in bulk: a collective adds
    its senders' counts per destination node instead of one entry per pair of ranks (1,024 ranks: a million
    pairs per row-wise table otherwise)."""

    def __init__(self, world: int, local: int) -> None:
        self.world, self.local = world, local
        self.node = np.arange(world) // local
        self.node_size = np.bincount(self.node)
        self.everyone = np.arange(world)
        self.intra, self.cross = np.zeros(world), np.zeros(world)
        self._into = np.zeros(world)  # bytes every other rank sends to each rank

    def all_send_to(self, dsts: List[int], nbytes: float) -> None:
        """Every rank sends ``nbytes`` to each of ``dsts`` (distinct), none to itself."""
        if len(dsts) == 1:
            self._into[dsts[0]] += nbytes
        else:
            self._into[dsts] += nbytes

    def send_to(self, srcs: List[int], dsts: Any, nbytes: float) -> None:
        """Each of ``srcs`` (distinct) sends ``nbytes`` to each of ``dsts`` (distinct, or :attr:`everyone`), none
        to itself."""
        srcs_in: Any = 1  # each source is one of the destinations (then it sends to one fewer)
        if dsts is self.everyone:
            per_node, count = self.node_size, self.world
        else:
            per_node, count = np.bincount(self.node[dsts], minlength=len(self.node_size)), len(dsts)
            srcs_in = np.isin(srcs, dsts)
        same = per_node[self.node[srcs]]
        self.intra[srcs] += nbytes * (same - srcs_in)
        self.cross[srcs] += nbytes * (count - same)

    def ring(self, nbytes: float) -> None:
        """Rank r sends ``nbytes`` to rank r + 1 (the last to the first)."""
        after = (self.everyone + 1) % self.world
        same = self.node == self.node[after]
        self.intra += np.where(same & (after != self.everyone), nbytes, 0.0)
        self.cross += np.where(same, 0.0, nbytes)

    def totals(self) -> Dict[str, List[float]]:
        into_node = np.bincount(self.node, weights=self._into, minlength=len(self.node_size))
        intra = self.intra + into_node[self.node] - self._into
        cross = self.cross + (into_node.sum() - into_node[self.node])
        return {"intra_node_bytes": intra.tolist(), "cross_node_bytes": cross.tolist()}


def _lookup_traffic(t: _Traffic, owners: List[int], width: int, batch: int, pooling: float) -> None:
    """Table-wise style: every rank sends its ids to each owner; owners return B x width values."""
    t.all_send_to(owners, batch * pooling * ID_BYTES + batch * width * VALUE_BYTES)  # ids in, gradients back
    t.send_to(owners, t.everyone, batch * width * VALUE_BYTES)  # pooled embeddings out


def _row_traffic(t: _Traffic, owners: List[int], width: int, batch: int, pooling: float) -> None:
    """Row-wise style over ``owners``: ids bucketised to every owner, partial sums reduce-scattered."""
    n = len(owners)
    others = np.setdiff1d(t.everyone, owners)
    # ids in; gradients back (all-gather, mirroring the forward)
    t.all_send_to(owners, batch * pooling * ID_BYTES / n + batch * width * VALUE_BYTES / n)
    # reduce-scatter of (world x batch) partial sums among owners, then to the rest
    t.send_to(owners, owners, t.world * batch * width * VALUE_BYTES / n)
    t.send_to(owners, others, batch * width * VALUE_BYTES / n)


def comms_per_rank(plan_dict: Dict[str, Dict[str, Any]], world: int, local: int, batch: int,
                   pooling: Dict[str, float]) -> Dict[str, List[float]]:
    """Estimated bytes each rank sends per step, within its node and across nodes."""
    t = _Traffic(world, local)
    for tables in plan_dict.values():
        for name, p in tables.items():
            kind, shards, pf = p["sharding_type"], p["shards"], pooling.get(name, 1.0)
            if kind == "data_parallel":  # ring all-reduce: 2 (W-1)/W of the table to the next rank
                t.ring(2 * (world - 1) / world * p.get("rows", 0) * p.get("dim", 0) * VALUE_BYTES)
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
    return t.totals()


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


def plan_description(folder: Path) -> str:
    """The plan's short markdown (heading, settings, tables per sharding type) from ``report.md`` in
    ``folder``, for the run's Description; empty when there is none."""
    path = folder / "report.md"
    if not path.exists():
        return ""
    text = path.read_text().split("\n## Per-rank estimates", 1)[0].rstrip()
    return text.replace("# Sharding plan:", "### Sharding plan:", 1).replace("\n## Tables per", "\n#### Tables per", 1)
