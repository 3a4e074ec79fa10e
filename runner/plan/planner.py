"""Planning: config in, TorchRec's planner and a sharding plan (with the planner's estimates) out.

The only place that builds an ``EmbeddingShardingPlanner``: the topology and storage reservation from
:mod:`.topology`, per-table constraints from the sharding policy and the data's pooling, the proposer the config
names. Pure with respect to processes: :func:`build_planner` needs no process group, and :func:`make_plan` uses one
only to share rank 0's plan. A plan that cannot be had is one :class:`PlanError` line that names the limit hit and
the keys that change it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

import torch.distributed as dist
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.planner.types import Enumerator, ShardingOption, Stats
from torchrec.distributed.types import CacheParams, ModuleSharder, ShardingPlan

from runner.config.errors import ConfigError, NoPlanFits, PlanError, first_line
from runner.config.reservations import RESERVATIONS
from runner.config.schema import SHARDING_TYPES
from runner.config.validation import table_constraint
from runner.plan.cost import step_estimate as steps
from runner.plan.cost.choice import for_config
from runner.plan.cost.topology import build_topology, dense_bytes, topology_knobs
from runner.plan.plan_file import load_plan, pinned_options
from runner.plan.plan_memory import build_storage_reservation, reserved_per_rank, stock_estimators
from runner.plan.proposer_build import stock_proposer
from runner.plan.sharders import sharders_for
from runner.plan.spec import PlanFacts, PlanSpec
from runner.plan.torchrec_adapter.torchrec_seam import conformance_note, planner_refusal, seam_note

if TYPE_CHECKING:
    from torch import nn

    from runner.config.schema import ShardingSchema, TableConstraintSchema
    from runner.plan.spec import PlanChoices
    from runner.plan.torchrec_adapter.balanced.proposer import PlanEntries


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
    """Per-table constraints: the group's allowed types and kernels, the data's ids per sample (the planner's pooling
    factor), then each table's own entry. Types in ``exclude`` are left out of every table the config leaves free."""
    out: Dict[str, ParameterConstraints] = {}
    group_types, group_kernels = list(sharding.types) or None, list(sharding.compute_kernels) or None
    own = set(sharding.constraints.keys())  # read once: a config lookup per table is 0.8 s at 5,384 tables
    for name in table_names:
        extra = table_constraint(sharding, name) if name in own else None
        types = list(extra.sharding_types) if extra is not None and extra.sharding_types is not None \
            else (list(group_types) if group_types else None)
        if types is None and exclude:
            types = [t for t in SHARDING_TYPES if t not in exclude]
        kernels = list(extra.compute_kernels) if extra is not None and extra.compute_kernels is not None \
            else (list(group_kernels) if group_kernels else None)
        if types is None and kernels is None and extra is None and pooling == 1.0:
            continue
        out[name] = _table_constraint(types, kernels, extra, pooling)
    return out


@dataclass
class PlanEstimates(Stats):
    """Planner stats hook that keeps the chosen sharding options, for per-rank estimates."""

    best_plan: List[ShardingOption] = field(default_factory=list)
    lower_bound_ms: Optional[float] = None
    lower_bound_kind: Optional[str] = None
    reserved_bytes: Optional[List[int]] = None  # per rank, of the memory tables go in (plan_memory.reserved_per_rank)

    def log(self, sharding_plan: ShardingPlan, topology: Topology, *args: Any, **kwargs: Any) -> None:
        self.best_plan = list(kwargs.get("best_plan") or (args[5] if len(args) > 5 else []))
        reservation = kwargs.get("storage_reservation")
        self.reserved_bytes = reserved_per_rank(topology, getattr(reservation, "_last_reserved_topology", None))
        if seam_note() is None:  # the bound reads the runner's enumeration (the TorchRec adapter)
            from runner.plan.torchrec_adapter.runner_planner import plan_bound

            found = plan_bound(kwargs.get("enumerator"), kwargs.get("storage_reservation"))
            self.lower_bound_ms, self.lower_bound_kind = found if found is not None else (None, None)


def build_planner(spec: PlanSpec, world_size: int, local_world_size: int, device_type: str,
                  estimates: Optional[PlanEstimates] = None, dense_tensor_bytes: Optional[int] = None,
                  reuse: bool = False, hbm_cap: Optional[int] = None,
                  search_space: Optional[Tuple[List[ShardingOption], Enumerator]] = None,
                  progress: Optional[Callable[..., None]] = None,
                  choose_from: Optional[PlanChoices] = None) -> EmbeddingShardingPlanner:
    """The planner for ``spec`` (:func:`runner.plan.spec.plan_spec`) on a world of ``world_size`` ranks,
    ``local_world_size`` per node. With ``reuse``, enumerated options are shared with this process's later planners
    (:mod:`.torchrec_adapter.enumeration_reuse`); ``hbm_cap``: bytes per GPU read from the devices (see
    :func:`make_plan`); ``search_space``: options already enumerated (and the enumerator that did it) instead of a new
    enumeration; ``progress``: called with the search's counts while it runs
    (:class:`.torchrec_adapter.planning_loop.SearchLoopPlanner`); ``choose_from``: a sweep's plans for the balanced
    proposer to choose from (:mod:`runner.launch.sweep.plan_together`)."""
    if seam_note() is not None:  # a TorchRec the runner's planner was not tested with: TorchRec's own planner
        return torchrec_planner(spec, world_size, local_world_size, device_type, estimates, dense_tensor_bytes, hbm_cap)
    from runner.plan.torchrec_adapter.runner_planner import runner_planner  # only after the version check

    return runner_planner(spec, planner_inputs(spec, world_size, local_world_size, device_type, hbm_cap), device_type,
                          world_size, estimates, dense_tensor_bytes, reuse, search_space, progress, choose_from)


def planner_inputs(spec: PlanSpec, world_size: int, local_world_size: int, device_type: str,
            hbm_cap: Optional[int]) -> Tuple[Topology, int, Dict[str, ParameterConstraints]]:
    """The topology (with the calibration's constants), batch and constraints every planner of ``spec`` plans with."""
    calibration = for_config(spec.cluster, spec.mode, device_type).calibration
    return (build_topology(spec.cluster, world_size, local_world_size, device_type, hbm_cap, calibration,
                           spec.ddr_cap_gib),
            spec.batch, build_constraints(spec.sharding, [t.name for t in spec.tables], spec.pooling, spec.excluded))


def torchrec_planner(spec: PlanSpec, world_size: int, local_world_size: int, device_type: str,
                     estimates: Optional[PlanEstimates] = None, dense_tensor_bytes: Optional[int] = None,
                     hbm_cap: Optional[int] = None) -> EmbeddingShardingPlanner:
    """TorchRec's own planner (its loop, enumerator, estimators and proposers) for the inputs the runner's planner gets
    from ``spec``: what the runner's plans are compared with (tests, benchmarks, the balanced proposer), and the planner
    itself on a TorchRec the runner's search was not tested with (:mod:`.torchrec_adapter.torchrec_seam`)."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

    topology, batch, constraints = planner_inputs(spec, world_size, local_world_size, device_type, hbm_cap)
    proposer = stock_proposer(spec.proposer, spec.sharding)
    enumerator = EmbeddingEnumerator(topology=topology, batch_size=batch, constraints=constraints,
                                     estimator=stock_estimators(topology, constraints, spec.pipeline))
    return EmbeddingShardingPlanner(topology=topology, batch_size=batch, enumerator=enumerator,
                                    performance_model=steps.step_perf_model(spec, device_type, world_size,
                                                                            topology.local_world_size),
                                    storage_reservation=build_storage_reservation(spec.sharding, topology,
                                                                                  dense_tensor_bytes),
                                    proposer=proposer, constraints=constraints,
                                    stats=[estimates] if estimates is not None else None, debug=False,
                                    timeout_seconds=spec.sharding.planner_timeout_s)


def _plan_here(spec: PlanSpec, model: nn.Module, world: int, local_world: int, device_type: str,
               sharders: List[ModuleSharder[nn.Module]], estimates: PlanEstimates, reuse: bool, hbm_cap: Optional[int],
               notes: List[str], facts: PlanFacts, progress: Optional[Callable[..., None]] = None,
               choose_from: Optional[PlanChoices] = None) -> Union[ShardingPlan, PlanError]:
    """The plan, or a :class:`PlanError` (returned, so that it can be broadcast to the other ranks): by the
    runner's planner (:mod:`.torchrec_adapter.runner_planner`), or by TorchRec's stock planner on a TorchRec the
    adapter was not tested with (said in one note line)."""
    if seam_note() is None:
        from runner.plan.torchrec_adapter.runner_planner import plan_with_runner

        if conformance_note() is not None:
            notes.append(str(conformance_note()))
        return plan_with_runner(spec, model, world, device_type, sharders, estimates, reuse, notes, facts,
                                planner_inputs(spec, world, local_world, device_type, hbm_cap), progress, choose_from)
    notes.append(str(seam_note()))
    facts["plan_source"], facts["planner"] = "torchrec", "stock"
    try:
        return torchrec_planner(spec, world, local_world, device_type, estimates, dense_bytes(model),
                                hbm_cap).plan(model, sharders)
    except (PlanError, ConfigError) as exc:
        return PlanError(str(exc))
    except Exception as exc:  # what TorchRec's planner raises when it finds no plan; anything else is a bug
        if not planner_refusal(exc):
            raise
        return NoPlanFits(f"TorchRec's stock planner found no plan: {first_line(exc) or type(exc).__name__}")


def make_plan(spec: PlanSpec, model: nn.Module, world: int, local_world: int, device_type: str,
              pg: Optional[dist.ProcessGroup] = None, reuse: bool = False, hbm_cap: Optional[int] = None,
              notes: Optional[List[str]] = None, progress: Optional[Callable[..., None]] = None,
              facts: Optional[PlanFacts] = None, choose_from: Optional[PlanChoices] = None,
              dense_measured: Optional[Dict[str, float]] = None
              ) -> Tuple[ShardingPlan, List[ShardingOption], float, List[ModuleSharder[nn.Module]]]:
    """Plan (or load the pinned plan) for ``model`` as ``spec`` (a job's plan part) says; with ``pg``, rank 0 plans
    and broadcasts. ``reuse`` shares enumerated options with later calls in this process (a plan-only sweep,
    :mod:`.torchrec_adapter.enumeration_reuse`). ``hbm_cap``: the bytes each GPU of a training job has (the smallest of
    its devices), used where ``cluster.hbm_cap_gib`` is null. ``notes`` gets a line on how the plan was found when it
    was not found by TorchRec's proposer alone; ``progress`` is called with the search's counts while it runs; ``facts``
    (rank 0's) gets ``lower_bound_ms`` (:mod:`.torchrec_adapter.balanced.bound`) and, for the balanced proposer,
    ``compared``: the ratings of TorchRec's plans it started from
    (:func:`.torchrec_adapter.balanced.proposer.compared_metrics`); ``choose_from``: a sweep's plans, for a sweep
    planned together (:mod:`runner.launch.sweep.plan_together`); ``dense_measured``: for the whole step only.

    Returns the plan, the planner's chosen options (for a pinned plan, its tables' options as the planner would
    have rated them, :mod:`.pinned`), seconds, and sharders.
    Raises :class:`PlanError` with one line on every rank when no plan can be had.
    """
    sharders = sharders_for(spec.precision)
    t0 = time.perf_counter()
    for_config(spec.cluster, spec.mode, device_type)  # every rank: an unusable calibration is every rank's line
    if spec.sharding.plan:
        plan = load_plan(spec.sharding.plan, spec.tables, world, local_world, device_type)
        if empty := empty_shard(plan, device_type):
            raise PlanError(empty)
        chosen: List[ShardingOption] = []
        if pg is None or dist.get_rank(pg) == 0:  # rated as the planner would have rated it: the run's estimates
            try:  # rank 0 alone: what cannot be rated has no estimate, and never stops the job
                chosen = pinned_options(spec, model, plan, sharders, planner_inputs(spec, world, local_world,
                                                                                    device_type, hbm_cap))
                _whole_step(spec, model, world, local_world, device_type, chosen,
                            facts if facts is not None else {}, dense_measured)
            except Exception:  # noqa: BLE001
                chosen = []
        return plan, chosen, time.perf_counter() - t0, sharders
    estimates = PlanEstimates()
    result: List[Any] = [None]
    if notes is not None and (new := RESERVATIONS[spec.sharding.storage_reserve_policy].new_name):
        notes.append(f"sharding.storage_reserve_policy={spec.sharding.storage_reserve_policy} is {new}'s old name "
                     f"and plans as {new}")
    if pg is None or dist.get_rank(pg) == 0:
        found: PlanFacts = facts if facts is not None else {}
        result[0] = _plan_here(spec, model, world, local_world, device_type, sharders, estimates, reuse, hbm_cap,
                               notes if notes is not None else [], found, progress, choose_from)
        found["lower_bound_ms"], found["lower_bound_kind"] = estimates.lower_bound_ms, estimates.lower_bound_kind
        found["reserved_bytes"] = estimates.reserved_bytes
        _whole_step(spec, model, world, local_world, device_type, estimates.best_plan, found, dense_measured)
        if not isinstance(result[0], PlanError) and (empty := empty_shard(result[0], device_type)):
            result[0] = PlanError(empty)
    if pg is not None:
        dist.broadcast_object_list(result, src=0, group=pg)
    if isinstance(result[0], PlanError):
        raise result[0]
    return result[0], estimates.best_plan, time.perf_counter() - t0, sharders


def _whole_step(spec: PlanSpec, model: nn.Module, world: int, local_world: int, device_type: str,
                best_plan: List[ShardingOption], facts: PlanFacts, dense_measured: Optional[Dict[str, float]] = None
                ) -> None:
    """``facts`` gets which constants the plan was made with and, with a calibration, the whole step
    (:mod:`.step_estimate`; ``dense_measured``: the job's dense part timed on its workers)."""
    from runner.plan.analysis import per_rank_estimates
    from runner.plan.cost.row_reuse import row_reuse_ms
    from runner.plan.cost.table_size import table_size_ms

    chosen = for_config(spec.cluster, spec.mode, device_type)
    facts["calibration"], facts["calibration_note"] = chosen.tag, chosen.note
    facts["bandwidths"] = topology_knobs(chosen.calibration, device_type, spec.cluster.intra_node_bandwidth,
                                         spec.cluster.cross_node_bandwidth, world, local_world)[1]
    if chosen.calibration is None or not best_plan:
        return
    reused = row_reuse_ms(chosen.calibration.constants, best_plan, world)
    facts["step"] = steps.whole_step(per_rank_estimates(best_plan, world), steps.sharded_lookups(best_plan),
                                     steps.input_dist_ms(best_plan, world), chosen.calibration,
                                     steps.dense_facts(model, spec.rows), world, local_world, device_type,
                                     steps.replicated(best_plan, world), dense_measured, reused,
                                     table_size_ms(chosen.calibration.constants, best_plan, world, reused))


def runners_planner() -> bool:
    """Whether the runner's planner plans here (the TorchRec adapter's gate, :mod:`.torchrec_adapter.torchrec_seam`);
    False: TorchRec's stock planner. The one place outside the adapter that asks it."""
    return seam_note() is None


def reusable_model(spec: PlanSpec, build: Callable[[], nn.Module]) -> nn.Module:
    """``build()``'s model (the planning model of ``spec``'s job), shared with this process's later plans of the
    same model where the runner's planner plans (:mod:`.torchrec_adapter.enumeration_reuse`); a new one each time on
    TorchRec's stock planner."""
    if not runners_planner():
        return build()
    from runner.plan.torchrec_adapter.enumeration_reuse import model_key, reused_model

    return reused_model(model_key(spec), build)


def plan_entries(best: List[ShardingOption]) -> PlanEntries:
    """A found plan's options as the balanced search's entries, for a sweep planned together to choose from."""
    from runner.plan.torchrec_adapter.runner_planner import entries_of

    return entries_of(best)


def empty_shard(plan: ShardingPlan, device_type: str) -> Optional[str]:
    """On CPU workers, a table split by rows over more ranks than it has rows (a rank would hold an empty shard,
    which FBGEMM's CPU kernels refuse at the first step), as one line; else None."""
    if device_type != "cpu":
        return None
    for tables in plan.plan.values():
        for name, ps in tables.items():
            shards = ps.sharding_spec.shards if ps.sharding_spec is not None else []
            empty = [m.placement.rank() for m in shards if m.shard_sizes[0] == 0 or m.shard_sizes[1] == 0]
            if empty:
                rows = sum(m.shard_sizes[0] for m in shards if m.shard_offsets[1] == 0)
                return (f"table {name} ({rows} row(s)) is split over {len(shards)} shards ({ps.sharding_type}): rank "
                        f"{empty[0]} would hold an empty shard, which FBGEMM's CPU kernels do not run; give it at "
                        f"least {len(shards)} rows, or another sharding type (+sharding.constraints.{name}."
                        "sharding_types=[table_wise])")
    return None

