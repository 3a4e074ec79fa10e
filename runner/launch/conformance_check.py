"""The conformance check of the installed TorchRec against the runner's planner (what
:mod:`runner.plan.torchrec_adapter.conformance` runs once per stack, in a subprocess of its own).

On a small built-in problem (24 tables of several sizes on 2 x 8 GPUs, every GPU kernel): the compact enumeration
equal to TorchRec's own enumerator and estimators shard by shard (size, offset, storage, perf), then each
TorchRec-named proposer's plan and per-rank estimates equal to TorchRec's planner with its own proposer (grid
search on 3 tables, where TorchRec's searches every combination). About 5 s here.

``python -m runner.launch.conformance_check`` prints the outcome in one line (exit 1 on a difference).
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any, List, Tuple, cast

from runner.config.proposers import PROPOSERS
from runner.plan.torchrec_adapter.conformance import CHECKING

if TYPE_CHECKING:
    from torch import nn

    from runner.plan.plan_spec import PlanSpec

_TABLES = 24
_POINT = ("experiment=plan_many_tables", f"model.generated_tables.count={_TABLES}", "cluster=gpu_2x8",
          "sharding.compute_kernels=[]", "+sharding.constraints.g001.cache_load_factor=0.3",
          "cluster.calibration=none")  # TorchRec's own constants: the answers compared are TorchRec's
# the proposers whose plans are TorchRec's, each checked at the extra keys its declaration gives
_PROPOSED = {n: p.check_at for n, p in PROPOSERS.items() if p.torchrecs_answer and p.stock}


def _compose(*overrides: str) -> Any:
    from hydra import compose

    from runner.config.schema import register_schemas
    from runner.config.validation import validate
    from runner.launch.sweep.precheck import hydra_conf

    register_schemas()
    with hydra_conf():
        cfg = compose(config_name="config", overrides=list(overrides))
    validate(cast(Any, cfg))
    return cfg


def _enumeration_differences(spec: PlanSpec, model: nn.Module, world: int, local: int) -> List[str]:
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

    from runner.plan.planner import planner_inputs
    from runner.plan.sharders import sharders_for
    from runner.plan.torchrec_adapter.compact_enumeration import CompactEnumerator, expand_all
    from runner.plan.torchrec_adapter.shard_estimators import shard_estimators

    topology, batch, constraints = planner_inputs(spec, world, local, "cuda", None)
    sharders = sharders_for(spec.precision)

    def kwargs() -> Any:
        return {"topology": topology, "batch_size": batch, "constraints": constraints,
                "estimator": shard_estimators(topology, constraints, spec.pipeline)}
    theirs = EmbeddingEnumerator(**kwargs()).enumerate(model, sharders)
    ours = expand_all(CompactEnumerator(compact=True, **kwargs()).enumerate(model, sharders))
    if len(ours) != len(theirs):
        return [f"the compact enumeration has {len(ours)} options, TorchRec's {len(theirs)}"]
    for mine, full in zip(ours, theirs, strict=True):
        key = (full.fqn, full.sharding_type, full.compute_kernel)
        if (mine.fqn, mine.sharding_type, mine.compute_kernel) != key:
            return [f"the compact enumeration's options are not TorchRec's ({mine.fqn} where TorchRec has {key})"]
        shards = [(s.size, s.offset, s.storage, s.perf) for s in mine.shards]
        if shards != [(s.size, s.offset, s.storage, s.perf) for s in full.shards]:
            return [f"the compact enumeration's shards of {' '.join(key)} differ from TorchRec's"]
    return []


def _proposer_differences(world: int, local: int, proposers: Tuple[str, ...]) -> List[str]:
    from runner.config.tables import table_specs
    from runner.plan.analysis import per_rank_estimates
    from runner.plan.plan_file import plan_to_dict
    from runner.plan.plan_spec import plan_spec
    from runner.plan.planner import PlanEstimates, build_planner, torchrec_planner
    from runner.plan.sharders import sharders_for
    from runner.plan.topology import dense_bytes
    from runner.train.models import planning_model

    out = []
    for name in proposers:
        cfg = _compose(*_POINT, f"sharding.proposer={name}", *_PROPOSED[name])
        model, sharders, specs = planning_model(cfg), sharders_for(cfg.precision), table_specs(cfg.model)
        answers: List[Any] = []
        for build in (build_planner, torchrec_planner):
            estimates = PlanEstimates()
            try:
                plan = build(plan_spec(cfg), world, local, "cuda", estimates, dense_bytes(model)).plan(model, sharders)
                answers.append((plan_to_dict(plan, specs), per_rank_estimates(estimates.best_plan, world)))
            except Exception as exc:  # noqa: BLE001  (no plan is an answer too; it must be the same one)
                answers.append(("no plan", type(exc).__name__))
        if answers[0] != answers[1]:
            out.append(f"the {name} proposer's plan differs from TorchRec's own")
    return out


def failures(proposers: Tuple[str, ...] = tuple(_PROPOSED)) -> List[str]:
    """What differs between the runner's planner and TorchRec's on the built-in problem (the enumeration, then
    each of ``proposers``); empty when nothing."""
    from runner.plan.plan_spec import plan_spec
    from runner.train.models import planning_model

    cfg = _compose(*_POINT)
    world, local = cfg.cluster.nodes * cfg.cluster.workers_per_node, cfg.cluster.workers_per_node
    return (_enumeration_differences(plan_spec(cfg), planning_model(cfg), world, local)
            or _proposer_differences(world, local, proposers))


def main() -> int:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    os.environ[CHECKING] = "1"  # the planners built here are the runner's, whatever the version
    start = time.monotonic()
    try:
        found = failures()
    except Exception as exc:  # noqa: BLE001  (a TorchRec the adapter cannot even drive fails the check)
        found = [f"the runner's planner raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"]
    took = time.monotonic() - start
    if found:
        print(f"conformance check failed: {'; '.join(found)}", flush=True)
        return 1
    print(f"conformance check passed: the compact enumeration and the dynamic_programming, greedy, grid_search and "
          f"uniform proposers give TorchRec's answers ({_TABLES} tables on 16 GPUs, {took:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
