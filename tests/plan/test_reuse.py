"""A plan-only sweep reuses enumerated options across points, and gets what a fresh planner call gets."""

from __future__ import annotations

from test_planning import cfg_for

from runner.config.tables import table_specs
from runner.plan.analysis import per_rank_estimates
from runner.plan.plan_file import plan_to_dict
from runner.plan.planner import make_plan
from runner.plan.spec import plan_spec
from runner.plan.torchrec_adapter.enumeration_reuse import enumeration_key
from runner.train.models import planning_model

BASE = ["model=dnn_many", "model.generated_tables.count=24", "cluster=gpu_2x8", "train.batch_size=512",
        "sharding.compute_kernels=[fused,dense]"]
POINTS = [  # the first primes the cache; the others differ only in what a sweep moves
    ["cluster.cross_node_bandwidth=12.5", "sharding.storage_reserve_percent=0.15"],
    ["cluster.cross_node_bandwidth=0.5", "sharding.storage_reserve_percent=0.15"],
    ["cluster.cross_node_bandwidth=0.5", "sharding.storage_reserve_percent=0.5", "sharding.proposer=greedy"],
    ["cluster.intra_node_bandwidth=30", "sharding.storage_reserve_percent=0.3",
     "sharding.proposer=dynamic_programming"],
]


def planned(cfg, model, reuse: bool) -> tuple:
    plan, best, _, _ = make_plan(plan_spec(cfg), model, 16, 8, "cuda", reuse=reuse)
    return plan_to_dict(plan, table_specs(cfg.model)), per_rank_estimates(best, 16)


def test_reused_enumeration_gives_the_fresh_planners_plan_and_estimates() -> None:
    cfgs = [cfg_for(*BASE, *p) for p in POINTS]
    assert len({enumeration_key(plan_spec(c), 16, 8, "cuda", 512) for c in cfgs}) == 1  # one enumeration for all points
    model = planning_model(cfgs[0])
    planned(cfgs[0], model, reuse=True)
    seen = set()
    for cfg in cfgs[1:]:
        reused, fresh = planned(cfg, model, reuse=True), planned(cfg, model, reuse=False)
        assert reused[0] == fresh[0]
        assert reused[1] == fresh[1]  # identical, not close
        seen.add(str(reused[1]))
    assert len(seen) >= 2  # the points really differ: the check above compared something


def test_key_changes_with_what_enumeration_reads() -> None:
    base = enumeration_key(plan_spec(cfg_for(*BASE)), 16, 8, "cuda", 512)
    for other in (["sharding.types=[table_wise]"], ["cluster.hbm_cap_gib=40"], ["model.generated_tables.count=25"]):
        assert enumeration_key(plan_spec(cfg_for(*BASE, *other)), 16, 8, "cuda", 512) != base, other
    assert enumeration_key(plan_spec(cfg_for(*BASE)), 32, 8, "cuda", 512) != base
