"""End to end: real worker processes (CPU + gloo), the real planner and DMP, a real MLflow store."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import FAST, ROOT, finished_run, metric_history, run_cli, runs, stderr_lines

pytestmark = pytest.mark.slow


def plan_types(run_folder: Path) -> dict[str, str]:
    plan = json.loads((run_folder / "plan" / "plan.json").read_text())
    return {t: p["sharding_type"] for tables in plan.values() for t, p in tables.items()}


def test_default_job_trains_and_logs_everything(store: str, tmp_path: Path) -> None:
    proc = run_cli([*FAST, "train.steps=60", f"tracking.uri={store}", "tracking.experiment=e2e",
                    f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = [ln for ln in proc.stdout.splitlines() if ln.startswith("[runner] done:")]
    assert len(summary) == 1 and "eval AUC" in summary[0] and "samples/s" in summary[0]
    assert "mlflow ui --backend-store-uri" in summary[0]

    (run,) = runs(store, "e2e")
    assert run.info.status == "FINISHED"
    assert run.info.run_id in summary[0]
    p = run.data.params
    assert p["train.steps"] == "60" and p["cluster.workers_per_node"] == "2"
    assert p["sharding.storage_reserve_percent"] == "0.15" and p["optimizer.sparse"] == "rowwise_adagrad"
    assert run.data.tags["runner.world_size"] == "2"
    assert run.data.tags["runner.agent_prewarmed"] == "true"  # node 0's agent imported torch meanwhile
    # each worker bound to its own half of the cores this test may use (unbound on a 1-core machine)
    cores = sorted(os.sched_getaffinity(0))
    half = len(cores) // 2
    expected = ("; ".join(f"rank{r}: {','.join(map(str, cores[r * half:(r + 1) * half]))}" for r in range(2))
                if half else "rank0: unbound; rank1: unbound")
    assert run.data.tags["runner.cpu_cores"] == expected
    losses = metric_history(store, run.info.run_id, "train/loss")
    assert len(losses) == 6 and losses[-1] < losses[0], losses
    assert run.data.metrics["eval/auc"] > 0.6
    assert run.data.metrics["train/avg_samples_per_s"] > 0

    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    # stamped when rank 0 measured them (its event log's times), not when the driver delivered them
    hist = sorted(client.get_metric_history(run.info.run_id, "train/loss"), key=lambda m: m.step)
    stamps = [m.timestamp for m in hist]
    assert all(a < b for a, b in zip(stamps, stamps[1:], strict=False)), stamps
    events = [json.loads(ln) for ln in (tmp_path / "events.jsonl").read_text().splitlines()]
    measured = {e["step"]: e["time"] for e in events if "train/loss" in e.get("metrics", {})}
    assert [measured[m.step] for m in hist] == stamps
    assert run.info.start_time <= stamps[0] and stamps[-1] <= run.info.end_time
    top = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"resolved.yaml", ".hydra", "plan"} <= top
    plan_files = {a.path for a in client.list_artifacts(run.info.run_id, "plan")}
    assert {"plan/plan.json", "plan/plan.txt", "plan/estimates.json"} <= plan_files
    # the logged plan is the one the workers used
    logged = json.loads(Path(client.download_artifacts(run.info.run_id, "plan/plan.json")).read_text())
    assert logged == json.loads((tmp_path / "plan" / "plan.json").read_text())
    types_tag = set(run.data.tags["runner.sharding_types"].split(","))
    assert types_tag == set(plan_types(tmp_path).values())


def test_tablewise_bf16_puts_every_table_whole_on_one_rank(store: str, tmp_path: Path) -> None:
    proc, run = finished_run(store, "tw", tmp_path, [*FAST, "sharding=tablewise", "precision=bf16"])
    assert run.data.params["precision.autocast"] == "bfloat16"
    losses = metric_history(store, run.info.run_id, "train/loss")
    assert losses[-1] < losses[0], losses
    types = plan_types(tmp_path)
    assert len(types) == 6 and set(types.values()) == {"table_wise"}
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    for tables in plan.values():
        for p in tables.values():
            assert len(p["shards"]) == 1 and len(p["ranks"]) == 1


def test_2node_rowwise_runs_four_workers(store: str, tmp_path: Path) -> None:
    proc = run_cli([*FAST, "cluster=2node", "sharding=rowwise", f"tracking.uri={store}",
                    "tracking.experiment=rw2", f"hydra.run.dir={tmp_path}", "tracking.system_metrics_interval_s=1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    types = plan_types(tmp_path)
    assert len(types) == 6 and set(types.values()) == {"row_wise"}
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    for tables in plan.values():
        for p in tables.values():  # rows split over all 4 ranks
            assert sorted(s["rank"] for s in p["shards"]) == [0, 1, 2, 3]
    (run,) = runs(store, "rw2")
    assert run.info.status == "FINISHED"
    assert run.data.tags["runner.world_size"] == "4"
    assert run.data.tags["runner.local_world_size"] == "2"
    assert run.data.tags["runner.nodes"] == "2"
    # MLflow's context tags (Source, User, Git commit columns) and a Description with the command
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert run.data.tags["mlflow.source.type"] == "LOCAL" and run.data.tags["mlflow.user"]
    assert run.data.tags["mlflow.source.name"].endswith("runner/__main__.py")
    assert not head or run.data.tags["mlflow.source.git.commit"] == head
    assert run.data.tags["mlflow.note.content"].startswith("Job: `python -m runner train.steps=30")
    assert str(tmp_path) in run.data.tags["mlflow.note.content"]
    # system metrics, with the node in their names (2 nodes), sampled while it ran
    from mlflow.tracking import MlflowClient

    cpu = MlflowClient(store).get_metric_history(run.info.run_id, "system/node_0/cpu_utilization_percentage")
    assert len(cpu) >= 2 and all(0 <= m.value <= 100 for m in cpu)
    assert "system/node_0/system_memory_usage_megabytes" in run.data.metrics
    # its data as inputs: synthetic, identified by the generator's settings (the default job's are the same)
    inputs = {d.tags[0].value: d.dataset for d in run.inputs.dataset_inputs}
    assert (inputs["train"].name, inputs["eval"].name) == ("synthetic-train", "synthetic-eval")
    assert '"label_noise": "0.5"' in inputs["train"].source and inputs["train"].digest != inputs["eval"].digest
    # four workers on this host: bound to one core each only when the host has four
    bound = [part.split(": ")[1] for part in run.data.tags["runner.cpu_cores"].split("; ")]
    if len(os.sched_getaffinity(0)) < 4:
        assert bound == ["unbound"] * 4
    else:
        assert len(set(bound)) == 4


def test_sweep_has_one_parent_and_a_child_per_job(store: str, tmp_path: Path) -> None:
    """A training sweep of two swept keys taken together (``pair()``: two points): one parent run, a child per
    point named after its values, the swept values on the parent."""
    proc = run_cli(["-m", *FAST, "train.steps=10", "cluster.intra_node_bandwidth=pair(100,600)",
                    "sharding.storage_reserve_percent=pair(0.1,0.3)", f"tracking.uri={store}",
                    "tracking.experiment=sweep", f"hydra.sweep.dir={tmp_path}"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    all_runs = runs(store, "sweep")
    parents = [r for r in all_runs if r.data.tags.get("runner.kind") == "sweep"]
    children = [r for r in all_runs if r.data.tags.get("runner.kind") == "job"]
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    assert parent.data.tags["mlflow.note.content"].startswith("Sweep: `python -m runner -m ")
    assert all(c.data.tags["mlflow.source.type"] == "LOCAL" for c in [parent, *children])
    points = {(c.data.params["cluster.intra_node_bandwidth"],
               c.data.params["sharding.storage_reserve_percent"]) for c in children}
    assert points == {("100.0", "0.1"), ("600.0", "0.3")}
    # each child is named after its point; the parent holds the swept values and what the sweep found
    assert {c.info.run_name for c in children} == {"ibw=100.0 reserve=0.1", "ibw=600.0 reserve=0.3"}
    assert all(c.data.tags["runner.sweep.sharding.storage_reserve_percent"] == c.data.params[
        "sharding.storage_reserve_percent"] for c in children)
    assert parent.data.metrics["sweep/points"] == 2 and parent.data.metrics["sweep/failed_points"] == 0
    # each point's agent loaded torch before its point began: the first while the sweep started, the next one
    # while the point before it ended
    assert [c.data.tags["runner.agent_prewarmed"] for c in children] == ["true"] * 2
    assert parent.info.run_name == f"sweep ibw x reserve ({tmp_path.name})", parent.info.run_name
    assert parent.data.params["sweep.cluster.intra_node_bandwidth"] == "100,600"
    assert parent.data.params["sweep.sharding.storage_reserve_percent"] == "0.1,0.3"


def test_cuda_training_without_cuda_fails_in_one_line(store: str, tmp_path: Path) -> None:
    proc = run_cli([*FAST, "cluster.device=cuda", f"tracking.uri={store}", "tracking.experiment=nocuda",
                    f"hydra.run.dir={tmp_path}"])
    assert proc.returncode != 0
    err = [ln for ln in stderr_lines(proc.stderr) if ln.startswith("error:")]
    assert len(err) == 1 and "cluster.device" in err[0] and "mode=plan" in err[0], proc.stderr[-2000:]
    (run,) = runs(store, "nocuda")
    assert run.info.status == "FAILED"
