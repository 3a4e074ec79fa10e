"""Planning's typed inputs and outputs beside the plan. In: what planning reads of a job's config, read once
(:class:`PlanSpec`): the planner, its proposers, its estimates and its refusals take it, not the whole config. Out:
what planning found beside the plan (:class:`PlanFacts`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, TypedDict

if TYPE_CHECKING:
    from runner.config.schema import ClusterSchema, ModelSchema, PrecisionSchema, RunnerConfig, ShardingSchema
    from runner.config.tables import TableSpec


@dataclass(frozen=True)
class PlanSpec:
    """A plan's part of a job: the ``sharding``, ``cluster``, ``precision`` and ``model`` keys, the tables, and the
    values planning derives from the rest (the planner's batch, the data's pooling, the types the training step
    cannot take)."""

    mode: str
    sharding: ShardingSchema  # its ``proposer`` is :attr:`proposer`'s
    cluster: ClusterSchema  # its ``ddr_cap_gib`` is :attr:`ddr_cap_gib`'s
    precision: PrecisionSchema
    model: ModelSchema
    tables: List[TableSpec]
    rows: int  # rows per rank per optimizer step (``samples_per_step``)
    batch: int  # the planner's batch: ``sharding.planner_batch_size`` or ``rows``
    pooling: float  # ``data.ids_per_feature``: the planner's pooling factor
    excluded: Tuple[str, ...]  # sharding types no table the config leaves free may take (the split step's)
    accumulate: int  # ``train.grad_accumulation_steps``
    num_dense: int  # ``data.num_dense_features``
    pipeline: str  # TorchRec's ``PipelineType`` value of the step the job runs (runner.config.pipelines)
    enumerated: Dict[str, Any]  # the keys enumeration reads (:func:`runner.config.roles.enumerated`)
    proposer: str  # the proposer that plans: ``sharding.proposer``, or the one a proposer falls back to
    ddr_cap_gib: Optional[float]  # host memory per worker, GiB: ``cluster.ddr_cap_gib``, or what a host gives one

    def with_ddr_cap(self, gib: Optional[float]) -> "PlanSpec":
        """The same plan with ``gib`` of host memory per worker (the host memory a host gives each worker)."""
        if gib == self.ddr_cap_gib:
            return self
        tree = dict(self.enumerated)
        if "ddr_cap_gib" in tree.get("cluster", {}):  # enumeration's storage reads it: the reuse key follows
            tree["cluster"] = {**tree["cluster"], "ddr_cap_gib": gib}
        return dataclasses.replace(self, ddr_cap_gib=gib, enumerated=tree)


def plan_spec(cfg: RunnerConfig) -> PlanSpec:
    """``cfg``'s plan part (:class:`PlanSpec`)."""
    from runner.config import roles
    from runner.config.pipelines import planned_pipeline
    from runner.config.schema import resolved_mapping, samples_per_step, uses_split_step
    from runner.config.tables import table_specs

    rows = samples_per_step(cfg.train)
    return PlanSpec(str(cfg.mode), cfg.sharding, cfg.cluster, cfg.precision, cfg.model, table_specs(cfg.model), rows,
                    int(cfg.sharding.planner_batch_size or rows), float(cfg.data.ids_per_feature),
                    ("data_parallel",) if uses_split_step(cfg.train, cfg.precision) else (),
                    int(cfg.train.grad_accumulation_steps), int(cfg.data.num_dense_features),
                    planned_pipeline(cfg.train.pipeline, uses_split_step(cfg.train, cfg.precision)),
                    roles.enumerated(resolved_mapping(cfg)), str(cfg.sharding.proposer), cfg.cluster.ddr_cap_gib)


PlanChoices = Tuple[List[Dict[str, Any]], Dict[str, Any]]
"""A sweep planned together (:mod:`runner.launch.sweep.plan_together`): its plans, and what this point compared."""


class PlanFacts(TypedDict, total=False):
    """What :func:`runner.plan.planner.make_plan` found beside the plan: where it came from, how, and what it
    compares with. No decision reads a message's text; they read these."""

    planner: str  # "runner" (the runner's planner, through the TorchRec adapter) or "stock" (TorchRec's own)
    plan_source: str  # "runner" (the runner's own plan) or "torchrec" (a TorchRec proposer's); "pinned" by report
    fallback: Optional[str]  # how a plan was found where the named proposer found none: "placeable_only", a proposer
    lower_bound_ms: Optional[float]  # the bound on any plan's estimated step (torchrec_adapter/balanced/bound.py)
    lower_bound_kind: Optional[str]  # which bound is tight: mean rank, largest shard, LP relaxation, whole shards
    compared: Dict[str, float]  # TorchRec's plans' ratings, as the balanced proposer compared them
    torchrec: Dict[str, Optional[float]]  # the same, by proposer (None: no plan)
    skipped: Dict[str, int]  # TorchRec's proposers not tried as starts at this size, with the shards that decided it
    calibration: str  # the calibration file the plan's constants came from, or "none" (TorchRec's defaults)
    calibration_note: str  # the line that says which constants, and why
    step: Dict[str, Any]  # the whole step, per rank and its parts (step_estimate.whole_step); with a calibration
    cut_short: Optional[str]  # where the safety stop (sharding.planner_timeout_s) cut the search: what it did
    search: Dict[str, Any]  # the balanced search's work, rounds and why it stopped (torchrec_adapter/balanced/effort)
    bandwidths: Dict[str, float]  # the intra- and cross-node bandwidths (GiB/s) the plan was made with
    reserved_bytes: Optional[List[int]]  # bytes each rank's storage reservation kept free (HBM, or host memory on CPU)
