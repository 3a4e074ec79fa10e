"""Why no sharding plan fits, in one line: which limit was hit, the sizes, the budget per rank after the
storage reserve, and the keys that change it.

Read from what the planner computed before it gave up: its enumerated options (every table's shards
and their storage estimates, optimizer state included) and the reserved topology (each rank's memory
after ``sharding.storage_reserve_percent`` and, with the ``heuristic`` policy, the dense part's
estimate). Three causes, checked in order:

1. one table does not fit on one rank in any of its allowed sharding options;
2. all tables together, each in its smallest option, exceed the cluster's memory;
3. neither, but the proposer found no combination that packs (e.g. the greedy or uniform proposer
   on a tight budget): another proposer or a smaller reserve may find one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, NamedTuple, Optional, Tuple

from runner.config.reservations import RESERVATIONS, canonical
from runner.plan.torchrec_adapter.compact_enumeration import shard_storages

if TYPE_CHECKING:
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import ShardingOption

    from runner.plan.spec import PlanSpec

GIB = 1024**3
KINDS = {"cuda": ("hbm", "HBM", "hbm_cap_gib"), "cpu": ("ddr", "host memory", "ddr_cap_gib")}


def _fmt(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _fits(option: ShardingOption, budget: Dict[str, float]) -> bool:
    return all(s.storage is not None and s.storage.hbm <= budget["hbm"] and s.storage.ddr <= budget["ddr"]
               for s in option.shards)


def _smallest(options: List[ShardingOption], mem: str) -> Tuple[float, float, ShardingOption]:
    """(least per-rank bytes, least total bytes, the option with the least per-rank bytes) of one table."""
    per_rank = min(options, key=lambda o: max(getattr(s.storage, mem) for s in o.shards))
    return (max(getattr(s.storage, mem) for s in per_rank.shards),
            min(sum(getattr(st, mem) for st in shard_storages(o)) for o in options), per_rank)


def _budget_text(spec: PlanSpec, device_type: str, per_rank: float, world: int) -> str:
    _, word, cap_key = KINDS[device_type]
    cap = spec.ddr_cap_gib if cap_key == "ddr_cap_gib" else getattr(spec.cluster, cap_key)
    s = spec.sharding
    declared = RESERVATIONS[s.storage_reserve_policy]
    reserve = " ".join(f"sharding.{k}={v:g}" if isinstance(v := getattr(s, k), float) else f"sharding.{k}={v}"
                       for k in declared.knobs)  # the keys the policy reads, which are the ones that change it
    policy = f", policy {canonical(s.storage_reserve_policy)}: {declared.summary}"
    cap_text = f"cluster.{cap_key}={cap:g}" if cap is not None else f"cluster.{cap_key}=null (TorchRec's default)"
    if per_rank < 0:  # the reserve alone is more than the memory
        return (f"no {word} is left for tables on any of {world} ranks: the reserve takes {_fmt(-per_rank)} more "
                f"than all of it ({cap_text} less {reserve}{policy})")
    return f"each of {world} ranks has {_fmt(per_rank)} of {word} for tables ({cap_text} less {reserve}{policy})"


TABLE_TOO_BIG, CLUSTER_TOO_SMALL, NO_PACKING = "table_too_big", "cluster_too_small", "no_packing"


class Infeasible(NamedTuple):
    """Why no plan was found: ``cause`` (:data:`TABLE_TOO_BIG`, :data:`CLUSTER_TOO_SMALL`: no proposer can find
    one; :data:`NO_PACKING`: the proposer found none, another may) and the one ``line`` users see."""

    cause: str
    line: str


def diagnose(planner: Optional[EmbeddingShardingPlanner], spec: PlanSpec, world: int, device_type: str,
             also: str = "") -> Optional[Infeasible]:
    """The one line for a planner that found no plan, with its cause (decisions read the cause, never the line's
    wording); None when its state says nothing useful. ``also``: the proposers tried after ``spec``'s, e.g.
    " (then greedy)"."""
    reservation = getattr(planner, "_storage_reservation", None)
    reserved = getattr(reservation, "_last_reserved_topology", None)
    space = getattr(getattr(planner, "_enumerator", None), "last_stored_search_space", None)
    if reserved is None or not space:
        return None
    mem, word, cap_key = KINDS.get(device_type, KINDS["cpu"])
    budget = {"hbm": min(d.storage.hbm for d in reserved.devices), "ddr": min(d.storage.ddr for d in reserved.devices)}
    by_table: Dict[str, List[Any]] = {}
    for option in space:
        by_table.setdefault(option.name, []).append(option)
    where = _budget_text(spec, device_type, budget[mem], world)
    more = (f"raise cluster.{cap_key}, lower the storage reserve, add ranks (cluster.nodes, "
            "cluster.workers_per_node)")
    too_big = [(name, opts) for name, opts in by_table.items() if not any(_fits(o, budget) for o in opts)]
    if too_big:
        name, opts = max(too_big, key=lambda t: _smallest(t[1], mem)[0])
        need, _, option = _smallest(opts, mem)
        split = "" if {o.sharding_type for o in opts} & {"row_wise", "table_row_wise", "grid_shard"} else \
            " or allow row_wise sharding for it (sharding.types, or +sharding.constraints." + name + \
            ".sharding_types=[row_wise])"
        return Infeasible(TABLE_TOO_BIG, (
            f"no sharding plan fits in memory: table {name} ({option.tensor.shape[0]} x {option.tensor.shape[1]})"
            f" needs at least {_fmt(need)} of {word} on one rank in its smallest allowed option "
            f"({option.sharding_type}, {option.compute_kernel}; optimizer state included) but {where}"
            f"{f'; {len(too_big)} tables do not fit' if len(too_big) > 1 else ''}; {more}{split}"))
    totals = {name: _smallest(opts, mem)[1] for name, opts in by_table.items()}
    total, capacity = sum(totals.values()), sum(getattr(d.storage, mem) for d in reserved.devices)
    largest = max(totals, key=lambda name: totals[name])
    shape = by_table[largest][0].tensor.shape
    if total > capacity:
        return Infeasible(CLUSTER_TOO_SMALL, (
            f"no sharding plan fits in memory: all {len(by_table)} tables need at least {_fmt(total)} of {word} "
            f"(each in its smallest allowed option, optimizer state included; the largest, {largest} "
            f"({shape[0]} x {shape[1]}), {_fmt(totals[largest])}) but the cluster has {_fmt(capacity)}: "
            f"{where}; {more}"))
    return Infeasible(NO_PACKING, (
        f"no sharding plan found by sharding.proposer={spec.proposer}{also}: the tables need at least "
        f"{_fmt(total)} of the cluster's {_fmt(capacity)} of {word} and each has an option that fits on one rank "
        f"({where}), but no combination tried packs{_stopped(planner, by_table, budget, mem)}; try another "
        f"proposer (sharding.proposer=default tries grid search, greedy and uniform) or {more}"))


def _stopped(planner: EmbeddingShardingPlanner, by_table: Dict[str, List[ShardingOption]], budget: Dict[str, float],
             mem: str) -> str:
    """What stopped the runner's dynamic-programming search, from its counts: proposals holding a shard no
    rank can hold (naming the largest such option among the tables' smallest-in-total options, the ones its
    bins favour), and those the partitioner could not place."""
    proposer = (getattr(planner, "_proposers", None) or [None])[0]
    counts = [getattr(proposer, f"skipped_{k}", 0) for k in ("unplaceable", "no_room")]
    if not any(counts):
        return ""
    text = f": of its proposals, {counts[0]} held a shard no rank can hold"
    favoured = [min(opts, key=lambda o: sum(getattr(st, mem) for st in shard_storages(o)))
                for opts in by_table.values()]
    misfits = [o for o in favoured if not _fits(o, budget)]
    if misfits:
        worst = max(misfits, key=lambda o: max(getattr(s.storage, mem) for s in o.shards))
        shard = max(getattr(s.storage, mem) for s in worst.shards)
        text += (f" (e.g. table {worst.name}'s {worst.sharding_type} option, the smallest in total, has a "
                 f"{_fmt(shard)} shard)")
    return text + f", {counts[1]} left a shard no room once the row-wise and data-parallel shards were placed"
