"""The runner's planner: TorchRec's planner with the adapter's enumeration, estimators, search loop and proposers,
and the runner's fall-backs where a proposer finds no plan.

Reached only from :mod:`runner.plan.planner`, and only once :func:`.torchrec_seam.seam_note` found the installed
TorchRec to be the one the adapter was tested with; on any other TorchRec the runner plans with TorchRec's stock
planner and never imports this package's other modules.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union, cast

from torchrec.distributed.planner.types import Enumerator, ShardingOption
from torchrec.distributed.types import ModuleSharder, ShardingPlan

from runner.config.errors import ConfigError, NoPlanFits, PlanError, first_line
from runner.config.proposers import PROPOSERS
from runner.plan.cost.step_estimate import step_perf_model
from runner.plan.plan_memory import build_storage_reservation
from runner.plan.proposer_build import build_proposer
from runner.plan.spec import PlanFacts
from runner.plan.torchrec_adapter.balanced.balanced_planner import BalancedPlanner
from runner.plan.torchrec_adapter.balanced.bound import plan_bound
from runner.plan.torchrec_adapter.balanced.proposer import balanced_note, entries_of, job_facts
from runner.plan.torchrec_adapter.compact_enumeration import CompactEnumerator
from runner.plan.torchrec_adapter.dp_proposer import FixedEnumerator, SkippingProposer, placeable_only
from runner.plan.torchrec_adapter.enumeration_reuse import ReusingEnumerator, enumeration_key
from runner.plan.torchrec_adapter.infeasible import NO_PACKING, diagnose
from runner.plan.torchrec_adapter.planning_loop import Progress, SearchLoopPlanner
from runner.plan.torchrec_adapter.shard_estimators import shard_estimators
from runner.plan.torchrec_adapter.torchrec_seam import planner_refusal

if TYPE_CHECKING:
    from torch import nn
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import Stats

    from runner.plan.spec import PlanChoices, PlanSpec

# what the planner outside the adapter reads of the balanced search, through this module only
__all__ = ["entries_of", "explain_planner_error", "plan_bound", "plan_with_runner", "runner_planner"]

Inputs = Tuple[Any, int, Dict[str, Any]]  # the topology, the per-rank batch and the tables' constraints


def runner_planner(spec: PlanSpec, inputs: Inputs, device_type: str, world_size: int,
                   estimates: Optional[Stats] = None, dense_tensor_bytes: Optional[int] = None, reuse: bool = False,
                   search_space: Optional[Tuple[List[ShardingOption], Enumerator]] = None,
                   progress: Optional[Progress] = None, choose_from: Optional[PlanChoices] = None) -> SearchLoopPlanner:
    """The runner's planner for ``spec`` (see :func:`runner.plan.planner.build_planner`)."""
    topology, batch, constraints = inputs
    kwargs = {"topology": topology, "batch_size": batch, "constraints": constraints,
              "estimator": shard_estimators(topology, constraints, spec.pipeline)}
    proposer = build_proposer(spec.proposer, spec.sharding, device_type, world_size)
    # the balanced search holds identical shards once; TorchRec's proposers get TorchRec's full options
    own = PROPOSERS[spec.proposer].own_planner  # the balanced search's planner
    if search_space is not None:
        enumerator: Any = FixedEnumerator(*search_space, **kwargs)
    elif reuse:
        enumerator = ReusingEnumerator(enumeration_key(spec, world_size, topology.local_world_size, device_type, batch),
                                       compact=own, progress=progress, **kwargs)
    else:
        enumerator = CompactEnumerator(compact=own, progress=progress, **kwargs)
    planner_class: Any = SearchLoopPlanner
    if own:
        proposer.choose_from = choose_from
        planner_class = functools.partial(BalancedPlanner, balanced=proposer)
        proposer = None  # the planner's own loop: TorchRec's default list is never run
    return planner_class(
        topology=topology,
        performance_model=step_perf_model(spec, device_type, world_size, topology.local_world_size),
        batch_size=batch,
        enumerator=enumerator,
        storage_reservation=build_storage_reservation(spec.sharding, topology, dense_tensor_bytes),
        proposer=proposer,
        constraints=constraints,
        stats=[estimates] if estimates is not None else None,
        debug=False,
        timeout_seconds=spec.sharding.planner_timeout_s,
        progress=progress,
    )


def explain_planner_error(exc: Exception, planner: Optional[EmbeddingShardingPlanner], spec: PlanSpec, world: int,
                          device_type: str, also: str = "") -> str:
    """One actionable line for a planner that found no plan (:mod:`.infeasible`); the planner's own first
    line when its state says nothing about memory. ``also``: the proposers tried after ``spec``'s."""
    found = diagnose(planner, spec, world, device_type, also)
    return found.line if found is not None else f"the planner found no plan: {first_line(exc) or type(exc).__name__}"


Replan = Callable[..., ShardingPlan]  # (spec, **runner_planner's keywords): the same job planned again


def _placeable_plan(planner: EmbeddingShardingPlanner, spec: PlanSpec, replan: Replan, progress: Optional[Progress],
                    notes: List[str]) -> Optional[ShardingPlan]:
    """Where TorchRec's dynamic-programming proposer found no plan: propose again without the options that
    have a shard no GPU can hold (:func:`.dp_proposer.placeable_only`); the plan (TorchRec-partitioned and
    rated) and a note on how it was found, or None."""
    proposer = planner._proposers[0] if len(planner._proposers) == 1 else None
    reserved = getattr(planner._storage_reservation, "_last_reserved_topology", None)
    space = planner._enumerator.last_stored_search_space
    if type(proposer) is not SkippingProposer or reserved is None or not space:  # the dynamic-programming one
        return None
    kept = placeable_only(space, reserved)
    if len(kept) == len(space) or {o.name for o in kept} != {o.name for o in space}:
        return None  # nothing to leave out, or a table with no placeable option: no plan fits
    try:
        plan = replan(spec, search_space=(kept, planner._enumerator), progress=progress)
    except Exception:  # noqa: BLE001 - still none: the first planner's state explains why
        return None
    notes.append(f"TorchRec's dynamic-programming proposer found no plan: each of its proposals held a shard no "
                 f"GPU can hold ({proposer.skipped_unplaceable} proposals); this plan was found by proposing "
                 f"again without the {len(space) - len(kept)} of {len(space)} sharding options that have such "
                 "a shard (partitioned and rated by TorchRec's planner)")
    return plan


def _next_proposers_plan(spec: PlanSpec, replan: Replan, name: str, notes: List[str]) -> Optional[ShardingPlan]:
    """Where a proposer found no packing while the tables fit: the one its declaration falls back to
    (``sharding.proposer=<name>``); the plan and a note, or None."""
    try:
        plan = replan(dataclasses.replace(spec, proposer=name))
    except Exception:  # noqa: BLE001 - none either: the first planner's state explains why
        return None
    notes.append(f"sharding.proposer={spec.proposer} found no packing (nor without the options no GPU "
                 f"can hold); this plan was found by the next proposer, sharding.proposer={name}")
    return plan


def plan_with_runner(spec: PlanSpec, model: nn.Module, world: int, device_type: str,
                     sharders: List[ModuleSharder[nn.Module]], estimates: Stats, reuse: bool, notes: List[str],
                     facts: PlanFacts, inputs: Inputs, progress: Optional[Progress] = None,
                     choose_from: Optional[PlanChoices] = None) -> Union[ShardingPlan, PlanError]:
    """The runner planner's plan, or a :class:`PlanError` (returned, so that it can be broadcast). ``facts`` gets
    where the plan came from (``plan_source``: ``runner`` or ``torchrec``; ``fallback``: the way it was found
    when the named proposer found none)."""
    from runner.plan.cost.topology import dense_bytes

    planner, dense = None, dense_bytes(model)

    def replan(other: PlanSpec, **kwargs: Any) -> ShardingPlan:
        return runner_planner(other, inputs, device_type, world, estimates, dense, **kwargs).plan(model, sharders)

    facts["planner"] = "runner"
    try:
        planner = runner_planner(spec, inputs, device_type, world, estimates, dense, reuse=reuse, progress=progress,
                                 choose_from=choose_from)
        plan = planner.plan(model, sharders)
        facts["plan_source"] = "torchrec"  # TorchRec's proposer's plan, unless the balanced search's own
        cut = getattr(planner, "cut_short", None)
        if isinstance(planner, BalancedPlanner) and planner.balanced.facts:
            searched = cast(PlanFacts, job_facts(planner.balanced.facts))
            facts.update(searched)
            cut = cut or searched["search"].get("cut_short")
            notes.append(balanced_note(planner.balanced.facts))
        if cut:
            facts["cut_short"] = cut
            notes.append(cut)
        return plan
    except (PlanError, ConfigError) as exc:  # already one line; rebuilt so that it pickles
        return PlanError(str(exc))
    except Exception as exc:  # PlannerError, and what TorchRec's planner raises; a bug of the runner's own raises
        if not planner_refusal(exc):
            raise
        if planner is None:
            return NoPlanFits(explain_planner_error(exc, planner, spec, world, device_type))
        found = _placeable_plan(planner, spec, replan, progress, notes)
        if found is not None:
            facts["fallback"] = "placeable_only"
        line = explain_planner_error(exc, planner, spec, world, device_type)
        why = diagnose(planner, spec, world, device_type)
        after = PROPOSERS[spec.proposer].falls_back_to
        if found is None and after and why and why.cause == NO_PACKING:
            found = _next_proposers_plan(spec, replan, after, notes)
            facts["fallback"] = after if found is not None else None
            line = explain_planner_error(exc, planner, spec, world, device_type, f" (then {after})")
        if found is not None:
            facts["plan_source"] = "torchrec"
        return found if found is not None else NoPlanFits(line)
