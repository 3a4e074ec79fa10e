"""``mode=calibrate`` on 2 CPU ranks with the small grid, in this test's own process tree (as
``test_in_process.py`` runs a training job): every rank measures, rank 0 writes a calibration that loads, matches
this machine, is kept for ``cluster.calibration=auto`` and is logged to a real MLflow store."""

from __future__ import annotations

from pathlib import Path

from conftest import cfg_for, launch_in_process
from mlflow.tracking import MlflowClient

import runner.cli  # noqa: F401  (schema and resolvers)
from runner.plan.cost import calibration as cal_mod
from runner.plan.cost.fit import REUSE_ROWS
from runner.runtime.hardware import fingerprint, mismatch
from runner.track.reporter import summary_line


def test_calibrate_on_two_ranks_writes_keeps_and_logs_a_calibration(store: str, tmp_path: Path) -> None:
    uri = store  # the session's store (a new SQLite store's migrations cost seconds)
    keep = tmp_path / "calibrations"
    cfg = cfg_for("mode=calibrate", "calibrate.grid=small", "calibrate.repeats=3", "calibrate.max_spread=0.99",
                  "calibrate.max_message_mib=1", "train.batch_size=128", f"cluster.calibration_dir={keep}",
                  f"tracking.uri={uri}", "tracking.experiment=calibrate", "tracking.system_metrics=false",
                  "cluster.cpu_affinity=none", "train.threads_per_worker=1")
    run_folder = tmp_path / "run"
    launched, run_id, mlflow_run = launch_in_process(cfg, run_folder, uri, "calibrate")
    results = launched[0]
    assert mlflow_run.end("FINISHED")
    assert results["mode"] == "calibrate" and any(results["trusted"].values()) and results["kept"], results
    cal = cal_mod.load_calibration(results["file"])
    assert mismatch(cal.fingerprint, fingerprint("cpu", 1, 2), world_matters=True) is None
    c = cal.constants
    assert c["device_bw_gibps"] > 0 and c["bwd_compute_multiplier"] > 0
    # None where the all-to-all's time did not grow with the bytes (3 sizes to 1 MiB): then not trusted, and said
    assert c["intra_node_bandwidth"] is None or c["intra_node_bandwidth"] > 0
    assert cal.trusted["collectives"] or "not trusted: collectives" in results["headline"]
    assert set(c["collectives"]) == {"all_to_all", "all_reduce", "reduce_scatter", "all_gather"}
    assert set(c["sharded"]) == {"table_wise", "row_wise", "data_parallel"}
    assert c["sharded"]["table_wise"]["fwd"]["fixed_ms"] > 0
    # each family at 64 samples, the job's and 16x it (its cost per table and sample read over the batches jobs use);
    # 64 tables at 64 alone
    assert {kind: {n: sorted(b) for n, b in by_tables.items()} for kind, by_tables in
            cal.measurements["sharded"].items()} == {kind: {1: [64, 128, 2048], 8: [64, 128, 2048], 64: [64]}
                                                     for kind in ("table_wise", "row_wise", "data_parallel")}
    # the dense rate the step estimate uses, from square layers (64 and 256 wide in the small grid, 0.0003 to 0.017
    # GFLOP, the size most of the time); the whole dense part's own slope at 32-128 samples is a quarter of its time
    # and may fit to 0 on a busy machine
    assert c["linear_bwd"]["ms_per_gflop"] > 0 and c["linear_fwd"]["ms_per_gflop"] > 0
    assert c["dense_bwd"]["fixed_ms"] > 0 and c["dense_bwd"]["ms_per_gflop"] >= 0
    assert 0 <= c["bwd_row_share"] <= 1
    # the small grid's 8 shapes, and 4 over a table whose ids repeat its rows (the backward's share per row)
    assert sum(k["rows"] == REUSE_ROWS for k in cal.measurements["kernels"]) == 4
    assert len(cal.measurements["kernels"]) == 12 and len(cal.measurements["collectives"]["all_to_all"]["intra"]) == 3
    # the tiny-table job's step at each batch its overhead is fitted over (the small grid: a quarter and the batch)
    assert set(cal.measurements["step"]) == {32, 128} and all(v > 0 for v in cal.measurements["step"].values())
    assert c["step_overhead"]["fixed_ms"] >= 0 and c["step_overhead"]["ms_per_ksample"] >= 0
    # ... and in every family at the batch, in interleaved rounds (the small grid: 3): each family's overhead
    # beyond the cheapest's
    assert {k: len(v) for k, v in cal.measurements["step_family"].items()} == {
        "table_wise": 3, "row_wise": 3, "data_parallel": 3}
    family = c["step_overhead"]["family_ms"]
    assert set(family) == {"table_wise", "row_wise", "data_parallel"} and min(family.values()) == 0.0
    # the dense part in lockstep at the batch and 4x, 3 rounds on both ranks: how much the step's compute waits for
    # the slowest rank
    lockstep = cal.measurements["lockstep"]
    assert set(lockstep) == {128, 512} and all(len(m["slowest_mean_ms"]) == 3 and len(m["own_median_ms"]) == 2
                                               for m in lockstep.values())
    # each call's slowest time is the largest of the ranks' times of that call, so its mean is at least every rank's
    # own mean (not its median: a round of scattered calls can have a median above the slowest's mean)
    assert all(s >= max(r[i] for r in m["own_mean_ms"]) - 1e-5 for m in lockstep.values()
               for i, s in enumerate(m["slowest_mean_ms"])), lockstep
    assert c["rank_wait"]["factor"] >= 1.0 and c["rank_wait"]["per_call_ms"] >= 0.0
    # kept where cluster.calibration=auto looks, and chosen by it for this machine's 1 x 2 job
    from runner.plan.cost.choice import for_job

    chosen = for_job(cfg.cluster, "cpu", True)
    assert chosen.calibration is not None and chosen.calibration.path == results["kept"]
    run = MlflowClient(uri).get_run(run_id)
    assert run.data.metrics["calibration/device_bw_gibps"] == c["device_bw_gibps"]
    assert run.data.tags["runner.calibration_file"] == results["file"]
    artifacts = {a.path for a in MlflowClient(uri).list_artifacts(run_id, "calibration")}
    assert {"calibration/calibration.yaml", "calibration/report.md", "calibration/calibration.png",
            "calibration/calibration_torchrec.py"} <= artifacts  # the last: TorchRec's own terms (torchrec_export)
    report = (run_folder / "calibration" / "report.md").read_text()
    assert "| constant | measured here | TorchRec's default |" in report
    assert "The step's overhead (the tiny-table job beyond its parts): " in report and "table_wise +" in report
    assert f"Ranks waiting for each other: x{c['rank_wait']['factor']:.3f} on the step's compute" in report
    line = summary_line({**results, "run_id": run_id, "tracking_uri": uri})
    assert line.startswith("[runner] calibration done") and results["kept"] in line
    assert "trusted: " in line and "the next plan here (cluster.calibration=auto) uses it" in line
    assert "| part | spread of the repeats | median known to | trusted |" in report
