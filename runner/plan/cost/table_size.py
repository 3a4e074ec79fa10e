"""What a fused kernel's time owes to the bytes of the tables its rank holds. A step's new ids reach rows all over
its tables; the larger they are, the fewer of those rows are in the caches, so each id costs more. TorchRec's model
charges a lookup by its bytes at one bandwidth, whatever the table's size. Measured (FBGEMM's CPU kernel, 64 wide,
16,384 new ids a call, one thread, 2026-11-30): forward 0.53 / 1.26 / 1.72 / 1.90 ms and backward 2.64 / 7.26 / 9.30
/ 12.4 ms over tables of 5 / 49 / 244 / 977 MiB.

The calibration times its kernel over tables of several sizes and fits the multiple of its bandwidth term a call
takes by its table's bytes: flat up to a size, then a line in the log of the bytes (``table_size``,
:func:`runner.plan.cost.fit.table_size_fit`; on 2 CPU ranks from 5-8 MiB on, +20% of the backward and +45% of the
forward per doubling; a line in the log followed the grid better than the share of rows missing a cache of one size,
which stops growing once the tables are a few times the cache: the backward grew 1.6x from 49 to 488 MiB). A plan's
rank pays its fused shards' TorchRec compute (forward, and backward less :mod:`.row_reuse`'s saving) times that
multiple at the bytes of the fused tables it holds, less the compute itself: the step's ``table_size`` part (above or
below 0: small tables run faster than the calibration's mean rate, large ones slower).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from torchrec.distributed.planner.types import ShardingOption

MIB = 1024**2


def doublings(nbytes: float, from_mib: float) -> float:
    """How many times ``nbytes`` doubles past ``from_mib`` MiB (0 below it)."""
    return max(math.log2(max(nbytes, 1.0) / (from_mib * MIB)), 0.0)


def multiple(fit: Optional[Dict[str, Any]], part: str, nbytes: float) -> float:
    """The kernel's ``part`` (``fwd``, ``bwd``) with ``nbytes`` of tables as a multiple of the calibration's bandwidth
    term (``fit``, :func:`runner.plan.cost.fit.table_size_fit`): ``level x (1 + per_doubling x doublings past
    from_mib)``, the bytes taken at most ``up_to_mib``; 1 without a fit."""
    if not fit or not isinstance(fit.get(part), dict):
        return 1.0
    terms = fit[part]
    held = min(nbytes, float(fit.get("up_to_mib") or math.inf) * MIB)
    return float(terms["level"]) * (1.0 + float(terms["per_doubling"]) * doublings(held, float(terms["from_mib"])))


def _fused_shards(best_plan: List[ShardingOption], world: int) -> Iterator[Tuple[ShardingOption, Any]]:
    """Each shard of ``best_plan``'s fused tables (data-parallel ones are the dense optimizer's) placed on a rank."""
    for option in best_plan:
        if option.compute_kernel != "fused" or option.sharding_type == "data_parallel":
            continue
        for shard in option.shards:
            if shard.rank is not None and shard.rank < world:
                yield option, shard


def fused_bytes(best_plan: List[ShardingOption], world: int) -> List[float]:
    """The bytes of the tables each rank's fused kernel holds (its shards' rows x width x element size)."""
    held = [0.0] * world
    for option, shard in _fused_shards(best_plan, world):
        size = option.tensor.element_size() if option.tensor is not None else 4
        held[shard.rank] += float(shard.size[0]) * float(shard.size[1]) * size
    return held


def table_size_ms(c: Dict[str, Any], best_plan: List[ShardingOption], world: int,
                  reused: Sequence[float] = ()) -> List[Tuple[float, float]]:
    """Each rank's ``table_size`` (forward, backward ms): its fused shards' TorchRec compute times
    (:func:`multiple` at the rank's :func:`fused_bytes`, less 1); ``reused``: each rank's row-reuse saving
    (:func:`.row_reuse.row_reuse_ms`, 0 or less), which the backward's multiple applies to as well."""
    curve = c.get("table_size")
    out = [(0.0, 0.0)] * world
    if not curve:
        return out
    fwd, bwd = [0.0] * world, [0.0] * world
    for _, shard in _fused_shards(best_plan, world):
        if shard.perf is not None:
            fwd[shard.rank] += float(shard.perf.fwd_compute)
            bwd[shard.rank] += float(shard.perf.bwd_compute)
    held = fused_bytes(best_plan, world)
    for r in range(world):
        saved = reused[r] if r < len(reused) else 0.0
        out[r] = ((multiple(curve, "fwd", held[r]) - 1.0) * fwd[r],
                  (multiple(curve, "bwd", held[r]) - 1.0) * (bwd[r] + saved))
    return out
