"""The rows a step's ids reach: FBGEMM's fused backward updates each distinct row once (the sparse optimizer fused
in), where TorchRec's model charges it per id. How many distinct rows uniform ids reach, and the backward a plan's
shards save where their ids repeat rows (the step's ``row_reuse`` part, :mod:`runner.plan.cost.step_estimate`; the
share of the backward paid per row is the calibration's ``bwd_row_share``, :func:`runner.plan.cost.fit.fit_kernels`).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List

from torchrec.distributed.planner.types import ShardingOption


def unique_rows(rows: float, ids: float) -> float:
    """How many distinct rows ``ids`` ids drawn uniformly from ``rows`` rows reach (its expectation): a step's ids
    that repeat a row update it once."""
    if not math.isfinite(rows):
        return max(ids, 0.0)
    if rows <= 1 or ids <= 0:
        return min(max(rows, 0.0), max(ids, 0.0))
    return rows * -math.expm1(ids * math.log1p(-1.0 / rows))


def repeated_share(rows: float, ids: float) -> float:
    """The share of ``ids`` (uniform over ``rows``) that repeat a row another id of the step has
    (:func:`unique_rows`): 0 for a table much larger than its ids, near 1 for a tiny one."""
    return 1.0 - unique_rows(rows, ids) / ids if ids > 0 and math.isfinite(rows) else 0.0


def row_reuse_ms(c: Dict[str, Any], best_plan: List[ShardingOption], world: int) -> List[float]:
    """Each rank's ``row_reuse`` (ms, 0 or less): per fused shard, TorchRec's backward compute of it times the
    calibration's ``bwd_row_share`` (:func:`runner.plan.cost.fit.fit_kernels`) times the share of its step's ids
    that repeat a row (:func:`repeated_share`; the ids uniform over the table, as the
    planner's pooling factors have them: skewed ids repeat more). A shard's ids: the table's over every rank's batch
    (its pooling factors x TorchRec's per-rank batch x ``world``), the share of its rows where it holds some of
    them. Data-parallel tables are updated by the dense optimizer (:class:`Replicated`), other kernels as TorchRec
    rates them."""
    share = float(c.get("bwd_row_share") or 0.0)
    out = [0.0] * world
    for option in best_plan if share > 0 else []:
        if option.sharding_type == "data_parallel" or option.compute_kernel != "fused" or option.tensor is None:
            continue
        rows = max(int(option.tensor.shape[0]), 1)
        ids = float(sum(option.input_lengths)) * option.batch_size * world
        for shard in option.shards:
            if shard.rank is not None and shard.rank < world and shard.perf is not None:
                held = int(shard.size[0])
                out[shard.rank] -= share * float(shard.perf.bwd_compute) * repeated_share(held, ids * held / rows)
    return out
