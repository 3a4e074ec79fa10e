"""Sharding plans as files: JSON written by every run, a readable table, and loading a pinned plan.

A plan given as a file (``sharding.plan``), rated as the planner rates the plans it finds: each table's sharding
option enumerated by TorchRec's own enumerator and estimators with the job's topology, constants and pipeline, its
shards placed on the file's ranks. A pinned plan's run then shows the same estimates (TorchRec's per-rank perf and
storage, and with a calibration the whole step) as the plan would have had if the planner had chosen it, so that
plans can be compared by estimate and by measurement one by one (``make bench-estimates``' ranking study).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner import Topology
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.types import ShardingOption
from torchrec.distributed.types import (
    BoundsCheckMode,
    CacheParams,
    EmbeddingModuleShardingPlan,
    EnumerableShardingSpec,
    ModuleSharder,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
)
from torchrec.types import DataType

from runner.config.errors import PlanError
from runner.config.tables import TableSpec
from runner.plan.plan_memory import stock_estimators
from runner.runtime.moved_names import cache_algorithm, multipass_prefetch_config

if TYPE_CHECKING:
    from torch import nn

    from runner.plan.spec import PlanSpec


# CacheParams' fields that a plan file keeps (its statistics object is the planner's input, not the plan's)
_CACHE_ENUMS = ("algorithm", "precision")
_CACHE_VALUES = ("load_factor", "reserved_memory", "prefetch_pipeline")


def _settings(ps: ParameterSharding) -> Dict[str, Any]:
    """A table's per-table settings beyond its placement (cache, HBM, rounding, bounds checks, output
    type), as JSON; absent ones are left out."""
    out: Dict[str, Any] = {}
    c = ps.cache_params
    if c is not None:
        cache = {k: getattr(c, k).name for k in _CACHE_ENUMS if getattr(c, k) is not None}
        cache.update({k: getattr(c, k) for k in _CACHE_VALUES if getattr(c, k) is not None})
        if c.multipass_prefetch_config is not None:
            cache["multipass_prefetch_config"] = list(c.multipass_prefetch_config)
        out["cache_params"] = cache
    for key in ("enforce_hbm", "stochastic_rounding"):
        if getattr(ps, key) is not None:
            out[key] = bool(getattr(ps, key))
    for key in ("bounds_check_mode", "output_dtype"):
        if getattr(ps, key) is not None:
            out[key] = getattr(ps, key).name
    return out


def _from_settings(settings: Dict[str, Any]) -> Dict[str, Any]:
    """:class:`ParameterSharding` keyword arguments from :func:`_settings`' JSON."""
    kwargs: Dict[str, Any] = {}
    cache = settings.get("cache_params")
    if cache is not None:
        enums = {"algorithm": cache_algorithm(), "precision": DataType}
        fields = {k: enums[k][v] for k, v in cache.items() if k in enums}
        fields.update({k: v for k, v in cache.items() if k in _CACHE_VALUES})
        if cache.get("multipass_prefetch_config") is not None:
            fields["multipass_prefetch_config"] = multipass_prefetch_config()(*cache["multipass_prefetch_config"])
        kwargs["cache_params"] = CacheParams(**fields)
    for key in ("enforce_hbm", "stochastic_rounding"):
        if key in settings:
            kwargs[key] = bool(settings[key])
    for key, enum in (("bounds_check_mode", BoundsCheckMode), ("output_dtype", DataType)):
        if key in settings:
            kwargs[key] = enum[settings[key]]
    return kwargs


def plan_to_dict(plan: ShardingPlan, specs: List[TableSpec]) -> Dict[str, Dict[str, Any]]:
    """JSON-ready plan: per module, per table: type, kernel, ranks, shape and every shard's offsets/sizes."""
    by_name = {s.name: s for s in specs}
    out: Dict[str, Dict[str, Any]] = {}
    for module_path, module_plan in plan.plan.items():
        tables: Dict[str, Any] = {}
        for table, ps in module_plan.items():  # type: ignore[union-attr]
            shards = [{"rank": md.placement.rank() if md.placement is not None else None,
                       "offsets": list(md.shard_offsets), "sizes": list(md.shard_sizes)}
                      for md in (ps.sharding_spec.shards if ps.sharding_spec is not None else [])]
            spec = by_name.get(table)
            tables[table] = {
                "rows": spec.num_embeddings if spec else None,
                "dim": spec.embedding_dim if spec else None,
                "sharding_type": ps.sharding_type,
                "compute_kernel": ps.compute_kernel,
                "ranks": list(ps.ranks) if ps.ranks is not None else None,
                "shards": shards,
                **_settings(ps),
            }
        out[module_path] = tables
    return out


COLUMN_MAX = 40  # a longer cell (a table's scattered ranks) runs on past its column


def plan_table(plan_dict: Dict[str, Dict[str, Any]]) -> str:
    """Readable table of a plan dict: one line per table; runs of ranks as ``a-b``, runs of shards on consecutive
    ranks with one size as ``ra-b@offsets:sizes`` (replicas: the same offsets) or ``ra-b@offsets..:sizes`` (each
    shard where the one before it ends), so that a table over 8,192 GPUs takes one short line."""
    rows = [("module", "table", "sharding_type", "kernel", "ranks", "shards (offsets:sizes)")]
    for module, tables in plan_dict.items():
        for table, p in tables.items():
            ranks = "all" if p["ranks"] is None else rank_ranges(p["ranks"])
            shards = " ".join(_shard_runs(p["shards"])) or "replicated"
            rows.append((module or "<root>", table, p["sharding_type"], p["compute_kernel"], ranks, shards))
    widths = [min(max(len(r[i]) for r in rows), COLUMN_MAX) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines) + "\n"


def rank_ranges(ranks: List[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` as ``0-2,5,7-8``: runs of consecutive ranks, in the order given."""
    runs: List[List[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _shard_runs(shards: List[Dict[str, Any]]) -> List[str]:
    """Shards as runs: consecutive ranks, the same sizes, and offsets that either stay (replicas) or go on
    where the shard before ended (``..``)."""
    out: List[str] = []
    i = 0
    while i < len(shards):
        first, j, step = shards[i], i + 1, None
        while j < len(shards):
            prev, s = shards[j - 1], shards[j]
            if None in (s["rank"], prev["rank"]) or s["rank"] != prev["rank"] + 1 or s["sizes"] != first["sizes"]:
                break
            moved = [o - q for o, q in zip(s["offsets"], prev["offsets"], strict=True)]
            kind = "same" if not any(moved) else "next" if _continues(moved, first["sizes"]) else None
            if kind is None or (step is not None and kind != step):
                break
            step, j = kind, j + 1
        where = "x".join(map(str, first["offsets"])) + (".." if step == "next" else "")
        ranks = f"{first['rank']}" if j == i + 1 else f"{first['rank']}-{shards[j - 1]['rank']}"
        out.append(f"r{ranks}@{where}:{'x'.join(map(str, first['sizes']))}")
        i = j
    return out


def _continues(moved: List[int], sizes: List[int]) -> bool:
    """Whether an offset change of ``moved`` is one shard's ``sizes`` along one dimension (rows or columns)."""
    steps = [(d, m) for d, m in enumerate(moved) if m]
    return len(steps) == 1 and steps[0][1] == sizes[steps[0][0]]


def sharding_types_used(plan_dict: Dict[str, Dict[str, Any]]) -> Dict[str, int]:
    """Number of tables per sharding type."""
    return dict(sorted(Counter(p["sharding_type"] for tables in plan_dict.values() for p in tables.values()).items()))


def _placement(rank: int, device_type: str, local_world: int) -> str:
    return f"rank:{rank}/cpu" if device_type == "cpu" else f"rank:{rank}/{device_type}:{rank % local_world}"


def _check_shards(where: str, spec: TableSpec, shards: List[Dict[str, Any]]) -> None:
    covered = sum(s["sizes"][0] * s["sizes"][1] for s in shards)
    if covered != spec.num_embeddings * spec.embedding_dim:
        raise PlanError(f"{where}: shards cover {covered} values but table {spec.name} has "
                        f"{spec.num_embeddings} x {spec.embedding_dim}; the plan is for another model")


def _placement_fault(t: Dict[str, Any]) -> Optional[str]:
    """What of one table's entry is not a placement (None: nothing): a sharding type and kernel TorchRec knows,
    ranks and shards of whole non-negative numbers (a hand-edited or half-written plan.json never reaches TorchRec,
    whose own errors name no file); ranks past the job's world are said by :func:`load_plan`."""
    def index(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62

    def index_pair(p: Any) -> bool:
        return isinstance(p, list) and len(p) == 2 and all(map(index, p))
    if t.get("sharding_type") not in {s.value for s in ShardingType}:
        return f"sharding_type={t.get('sharding_type')!r} is not one of TorchRec's"
    if t.get("compute_kernel") not in {k.value for k in EmbeddingComputeKernel}:
        return f"compute_kernel={t.get('compute_kernel')!r} is not one of TorchRec's"
    if not (t.get("ranks") is None or isinstance(t["ranks"], list) and t["ranks"] and all(map(index, t["ranks"]))):
        return f"ranks={t.get('ranks')!r} are not ranks"
    shards = t.get("shards")
    if not isinstance(shards, list) or not all(isinstance(s, dict) and index(s.get("rank")) and index_pair(
            s.get("offsets")) and index_pair(s.get("sizes")) for s in shards):
        return f"shards={shards!r} are not shards (a rank, whole offsets and sizes)"
    return None


def load_plan(path: str, specs: List[TableSpec], world: int, local_world: int, device_type: str) -> ShardingPlan:
    """The ``plan.json`` at ``path`` as a TorchRec plan for this model and world, or :class:`PlanError`."""
    where = f"sharding.plan={path}"
    p = Path(path)
    if not p.is_file():
        raise PlanError(f"{where}: no such file")
    try:
        data = json.loads(p.read_text())
    except (ValueError, OSError) as exc:
        raise PlanError(f"{where}: not a plan JSON ({exc}); give a plan.json a run wrote") from None
    if not isinstance(data, dict) or not all(isinstance(t, dict) and all(isinstance(v, dict) for v in t.values())
                                             for t in data.values()):
        raise PlanError(f"{where}: not a plan JSON (no module -> table -> settings mapping); give a plan.json a run "
                        "wrote")
    by_name = {s.name: s for s in specs}
    planned = {t for tables in data.values() for t in tables}
    if planned != set(by_name):
        extra, missing = sorted(planned - set(by_name)), sorted(set(by_name) - planned)
        raise PlanError(f"{where}: plan tables do not match the model (only in plan: {extra or '-'}; "
                        f"only in model: {missing or '-'})")
    plan: Dict[str, EmbeddingModuleShardingPlan] = {}
    for module, tables in data.items():
        module_plan = EmbeddingModuleShardingPlan()
        for table, t in tables.items():
            if (fault := _placement_fault(t)) is not None:
                raise PlanError(f"{where}: table {table}: {fault}; give a plan.json a run wrote")
            ranks = t["ranks"] if t["ranks"] is not None else list(range(world))
            used = ranks + [s["rank"] for s in t["shards"]]
            if max(used) >= world:
                raise PlanError(f"{where}: table {table} is placed on rank {max(used)} but this job has {world} "
                                "ranks (cluster.nodes x cluster.workers_per_node)")
            spec = None
            if t["shards"]:
                _check_shards(where, by_name[table], t["shards"])
                spec = EnumerableShardingSpec([
                    ShardMetadata(shard_offsets=s["offsets"], shard_sizes=s["sizes"],
                                  placement=_placement(s["rank"], device_type, local_world))
                    for s in t["shards"]
                ])
            try:
                settings = _from_settings(t)
            except (LookupError, TypeError, ValueError, AttributeError) as exc:
                raise PlanError(f"{where}: table {table}: its settings cannot be read ({type(exc).__name__}: {exc}); "
                                "give a plan.json a run wrote") from None
            module_plan[table] = ParameterSharding(sharding_type=t["sharding_type"],
                                                   compute_kernel=t["compute_kernel"], ranks=ranks,
                                                   sharding_spec=spec, **settings)
        plan[module] = module_plan
    return ShardingPlan(plan)


def _sizes(parameter_sharding: ParameterSharding) -> List[Tuple[int, ...]]:
    """The shard sizes a plan's table holds, in shard order (none for a data-parallel table)."""
    spec = parameter_sharding.sharding_spec
    return [tuple(s.shard_sizes) for s in spec.shards] if spec is not None else []


def _matches(option: ShardingOption, parameter_sharding: ParameterSharding) -> bool:
    """``option`` is the plan's choice for its table: the same sharding type, compute kernel and shards."""
    if option.sharding_type != parameter_sharding.sharding_type:
        return False
    if option.compute_kernel != parameter_sharding.compute_kernel:
        return False
    sizes = _sizes(parameter_sharding)
    return not sizes or [tuple(s.size) for s in option.shards] == sizes


def pinned_options(spec: PlanSpec, model: nn.Module, plan: ShardingPlan, sharders: List[ModuleSharder[nn.Module]],
                   inputs: Tuple[Topology, int, Dict[str, Any]]) -> List[ShardingOption]:
    """``plan``'s tables as the planner's chosen options: TorchRec's enumeration of ``model`` with ``inputs``, the
    topology, batch and constraints every planner of ``spec`` plans with (:func:`runner.plan.planner.planner_inputs`),
    each table's option that the plan chose, its shards on the plan's ranks. Empty where a table's choice is not
    among the options (a plan written with settings this job's enumerator does not offer): the run then shows no
    estimate, as before."""
    topology, batch, constraints = inputs
    enumerator = EmbeddingEnumerator(topology=topology, batch_size=batch, constraints=constraints,
                                     estimator=stock_estimators(topology, constraints, spec.pipeline))
    options: Dict[Tuple[str, str], List[ShardingOption]] = {}
    for option in enumerator.enumerate(model, sharders):
        options.setdefault((option.path, option.name), []).append(option)
    chosen: List[ShardingOption] = []
    for path, module_plan in plan.plan.items():
        for table, parameter_sharding in module_plan.items():
            found = next((o for o in options.get((path, table), []) if _matches(o, parameter_sharding)), None)
            ranks = parameter_sharding.ranks or []
            if found is None or len(ranks) != len(found.shards):
                return []
            for shard, rank in zip(found.shards, ranks, strict=True):
                shard.rank = rank
            chosen.append(found)
    return chosen
