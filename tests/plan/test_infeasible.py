"""No plan fits: one actionable line for every proposer and both causes, from the real planner's state."""

from __future__ import annotations

import pytest
from test_planning import cfg_for, plan_for

from runner.config.errors import PlanError

PROPOSERS = ["default", "dynamic_programming", "greedy", "grid_search", "uniform"]
# 2 GPUs of 0.02 GiB, fixed 5% reserve: DLRM's t0 (100000 x 64 fp32, ~25 MB) fits on no single GPU whole,
# its six tables (~48 MB) not on both together.
TIGHT = ["cluster.device=cuda", "cluster.hbm_cap_gib=0.02", "sharding.storage_reserve_policy=fixed",
         "sharding.storage_reserve_percent=0.05", "sharding.compute_kernels=[fused]"]


def refusal(*overrides: str) -> str:
    with pytest.raises(PlanError) as e:
        plan_for(cfg_for(*TIGHT, *overrides), 2, 2, "cuda")
    msg = str(e.value)
    assert "\n" not in msg and "cluster.hbm_cap_gib=0.02" in msg and "storage_reserve_percent=0.05" in msg, msg
    assert "each of 2 ranks has 0.02 GiB of HBM for tables" in msg, msg
    return msg


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_a_table_larger_than_one_rank_is_named_with_its_size(proposer: str) -> None:
    msg = refusal(f"sharding.proposer={proposer}", "sharding.types=[table_wise]")
    assert "table t0 (100000 x 64) needs at least 0.02 GiB of HBM on one rank" in msg, msg
    assert "table_wise, fused" in msg and "row_wise" in msg, msg  # the option it tried, and the way out


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_tables_larger_than_the_cluster_give_the_total_and_the_capacity(proposer: str) -> None:
    msg = refusal(f"sharding.proposer={proposer}", "sharding.types=[row_wise]")
    assert "all 6 tables need at least 0.05 GiB of HBM" in msg and "the cluster has 0.04 GiB" in msg, msg
    assert "the largest, t0 (100000 x 64)" in msg, msg


def test_the_same_tables_plan_when_the_cap_allows() -> None:
    plan, _ = plan_for(cfg_for(*TIGHT, "cluster.hbm_cap_gib=0.2", "sharding.types=[table_wise]"), 2, 2, "cuda")
    assert {p["sharding_type"] for tables in plan.values() for p in tables.values()} == {"table_wise"}
