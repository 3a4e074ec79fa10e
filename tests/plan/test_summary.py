"""A plan's summary (report.md's opening section and the plan/summary/* metrics) against the per-rank table it
sums: a real plan of 40 tables on 16 GPUs."""

from __future__ import annotations

import statistics
from pathlib import Path

from test_planning import cfg_for

from runner.plan.planner import make_plan
from runner.plan.report import COLUMNS, summary_markdown, summary_metrics
from runner.plan.spec import plan_spec
from runner.train.models import planning_model


def test_the_summary_is_what_the_per_rank_table_sums_to() -> None:
    cfg = cfg_for("mode=plan", "experiment=plan_many_tables", "model.generated_tables.count=40", "cluster=gpu_2x8")
    _plan, best, _, _ = make_plan(plan_spec(cfg), planning_model(cfg), 16, 8, "cuda")
    from runner.plan.analysis import per_rank_estimates

    ranks = per_rank_estimates(best, 16)
    by_hand = [dict.fromkeys(ranks[0], 0.0) for _ in range(16)]  # shard by shard, in plan order: the same floats
    for option in best:
        for shard in option.shards:
            r, s, p = by_hand[shard.rank], shard.storage, shard.perf
            r["hbm_bytes"] += s.hbm
            r["ddr_bytes"] += s.ddr
            for key, value in (("fwd_compute_ms", p.fwd_compute), ("fwd_comms_ms", p.fwd_comms),
                               ("bwd_compute_ms", p.bwd_compute), ("bwd_comms_ms", p.bwd_comms),
                               ("total_ms", p.total)):
                r[key] += value
    assert ranks == by_hand and len({id(s.perf) for o in best for s in o.shards}) < sum(len(o.shards) for o in best)
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


def test_the_chart_reads_at_2048_ranks(tmp_path) -> None:
    """Ticks at a round step, never more than 8 an axis, at any size; beyond 64 ranks one bar per node (its largest
    memory and traffic, its busiest rank's step), so 2,048 ranks of 8 per node draw 256 bars."""
    from runner.plan.chart import MAX_TICKS, by_node, chart, ticks

    for count in (1, 6, 16, 63, 128, 1024, 2048, 5384):
        marks = ticks(count)
        assert marks[0] == 0 and marks[-1] < count and 1 <= len(marks) <= MAX_TICKS, count
        assert len({b - a for a, b in zip(marks, marks[1:], strict=False)}) <= 1, count
    ranks = [{"hbm_bytes": float(r % 8), "ddr_bytes": 0.0, "fwd_compute_ms": 1.0, "fwd_comms_ms": float(r % 8),
              "bwd_compute_ms": 2.0, "bwd_comms_ms": 1.0, "total_ms": 4.0 + r % 8} for r in range(2048)]
    comms = {"intra_node_bytes": [float(r) for r in range(2048)], "cross_node_bytes": [0.0] * 2048}
    nodes, traffic = by_node(ranks, comms, 8, "hbm_bytes")
    assert len(nodes) == 256 and all(n["hbm_bytes"] == 7.0 and n["fwd_comms_ms"] == 7.0 for n in nodes)
    assert traffic["intra_node_bytes"][3] == 31.0
    chart(ranks, comms, "cuda", tmp_path / "plan.png", "2048 ranks", local=8)
    assert (tmp_path / "plan.png").stat().st_size > 10_000


def test_a_run_logs_every_ranks_metrics_up_to_64_ranks_and_the_busiest_beyond() -> None:
    from runner.plan.report import BUSIEST_LOGGED, PlanReport

    def report(world: int) -> PlanReport:
        metrics = {f"plan/rank{r}/{k}": float((r * 37) % world)
                   for r in range(world) for k in ("total_ms", "hbm_bytes")}
        return PlanReport(Path("."), {}, {**metrics, "plan/est_step_ms": float(world - 1)}, {}, "")

    assert report(64).logged_metrics() == report(64).metrics
    logged = report(1024).logged_metrics()
    ranks = {int(k.split("/")[1][4:]) for k in logged if k.startswith("plan/rank")}
    busiest = sorted(range(1024), key=lambda r: -((r * 37) % 1024))[:BUSIEST_LOGGED]
    assert ranks == set(busiest) and "plan/est_step_ms" in logged
    assert all(f"plan/rank{r}/hbm_bytes" in logged for r in busiest)


def test_the_plan_table_gives_a_table_over_thousands_of_ranks_one_short_line() -> None:
    """Runs of ranks and of shards are written as ranges (a data-parallel table over 8,192 GPUs was a line of
    150,000 characters, and every line was padded to it: 800 MB for 20,000 tables); what they say is kept."""
    from runner.plan.plan_file import plan_table, rank_ranges

    assert rank_ranges([0, 1, 2, 5, 7, 8, 3]) == "0-2,5,7-8,3"
    world = 8192
    plan = {"ebc": {
        "dp": {"sharding_type": "data_parallel", "compute_kernel": "dense", "ranks": list(range(world)),
               "shards": [{"rank": r, "offsets": [0, 0], "sizes": [1000, 64]} for r in range(world)]},
        "rw": {"sharding_type": "row_wise", "compute_kernel": "fused", "ranks": list(range(4)),
               "shards": [{"rank": r, "offsets": [25 * r, 0], "sizes": [25, 64]} for r in range(3)]
               + [{"rank": 3, "offsets": [75, 0], "sizes": [20, 64]}]},
        "cw": {"sharding_type": "column_wise", "compute_kernel": "fused", "ranks": [9, 4],
               "shards": [{"rank": 9, "offsets": [0, 0], "sizes": [100, 32]},
                          {"rank": 4, "offsets": [0, 32], "sizes": [100, 32]}]}}}
    lines = plan_table(plan).splitlines()
    assert max(len(line) for line in lines) < 120
    dp, rw, cw = lines[2:]
    assert dp.split()[-2:] == ["0-8191", "r0-8191@0x0:1000x64"]
    assert rw.split()[-3:] == ["0-3", "r0-2@0x0..:25x64", "r3@75x0:20x64"]
    assert cw.split()[-3:] == ["9,4", "r9@0x0:100x32", "r4@0x32:100x32"]
