"""Planning: config in, TorchRec's planner and a sharding plan (with the planner's estimates) out.

The only place that builds an ``EmbeddingShardingPlanner``: the topology and storage reservation from
:mod:`.topology`, per-table constraints from the sharding policy and the data's pooling, the proposer the
config names. Pure with respect to processes: :func:`build_planner` needs no process group, and
:func:`make_plan` uses one only to share rank 0's plan. A plan that cannot be had is one
:class:`PlanError` line that names the limit hit and the keys that change it.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from omegaconf import OmegaConf
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.planner.proposers import (
    DynamicProgrammingProposer,
    GreedyProposer,
    GridSearchProposer,
    UniformProposer,
)
from torchrec.distributed.planner.types import ShardingOption, Stats
from torchrec.distributed.types import CacheParams, ShardingPlan

from runner.config.errors import ConfigError, NoPlanFits, PlanError, first_line
from runner.config.schema import samples_per_step, uses_split_step
from runner.config.schema_model import SHARDING_TYPES
from runner.config.tables import table_specs
from runner.config.validation import table_constraint
from runner.plan.balanced import BalancedProposer, balanced_note, job_facts
from runner.plan.balanced_planner import BalancedPlanner
from runner.plan.bound import plan_bound
from runner.plan.infeasible import NO_PACKING, diagnose, explain
from runner.plan.plan_file import load_plan
from runner.plan.proposers import build_proposer
from runner.plan.sharders import sharders_for
from runner.plan.speedups.compact_enumeration import CompactEnumerator
from runner.plan.speedups.dp_proposer import FixedEnumerator, SkippingProposer, placeable_only
from runner.plan.speedups.enumeration_reuse import ReusingEnumerator, enumeration_key
from runner.plan.speedups.planning_loop import Progress, SearchLoopPlanner
from runner.plan.speedups.shard_estimators import shard_estimators
from runner.plan.speedups.torchrec_seam import planner_refusal, seam_note
from runner.plan.topology import build_storage_reservation, build_topology, dense_bytes

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig
    from runner.config.schema_model import ShardingSchema, TableConstraintSchema


def _table_constraint(types: Optional[List[str]], kernels: Optional[List[str]],
                      extra: Optional[TableConstraintSchema], pooling: float) -> ParameterConstraints:
    if kernels is None and types == ["data_parallel"]:
        kernels = ["dense"]  # TorchRec runs data_parallel tables only with the dense kernel
    kwargs: Dict[str, Any] = {"sharding_types": types, "compute_kernels": kernels, "pooling_factors": [pooling]}
    if extra is not None:
        for key in ("min_partition", "enforce_hbm"):
            if getattr(extra, key) is not None:
                kwargs[key] = getattr(extra, key)
        if extra.pooling_factor is not None:
            kwargs["pooling_factors"] = [float(extra.pooling_factor)]
        if extra.cache_load_factor is not None:
            kwargs["cache_params"] = CacheParams(load_factor=float(extra.cache_load_factor))
    return ParameterConstraints(**kwargs)


def build_constraints(sharding: ShardingSchema, table_names: List[str], pooling: float = 1.0,
                      exclude: Tuple[str, ...] = ()) -> Dict[str, ParameterConstraints]:
    """Per-table constraints: the group's allowed types and kernels, the data's ids per sample
    (the planner's pooling factor), then each table's own entry. Types in ``exclude`` are left out
    of every table the config leaves free."""
    out: Dict[str, ParameterConstraints] = {}
    for name in table_names:
        extra = table_constraint(sharding, name)
        types = list(extra.sharding_types) if extra is not None and extra.sharding_types is not None \
            else (list(sharding.types) or None)
        if types is None and exclude:
            types = [t for t in SHARDING_TYPES if t not in exclude]
        kernels = list(extra.compute_kernels) if extra is not None and extra.compute_kernels is not None \
            else (list(sharding.compute_kernels) or None)
        if types is None and kernels is None and extra is None and pooling == 1.0:
            continue
        out[name] = _table_constraint(types, kernels, extra, pooling)
    return out


@dataclass
class PlanEstimates(Stats):
    """Planner stats hook that keeps the chosen sharding options, for per-rank estimates."""

    best_plan: List[ShardingOption] = field(default_factory=list)
    world_size: int = 0
    lower_bound_ms: Optional[float] = None

    def log(self, sharding_plan: ShardingPlan, topology: Topology, *args: Any, **kwargs: Any) -> None:
        self.best_plan = list(kwargs.get("best_plan") or (args[5] if len(args) > 5 else []))
        self.world_size = topology.world_size
        self.lower_bound_ms = plan_bound(kwargs.get("enumerator"), kwargs.get("storage_reservation"))


def build_planner(cfg: RunnerConfig, world_size: int, local_world_size: int, device_type: str,
                  estimates: Optional[PlanEstimates] = None, dense_tensor_bytes: Optional[int] = None,
                  reuse: bool = False, hbm_cap: Optional[int] = None,
                  search_space: Optional[Tuple[List[ShardingOption], Any]] = None,
                  progress: Optional[Progress] = None, choose_from: Any = None) -> EmbeddingShardingPlanner:
    """The planner for ``cfg`` on a world of ``world_size`` ranks, ``local_world_size`` per node. With
    ``reuse``, enumerated options are shared with this process's later planners (:mod:`.speedups.enumeration_reuse`);
    ``hbm_cap``: bytes per GPU read from the devices (see :func:`make_plan`); ``search_space``: options
    already enumerated (and the enumerator that did it) instead of a new enumeration; ``progress``: called
    with the search's counts while it runs (:class:`.speedups.planning_loop.SearchLoopPlanner`); ``choose_from``: a
    sweep's plans for the balanced proposer to choose from (:mod:`.sweep_plans`)."""
    if seam_note() is not None:  # a TorchRec the runner's search was not tested with: TorchRec's own planner
        return torchrec_planner(cfg, world_size, local_world_size, device_type, estimates, dense_tensor_bytes, hbm_cap)
    topology, batch, constraints = _inputs(cfg, world_size, local_world_size, device_type, hbm_cap)
    kwargs = {"topology": topology, "batch_size": batch, "constraints": constraints,
              "estimator": shard_estimators(topology, constraints)}
    proposer = build_proposer(cfg.sharding, device_type, world_size)
    # the balanced search holds identical shards once; TorchRec's proposers get TorchRec's full options
    compact = isinstance(proposer, BalancedProposer)
    if search_space is not None:
        enumerator: Any = FixedEnumerator(*search_space, **kwargs)
    elif reuse:
        enumerator = ReusingEnumerator(enumeration_key(cfg, world_size, local_world_size, device_type, batch),
                                       compact=compact, progress=progress, **kwargs)
    else:
        enumerator = CompactEnumerator(compact=compact, progress=progress, **kwargs)
    planner_class: Any = SearchLoopPlanner
    if isinstance(proposer, BalancedProposer):
        proposer.choose_from = choose_from
        planner_class = functools.partial(BalancedPlanner, balanced=proposer, dp_hbm_bins=cfg.sharding.dp_hbm_bins)
        proposer = None  # the planner's own loop: TorchRec's default list is never run
    return planner_class(
        topology=topology,
        batch_size=batch,
        enumerator=enumerator,
        storage_reservation=build_storage_reservation(cfg.sharding, dense_tensor_bytes),
        proposer=proposer,
        constraints=constraints,
        stats=[estimates] if estimates is not None else None,
        debug=False,
        timeout_seconds=cfg.sharding.planner_timeout_s,
        progress=progress,
    )


def _inputs(cfg: RunnerConfig, world_size: int, local_world_size: int, device_type: str,
            hbm_cap: Optional[int]) -> Tuple[Topology, int, Dict[str, ParameterConstraints]]:
    """The topology, batch and constraints every planner of ``cfg`` plans with."""
    return (build_topology(cfg.cluster, world_size, local_world_size, device_type, hbm_cap),
            cfg.sharding.planner_batch_size or samples_per_step(cfg),
            build_constraints(cfg.sharding, [t.name for t in table_specs(cfg.model)], float(cfg.data.ids_per_feature),
                              ("data_parallel",) if uses_split_step(cfg) else ()))


def torchrec_planner(cfg: RunnerConfig, world_size: int, local_world_size: int, device_type: str,
                     estimates: Optional[PlanEstimates] = None, dense_tensor_bytes: Optional[int] = None,
                     hbm_cap: Optional[int] = None) -> EmbeddingShardingPlanner:
    """TorchRec's own planner (its loop, enumerator, estimators and proposers) for the inputs the runner's
    planner gets from ``cfg``: what the runner's plans are compared with (tests, benchmarks, the balanced
    proposer), and the planner itself on a TorchRec the runner's search was not tested with (:mod:`.torchrec_seam`)."""
    topology, batch, constraints = _inputs(cfg, world_size, local_world_size, device_type, hbm_cap)
    proposer = {"dynamic_programming": lambda: DynamicProgrammingProposer(hbm_bins_per_device=cfg.sharding.dp_hbm_bins),
                "greedy": lambda: [GreedyProposer(), GreedyProposer(use_depth=False)],
                "grid_search": lambda: GridSearchProposer(max_proposals=cfg.sharding.grid_max_proposals),
                "uniform": lambda: UniformProposer()}.get(cfg.sharding.proposer, lambda: None)()
    return EmbeddingShardingPlanner(topology=topology, batch_size=batch,
                                    storage_reservation=build_storage_reservation(cfg.sharding, dense_tensor_bytes),
                                    proposer=proposer, constraints=constraints,
                                    stats=[estimates] if estimates is not None else None, debug=False,
                                    timeout_seconds=cfg.sharding.planner_timeout_s)


def explain_planner_error(exc: Exception, planner: Any, cfg: RunnerConfig, world: int, device_type: str,
                          also: str = "") -> str:
    """One actionable line for a planner that found no plan (:mod:`.infeasible`); the planner's own first
    line when its state says nothing about memory. ``also``: the proposers tried after ``cfg``'s."""
    line = explain(planner, cfg, world, device_type, also) if planner is not None else None
    if line is not None:
        return line
    return f"the planner found no plan: {first_line(exc) or type(exc).__name__}"


def _placeable_plan(planner: Any, cfg: RunnerConfig, model: Any, world: int, local_world: int, device_type: str,
                    sharders: List[Any], estimates: PlanEstimates, hbm_cap: Optional[int],
                    notes: List[str], progress: Optional[Progress] = None) -> Optional[ShardingPlan]:
    """Where TorchRec's dynamic-programming proposer found no plan: propose again without the options that
    have a shard no GPU can hold (:func:`.speedups.dp_proposer.placeable_only`); the plan (TorchRec-partitioned and
    rated) and a note on how it was found, or None."""
    proposer = planner._proposers[0] if len(planner._proposers) == 1 else None
    reserved = getattr(planner._storage_reservation, "_last_reserved_topology", None)
    space = planner._enumerator.last_stored_search_space
    if type(proposer) is not SkippingProposer or reserved is None or not space:  # the dynamic-programming one
        return None
    kept = placeable_only(space, reserved)
    if len(kept) == len(space) or {o.name for o in kept} != {o.name for o in space}:
        return None  # nothing to leave out, or a table with no placeable option: no plan fits
    again = build_planner(cfg, world, local_world, device_type, estimates, dense_bytes(model), hbm_cap=hbm_cap,
                          search_space=(kept, planner._enumerator), progress=progress)
    try:
        plan = again.plan(model, sharders)
    except Exception:  # noqa: BLE001 - still none: the first planner's state explains why
        return None
    notes.append(f"TorchRec's dynamic-programming proposer found no plan: each of its proposals held a shard no "
                 f"GPU can hold ({proposer.skipped_unplaceable} proposals); this plan was found by proposing "
                 f"again without the {len(space) - len(kept)} of {len(space)} sharding options that have such "
                 "a shard (partitioned and rated by TorchRec's planner)")
    return plan


def _greedy_plan(cfg: RunnerConfig, model: Any, world: int, local_world: int, device_type: str, sharders: List[Any],
                 estimates: PlanEstimates, hbm_cap: Optional[int], notes: List[str]) -> Optional[ShardingPlan]:
    """Where the dynamic-programming search found no packing while the tables fit: the next proposer,
    TorchRec's greedy ones (``sharding.proposer=greedy``); the plan and a note, or None."""
    greedy: RunnerConfig = OmegaConf.merge(cfg, {"sharding": {"proposer": "greedy"}})  # type: ignore[assignment]
    try:
        plan = build_planner(greedy, world, local_world, device_type, estimates, dense_bytes(model),
                             hbm_cap=hbm_cap).plan(model, sharders)
    except Exception:  # noqa: BLE001 - none either: the first planner's state explains why
        return None
    notes.append("TorchRec's dynamic-programming proposer found no packing (nor without the options no GPU can "
                 "hold); this plan was found by the next proposer, sharding.proposer=greedy")
    return plan


def _plan_here(cfg: RunnerConfig, model: Any, world: int, local_world: int, device_type: str, sharders: List[Any],
               estimates: PlanEstimates, reuse: bool, hbm_cap: Optional[int], notes: List[str],
               facts: Dict[str, Any], progress: Optional[Progress] = None, choose_from: Any = None) -> Any:
    """The plan, or a :class:`PlanError` (returned, so that it can be broadcast to the other ranks)."""
    planner = None
    notes += [line for line in [seam_note()] if line]  # planned by TorchRec's stock planner: said
    try:
        planner = build_planner(cfg, world, local_world, device_type, estimates, dense_bytes(model), reuse, hbm_cap,
                                progress=progress, choose_from=choose_from)
        plan = planner.plan(model, sharders)
        facts["plan_source"] = "torchrec"  # TorchRec's proposer's plan, unless the balanced search's own
        if isinstance(planner, BalancedPlanner) and planner.balanced.facts:
            facts.update(job_facts(planner.balanced.facts))
            notes.append(balanced_note(planner.balanced.facts))
        return plan
    except (PlanError, ConfigError) as exc:  # already one line; rebuilt so that it pickles
        return PlanError(str(exc))
    except Exception as exc:  # PlannerError, and what TorchRec's planner raises; a bug of the runner's own raises
        if not planner_refusal(exc):
            raise
        if planner is None:
            return NoPlanFits(explain_planner_error(exc, planner, cfg, world, device_type))
        found = _placeable_plan(planner, cfg, model, world, local_world, device_type, sharders, estimates, hbm_cap,
                                notes, progress)
        line = explain_planner_error(exc, planner, cfg, world, device_type)
        why = diagnose(planner, cfg, world, device_type)
        if found is None and cfg.sharding.proposer == "dynamic_programming" and why and why.cause == NO_PACKING:
            found = _greedy_plan(cfg, model, world, local_world, device_type, sharders, estimates, hbm_cap, notes)
            line = explain_planner_error(exc, planner, cfg, world, device_type, " (then greedy)")
        return found if found is not None else NoPlanFits(line)


def make_plan(cfg: RunnerConfig, model: Any, world: int, local_world: int, device_type: str, pg: Any = None,
              reuse: bool = False, hbm_cap: Optional[int] = None, notes: Optional[List[str]] = None,
              progress: Optional[Progress] = None, facts: Optional[Dict[str, Any]] = None,
              choose_from: Any = None) -> Tuple[ShardingPlan, List[ShardingOption], float, List[Any]]:
    """Plan (or load the pinned plan) for ``model``; with ``pg``, rank 0 plans and broadcasts. ``reuse``
    shares enumerated options with later calls in this process (a plan-only sweep, :mod:`.speedups.enumeration_reuse`).
    ``hbm_cap``: the bytes each GPU of a training job has (the smallest of its devices), used where
    ``cluster.hbm_cap_gib`` is null. ``notes`` gets a line on how the plan was found when it was not found
    by TorchRec's proposer alone; ``progress`` is called with the search's counts while it runs; ``facts``
    (rank 0's) gets ``lower_bound_ms`` (:mod:`.bound`) and, for the balanced proposer, ``compared``: the
    ratings of TorchRec's plans it started from (:func:`.balanced.compared_metrics`); ``choose_from``: a
    sweep's plans, for a sweep planned together (:mod:`.sweep_plans`).

    Returns the plan, the planner's chosen options (empty for a pinned plan), seconds, and sharders.
    Raises :class:`PlanError` with one line on every rank when no plan can be had.
    """
    import torch.distributed as dist

    sharders = sharders_for(cfg.precision)
    t0 = time.perf_counter()
    if cfg.sharding.plan:
        plan = load_plan(cfg.sharding.plan, table_specs(cfg.model), world, local_world, device_type)
        return plan, [], time.perf_counter() - t0, sharders
    estimates = PlanEstimates()
    result: List[Any] = [None]
    if pg is None or dist.get_rank(pg) == 0:
        found: Dict[str, Any] = facts if facts is not None else {}
        result[0] = _plan_here(cfg, model, world, local_world, device_type, sharders, estimates, reuse, hbm_cap,
                               notes if notes is not None else [], found, progress, choose_from)
        found["lower_bound_ms"] = estimates.lower_bound_ms
    if pg is not None:
        dist.broadcast_object_list(result, src=0, group=pg)
    if isinstance(result[0], PlanError):
        raise result[0]
    return result[0], estimates.best_plan, time.perf_counter() - t0, sharders
