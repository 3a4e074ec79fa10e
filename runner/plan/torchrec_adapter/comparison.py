"""The runner's planner against TorchRec's own on the same inputs: what the conformance check
(:mod:`runner.launch.conformance_check`, run by :func:`.conformance.verdict` once per stack) compares on its
built-in problem: the compact enumeration shard by shard, then each TorchRec-named proposer's plan and per-rank
estimates."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List

if TYPE_CHECKING:
    from torch import nn

    from runner.plan.spec import PlanSpec


def enumeration_differences(spec: PlanSpec, model: nn.Module, world: int, local: int) -> List[str]:
    """The compact enumeration against TorchRec's own enumerator and estimators, shard by shard (size, offset,
    storage, perf), for ``spec`` on ``world`` CUDA ranks: one line on the first difference, else empty."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

    from runner.plan.planner import planner_inputs
    from runner.plan.sharders import sharders_for
    from runner.plan.torchrec_adapter.compact_enumeration import CompactEnumerator, expand_all
    from runner.plan.torchrec_adapter.shard_estimators import shard_estimators

    topology, batch, constraints = planner_inputs(spec, world, local, "cuda", None)
    sharders = sharders_for(spec.precision)

    def kwargs() -> Dict[str, Any]:
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


def proposer_differs(spec: PlanSpec, model: nn.Module, world: int, local: int) -> bool:
    """Whether the runner's planner and TorchRec's own, on ``spec``'s inputs, give another plan or other per-rank
    estimates (no plan is an answer too, and must be the same one)."""
    from runner.plan.analysis import per_rank_estimates
    from runner.plan.cost.topology import dense_bytes
    from runner.plan.plan_file import plan_to_dict
    from runner.plan.planner import PlanEstimates, build_planner, torchrec_planner
    from runner.plan.sharders import sharders_for

    sharders = sharders_for(spec.precision)
    answers: List[Any] = []
    for build in (build_planner, torchrec_planner):
        estimates = PlanEstimates()
        try:
            plan = build(spec, world, local, "cuda", estimates, dense_bytes(model)).plan(model, sharders)
            answers.append((plan_to_dict(plan, spec.tables), per_rank_estimates(estimates.best_plan, world)))
        except Exception as exc:  # noqa: BLE001
            answers.append(("no plan", type(exc).__name__))
    return answers[0] != answers[1]
