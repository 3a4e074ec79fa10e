"""A plan's summary (report.md's opening section and the plan/summary/* metrics) against the per-rank table it
sums: a real plan of 40 tables on 16 GPUs."""

from __future__ import annotations

import statistics

from test_planning import cfg_for

from runner.plan.planner import make_plan
from runner.plan.summary import COLUMNS, summary_markdown, summary_metrics
from runner.train.models import planning_model


def test_the_summary_is_what_the_per_rank_table_sums_to() -> None:
    cfg = cfg_for("mode=plan", "experiment=plan_many_tables", "model.generated_tables.count=40", "cluster=gpu_2x8")
    _plan, best, _, _ = make_plan(cfg, planning_model(cfg), 16, 8, "cuda")
    from runner.plan.analysis import per_rank_estimates

    ranks = per_rank_estimates(best, 16)
    m = summary_metrics(ranks, 8)
    for col in COLUMNS:
        values = [r[col] for r in ranks]
        assert (m[f"plan/summary/{col}_min"], m[f"plan/summary/{col}_median"], m[f"plan/summary/{col}_max"]) == (
            min(values), statistics.median(values), max(values))
    critical = int(m["plan/summary/critical_rank"])
    assert ranks[critical]["total_ms"] == max(r["total_ms"] for r in ranks) == m["plan/summary/total_ms_max"]
    parts = (m["plan/summary/critical_compute_ms"] + m["plan/summary/critical_forward_all_to_all_ms"]
             + m["plan/summary/critical_backward_all_to_all_ms"])
    assert abs(parts - ranks[critical]["total_ms"]) < 1e-9
    nodes = [sum(r["total_ms"] for r in ranks[:8]), sum(r["total_ms"] for r in ranks[8:])]
    assert m["plan/summary/busiest_node"] == float(nodes.index(max(nodes)))
    text = "\n".join(summary_markdown(ranks, 8))
    assert f"Estimated step {ranks[critical]['total_ms']:.3f} ms, set by rank {critical} (node {critical // 8})" in text
    assert f"| total ms | {min(r['total_ms'] for r in ranks):.3f} |" in text
    assert "No per-rank estimates" in "\n".join(summary_markdown([], 8))
