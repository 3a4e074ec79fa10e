"""Every sharding type trains on CPU/gloo; pinned plans; plan-only runs; sweep reports."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import FAST, metric_history, run_cli, runs, stderr_lines

pytestmark = pytest.mark.slow

WIDE = ["model.embedding_dim=256", "model.dense_arch_layer_sizes=[256]"]  # real column splits
OPTIONS = {"columnwise": "column_wise", "tablecolumnwise": "table_column_wise", "tablerowwise": "table_row_wise",
           "gridshard": "grid_shard", "dataparallel": "data_parallel"}


def plan_of(run_folder: Path) -> dict:
    return json.loads((run_folder / "plan" / "plan.json").read_text())


def types_of(plan: dict) -> set:
    return {p["sharding_type"] for tables in plan.values() for p in tables.values()}


@pytest.fixture(scope="module")
def trained_sweep(store: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One sweep over the sharding options not trained elsewhere (2 workers: one node's row splits)."""
    sweep = tmp_path_factory.mktemp("sharding_sweep")
    proc = run_cli(["-m", *FAST, "train.steps=20", *WIDE, "train.checkpoint.enabled=false",
                    "sharding=" + ",".join(OPTIONS), f"tracking.uri={store}", "tracking.experiment=types",
                    f"hydra.sweep.dir={sweep}"], timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep


def test_every_sharding_type_trains_on_cpu(store: str, trained_sweep: Path) -> None:
    children = [r for r in runs(store, "types") if r.data.tags.get("runner.kind") == "job"]
    assert len(children) == len(OPTIONS)
    for child in children:
        option = child.data.tags["runner.choice.sharding"]
        run_folder = Path(child.data.tags["runner.run_dir"])
        assert types_of(plan_of(run_folder)) == {OPTIONS[option]}, option
        assert child.info.status == "FINISHED"
        assert child.data.tags["runner.sharding_types"] == OPTIONS[option]
        losses = metric_history(store, child.info.run_id, "train/loss")
        assert len(losses) == 2 and all(0 < x < 2 for x in losses)
        assert child.data.metrics["measured/step_ms"] > child.data.metrics["measured/rank0/embedding_fwd_ms"] > 0
        assert child.data.metrics["measured/rank1/faults_per_step"] >= 0  # every rank's, beside its step
        assert "ratio/step_measured_over_estimated" in child.data.metrics or option == "dataparallel"


def test_pinned_plan_is_reused_exactly(store: str, trained_sweep: Path, tmp_path: Path) -> None:
    source = next(d for d in trained_sweep.iterdir() if d.is_dir() and d.name.isdigit()
                  and types_of(plan_of(d)) == {"grid_shard"})
    proc = run_cli([*FAST, "train.steps=10", *WIDE, "sharding=auto",
                    f"sharding.plan={source / 'plan' / 'plan.json'}", f"tracking.uri={store}",
                    "tracking.experiment=pinned", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert plan_of(tmp_path) == plan_of(source)
    (run,) = runs(store, "pinned")
    assert run.data.metrics["plan/pinned"] == 1.0


def test_pinned_plan_for_a_bigger_world_fails_in_one_line(store: str, tmp_path: Path) -> None:
    planned = run_cli(["mode=plan", "cluster=2node", "sharding=rowwise", f"tracking.uri={store}",
                       "tracking.experiment=pinned_bad", f"hydra.run.dir={tmp_path / 'plan4'}"])
    assert planned.returncode == 0, planned.stderr[-3000:]
    proc = run_cli([*FAST, f"sharding.plan={tmp_path / 'plan4' / 'plan' / 'plan.json'}", f"tracking.uri={store}",
                    "tracking.experiment=pinned_bad", f"hydra.run.dir={tmp_path / 'train2'}"])
    assert proc.returncode != 0
    err = [ln for ln in stderr_lines(proc.stderr) if ln.startswith("error:")]
    assert len(err) == 1 and "sharding.plan=" in err[0] and "this job has 2 ranks" in err[0], proc.stderr[-2000:]


def test_plan_only_for_16_gpus_runs_no_worker(store: str, tmp_path: Path) -> None:
    proc = run_cli(["mode=plan", "cluster=gpu_2x8", f"tracking.uri={store}", "tracking.experiment=plan16",
                    f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "train:" not in proc.stderr and "[runner] plan done:" in proc.stdout
    ranks = {s["rank"] for tables in plan_of(tmp_path).values() for p in tables.values() for s in p["shards"]}
    assert max(ranks) >= 8  # ranks of the second node: no local worker could have held them
    (run,) = runs(store, "plan16")
    assert run.info.status == "FINISHED"
    assert run.data.tags["runner.world_size"] == "16" and run.data.tags["runner.device"] == "cuda"
    assert run.data.metrics["plan/est_step_ms"] > 0 and "plan/rank15/hbm_bytes" in run.data.metrics
    assert "plan/max_cross_node_bytes" in run.data.metrics
    assert not (tmp_path / "errors").exists() and not (tmp_path / "measured.json").exists()
    assert (tmp_path / "plan" / "plan.png").stat().st_size > 10_000


def test_plan_sweep_report_matches_children(store: str, tmp_path: Path) -> None:
    proc = run_cli(["-m", "experiment=plan_many_tables", "cluster.cross_node_bandwidth=0.5,12.5", "sweep.reuse=false",
                    f"tracking.uri={store}", "tracking.experiment=report", f"hydra.sweep.dir={tmp_path}"],
                   timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the balanced proposer's points planned together: each job took the best of the sweep's plans
    assert "[runner] planned the sweep's 2 points together" in proc.stdout
    assert proc.stdout.count("[runner] sweep: ") == 2, proc.stdout[-3000:]  # one line per point (notes: in runs)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    all_runs = runs(store, "report")
    (parent,) = [r for r in all_runs if r.data.tags.get("runner.kind") == "sweep"]
    children = {r.info.run_id: r for r in all_runs if r.data.tags.get("runner.kind") == "job"}
    assert len(children) == 2
    assert all("this sweep's points found when planned together" in c.data.tags["runner.plan_note"]
               for c in children.values())
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "report")} == {
        "report/points.csv", "report/report.md", "report/estimates.png"}
    rows = list(csv.DictReader(open(client.download_artifacts(parent.info.run_id, "report/points.csv"))))
    assert len(rows) == 2
    child_types = {}
    for row in rows:  # each row is exactly its child's logged plan
        plan = json.load(open(client.download_artifacts(row["run_id"], "plan/plan.json")))
        types = {t: p["sharding_type"] for tables in plan.values() for t, p in tables.items()}
        assert {t: row[t] for t in types} == types
        assert float(row["est_step_ms"]) == pytest.approx(children[row["run_id"]].data.metrics["plan/est_step_ms"])
        child_types[row["cluster.cross_node_bandwidth"]] = types
    flipped = {t for t in child_types["0.5"] if child_types["0.5"][t] != child_types["12.5"][t]}
    report = open(client.download_artifacts(parent.info.run_id, "report/report.md")).read()
    assert f"changed between feasible points ({len(flipped)})" in report
    assert all(f"| {t} |" in report for t in flipped)
    # per swept key, each flip with the values it happened between
    assert f"## What changes with cluster.cross_node_bandwidth ({len(flipped)})" in report
    assert all(f"cross_node_bandwidth 0.5 -> 12.5: {t} (" in report for t in flipped)
