"""The runner's greedy search gives TorchRec's answers: the same plans and per-rank estimates as TorchRec's own
planner with its two greedy proposers, at points where the skips are taken and where no plan fits."""

from __future__ import annotations

import pytest
from conftest import cfg_for
from torchrec.distributed.planner.types import PlannerError

from runner.config.tables import table_specs
from runner.plan.analysis import per_rank_estimates
from runner.plan.cost.topology import dense_bytes
from runner.plan.plan_file import plan_to_dict
from runner.plan.planner import PlanEstimates, build_planner, torchrec_planner
from runner.plan.sharders import sharders_for
from runner.plan.spec import plan_spec
from runner.plan.torchrec_adapter.greedy_proposers import SkippingGreedyProposer
from runner.train.models import planning_model

BASE = ["model=dnn_many", "model.generated_tables.count=16", "cluster=gpu_2x8", "train.batch_size=512",
        "sharding.compute_kernels=[fused,dense]", "sharding.proposer=greedy"]
POINTS = [("1.0", "0.3"), ("12.5", "0.7"), ("50", "0.15"), ("12.5", "0.98")]  # the last: no plan


def test_greedy_plans_and_estimates_equal_torchrecs() -> None:
    model, seen, infeasible, skipped = None, set(), 0, 0
    for bandwidth, reserve in POINTS:
        cfg = cfg_for(*BASE, f"cluster.cross_node_bandwidth={bandwidth}", f"sharding.storage_reserve_percent={reserve}")
        model = model or planning_model(cfg)
        estimates, theirs = PlanEstimates(), PlanEstimates()
        planner = build_planner(plan_spec(cfg), 16, 8, "cuda", estimates, dense_bytes(model))
        proposer = planner._proposers[0]
        assert isinstance(proposer, SkippingGreedyProposer)
        torchrec = torchrec_planner(plan_spec(cfg), 16, 8, "cuda", theirs, dense_bytes(model))
        try:
            ours = plan_to_dict(planner.plan(model, sharders_for(cfg.precision)), table_specs(cfg.model))
        except PlannerError:
            with pytest.raises(PlannerError):  # no plan for TorchRec's own proposers either
                torchrec.plan(model, sharders_for(cfg.precision))
            infeasible += 1
            continue
        finally:
            skipped += proposer.skipped
        plan = torchrec.plan(model, sharders_for(cfg.precision))
        assert ours == plan_to_dict(plan, table_specs(cfg.model)), (bandwidth, reserve)
        assert per_rank_estimates(estimates.best_plan, 16) == per_rank_estimates(theirs.best_plan, 16)
        seen.add(str(ours))
    assert len(seen) >= 2 and infeasible == 1 and skipped > 0, (len(seen), infeasible, skipped)
