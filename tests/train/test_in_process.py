"""A 2-rank job (planned by the balanced proposer) in this test's own process tree, as TorchRec's golden example tests
itself: torch elastic's ``elastic_launch`` starts two gloo workers running the runner's worker entry on a composed,
resolved config; this process owns the job's MLflow run (:class:`MlflowRun`, as the driver does) in a real SQLite
store, and rank 0 reports to it through the run folder's event log. The fast tier's end-to-end check of every stage
(config -> plan -> DMP -> train -> evaluate -> track) without the CLI's start-up."""

from __future__ import annotations

from pathlib import Path

from conftest import cfg_for, launch_in_process
from mlflow.tracking import MlflowClient

import runner.cli  # noqa: F401  (schema and resolvers)
from runner.runtime import run_files

ROOT = Path(__file__).resolve().parents[2]


def test_two_ranks_train_plan_and_track_in_process(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = cfg_for("sharding.proposer=balanced", "+sharding.constraints.t0.sharding_types=[row_wise,table_row_wise]",
                  "+sharding.constraints.t1.sharding_types=[column_wise,data_parallel]", "train.steps=40",
                  "train.log_every=10", "train.batch_size=64", "data.eval_batches=2", "train.threads_per_worker=1",
                  f"tracking.uri={uri}",
                  "tracking.experiment=in_process", "tracking.system_metrics=false", "cluster.cpu_affinity=none")
    run_folder = tmp_path / "run"
    launched, run_id, mlflow_run = launch_in_process(cfg, run_folder, uri, "in-process")
    results = launched
    assert mlflow_run.end("FINISHED")  # rank 0's reports delivered, the run ended
    rank0 = results[0]
    assert rank0["world_size"] == 2 and rank0["losses"][-1] < rank0["losses"][0], rank0["losses"]
    # the balanced proposer's plan: DMP trained it
    plan = run_files.read_json(run_folder / run_files.PLAN / "plan.json")
    types = {t["sharding_type"] for tables in plan.values() for t in tables.values()}
    assert len(types) >= 3 and "table_wise" in types, types  # t0 and t1 constrained, the rest free
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["sharding.proposer"] == "balanced" and run.data.params["train.steps"] == "40"
    assert set(run.data.tags["runner.sharding_types"].split(",")) == types and run.data.tags["runner.world_size"] == "2"
    assert run.data.tags["runner.plan_source"] == "runner" and "proposer=balanced" in run.data.tags["runner.plan_note"]
    assert 0 < run.data.metrics["plan/lower_bound_ms"] <= run.data.metrics["plan/est_step_ms"]
    losses = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "train/loss"), key=lambda m: m.step)]
    assert losses == rank0["losses"] and len(losses) == 4
    assert run.data.metrics["eval/auc"] > 0.5
    assert "plan/plan.json" in [a.path for a in client.list_artifacts(run.info.run_id, "plan")]
    # memory: each rank's held bytes over its baseline (taken once the plan is made) beside the plan's storage for
    # the rank and the dense part's state; the error is their ratio less one
    m = run.data.metrics
    for r in (0, 1):
        held, est = m[f"measured/rank{r}/mem_over_baseline_bytes"], m[f"estimated/rank{r}/mem_bytes"]
        assert held > 0 and est >= m[f"plan/rank{r}/ddr_bytes"] > 0
        assert m[f"error/rank{r}/mem"] == est / held - 1
    assert abs(m["error/mem"]) == max(abs(m["error/rank0/mem"]), abs(m["error/rank1/mem"]))
