"""What planning reads of a job's config, read once (:class:`PlanSpec`): the planner, its proposers, its
estimates and its refusals take it, not the whole config."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

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

    def with_proposer(self, name: str) -> "PlanSpec":
        """The same plan by the proposer ``name`` (a proposer's fall-back)."""
        return dataclasses.replace(self, proposer=name)


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
