"""Sweeps whose every point is answered: infeasible plans as answers, failed points from any launcher."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import FAST, run_cli, runs

pytestmark = pytest.mark.slow  # each test runs a whole sweep

# DLRM's six tables planned for 2 GPUs of 0.05 GiB (fixed reserve): 10% leaves room, 90% leaves none.
TIGHT_PLAN = ["mode=plan", "cluster.device=cuda", "cluster.hbm_cap_gib=0.05", "sharding.storage_reserve_policy=fixed",
              "sharding.compute_kernels=[fused]"]


def split(store: str, experiment: str) -> tuple:
    all_runs = runs(store, experiment)
    parents = [r for r in all_runs if r.data.tags.get("runner.kind") == "sweep"]
    children = sorted((r for r in all_runs if r.data.tags.get("runner.kind") == "job"),
                      key=lambda r: int(r.data.tags["runner.job"]))
    assert len(parents) == 1, [r.data.tags for r in all_runs]
    return parents[0], children


def test_plan_sweep_answers_an_infeasible_point(store: str, tmp_path: Path) -> None:
    proc = run_cli(["-m", *TIGHT_PLAN, "sharding.storage_reserve_percent=0.1,0.9", f"tracking.uri={store}",
                    "tracking.experiment=infeasible", f"hydra.sweep.dir={tmp_path}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no sharding plan fits in memory" in proc.stdout and "storage_reserve_percent=0.9" in proc.stdout
    parent, (fits, full) = split(store, "infeasible")
    assert parent.info.status == "FINISHED" and fits.info.status == "FINISHED" and full.info.status == "FINISHED"
    assert fits.data.tags["runner.plan_status"] == "feasible" and full.data.tags["runner.plan_status"] == "infeasible"
    assert "each of 2 ranks has" in full.data.tags["runner.plan_reason"]
    assert (fits.info.run_name, full.info.run_name) == ("reserve=0.1", "reserve=0.9")
    note = fits.data.tags["mlflow.note.content"]  # the command, then the plan as a short markdown table
    assert note.startswith("Job: `python -m runner ") and "| sharding type | tables | collectives |" in note
    assert "### Sharding plan: 2 ranks" in note and "Sharding plan" not in full.data.tags["mlflow.note.content"]
    assert parent.data.metrics["sweep/infeasible_points"] == 1 and parent.data.metrics["sweep/points"] == 2
    assert parent.data.tags["runner.best_run_id"] == fits.info.run_id
    rows = list(csv.DictReader((tmp_path / "report" / "points.csv").open()))
    assert [r["plan_status"] for r in rows] == ["feasible", "infeasible"]
    assert "no sharding plan fits" in rows[1]["reason"]
    assert [r["vs_first"] for r in rows] == ["(the first point)", "sharding.storage_reserve_percent=0.9"]
    assert "**infeasible**" in (tmp_path / "report" / "report.md").read_text()


def test_single_plan_job_with_no_plan_exits_0_with_the_reason(store: str, tmp_path: Path) -> None:
    proc = run_cli([*TIGHT_PLAN, "sharding.storage_reserve_percent=0.9", f"tracking.uri={store}",
                    "tracking.experiment=infeasible_one", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "plan done: no plan fits (no sharding plan fits in memory" in proc.stdout
    assert "warn" not in (proc.stdout + proc.stderr).lower(), proc.stdout + proc.stderr  # library noise: log file
    (run,) = runs(store, "infeasible_one")
    assert run.info.status == "FINISHED" and run.data.tags["runner.plan_status"] == "infeasible"


def test_joblib_sweep_with_a_failing_point_fails_the_parent(store: str, tmp_path: Path) -> None:
    proc = run_cli(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *TIGHT_PLAN,
                    f"sharding.plan=null,{tmp_path / 'missing.json'}", f"tracking.uri={store}",
                    "tracking.experiment=joblib_fail", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1 of 2 job(s) failed" in proc.stderr and "job 1: failed: plan error" in proc.stderr, proc.stderr[-2000:]
    parent, (ok, bad) = split(store, "joblib_fail")
    assert parent.info.status == "FAILED" and "job 1" in parent.data.tags["error"]
    assert ok.info.status == "FINISHED" and bad.info.status == "FAILED"


def test_concurrent_training_jobs_get_disjoint_cores(store: str, tmp_path: Path) -> None:
    import os


    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores to give two concurrent jobs one each")
    proc = run_cli(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *FAST, "train.steps=10",
                    "train.seed=1,2", f"tracking.uri={store}", "tracking.experiment=cores",
                    f"hydra.sweep.dir={tmp_path}"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, children = split(store, "cores")
    per_job = [{c for part in r.data.tags["runner.cpu_cores"].split("; ") for c in part.split(": ")[1].split(",")}
               for r in children]
    assert len(per_job) == 2 and "unbound" not in per_job[0] | per_job[1], per_job
    assert not per_job[0] & per_job[1], per_job  # no core shared between the two jobs


def test_a_plan_sweep_over_an_overlapping_grid_reuses_the_points_already_answered(store: str, tmp_path: Path) -> None:
    """sweep.reuse (on for plan-only points): a second sweep runs only its new points; the one planned before
    is linked to its earlier run (tag runner.reused_from, its metrics and plan status), and the report says so."""
    first = run_cli(["-m", *TIGHT_PLAN, "sharding.storage_reserve_percent=0.1,0.2", f"tracking.uri={store}",
                     "tracking.experiment=reuse", f"hydra.sweep.dir={tmp_path / 'a'}"])
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_cli(["-m", *TIGHT_PLAN, "sharding.storage_reserve_percent=0.2,0.3", f"tracking.uri={store}",
                      "tracking.experiment=reuse", f"hydra.sweep.dir={tmp_path / 'b'}"])
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.count(" reused: ") == 1 and "job 0 reused" in second.stdout, second.stdout[-2000:]
    jobs = [r for r in runs(store, "reuse") if r.data.tags.get("runner.kind") == "job"]
    assert len(jobs) == 4  # 2 + 2 points, one of them linked
    (earlier,) = [r for r in jobs if r.data.params["sharding.storage_reserve_percent"] == "0.2"
                  and "runner.reused_from" not in r.data.tags]
    (linked,) = [r for r in jobs if "runner.reused_from" in r.data.tags]
    assert linked.data.tags["runner.reused_from"] == earlier.info.run_id and linked.info.status == "FINISHED"
    assert linked.data.tags["runner.config_hash"] == earlier.data.tags["runner.config_hash"]
    assert linked.data.metrics["plan/est_step_ms"] == earlier.data.metrics["plan/est_step_ms"]
    assert linked.data.tags["runner.plan_status"] == earlier.data.tags["runner.plan_status"]
    rows = list(csv.DictReader((tmp_path / "b" / "report" / "points.csv").open()))
    assert [r["reused_from"] for r in rows] == [earlier.info.run_id, ""]
    assert f"reused: run {earlier.info.run_id}" in (tmp_path / "b" / "report" / "report.md").read_text()


def test_a_sweep_stops_after_max_failures_and_resume_runs_the_rest(store: str, tmp_path: Path) -> None:
    """sweep.max_failures=1 (issue 48, item 2): every point pins a plan file that is not there yet, so the first
    point fails and stops the sweep: no other point starts, the parent ends FAILED, the last line names the
    cause and the resume command. Once the file is there, resume runs the rest; each finished point says how
    far the sweep is (item 3). (With joblib, the points already started fail or stop too: docs/tracking.md.)"""
    pinned = tmp_path / "pinned.json"
    sweep = tmp_path / "sweep"
    args = ["-m", *TIGHT_PLAN, f"sharding.plan={pinned}",
            "sharding.storage_reserve_percent=0.1,0.15,0.2", "sweep.max_failures=1", f"tracking.uri={store}",
            "tracking.experiment=max_failures", f"hydra.sweep.dir={sweep}"]
    stopped = run_cli(args)
    assert stopped.returncode == 1, stopped.stdout[-2000:] + stopped.stderr[-2000:]
    last = stopped.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the sweep stopped after "), stopped.stderr[-2000:]
    assert "plan error" in last and str(pinned) in last and last.endswith(f"python -m runner resume {sweep}"), last
    statuses = {d.name: json.loads((d / "status.json").read_text()) for d in sweep.iterdir() if d.name.isdigit()}
    failed = [s for s in statuses.values() if s["status"] == "FAILED"]
    not_run = [s for s in statuses.values() if s["status"] == "KILLED" and s["error"].startswith("not run:")]
    assert len(failed) == 1 and len(not_run) == 2, statuses
    assert all("sweep.max_failures=1" in s["error"] for s in not_run)
    parent = [r for r in runs(store, "max_failures") if r.data.tags.get("runner.kind") == "sweep"]
    assert len(parent) == 1 and parent[0].info.status == "FAILED"
    _write_plan(pinned)  # the cause fixed
    resumed = run_cli(["resume", str(sweep)])
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    progress = [ln for ln in resumed.stdout.splitlines() if ln.startswith("[runner] sweep: ")]
    assert [ln.split(" done")[0] for ln in progress] == [f"[runner] sweep: {k} of 3" for k in range(1, 4)], progress
    assert all(", 0 failed" in ln and "plan done: " in ln for ln in progress), progress
    assert "left" in progress[0] and "left" not in progress[-1]
    statuses = [json.loads((d / "status.json").read_text())["status"] for d in sweep.iterdir() if d.name.isdigit()]
    assert statuses == ["FINISHED"] * 3


def _write_plan(path: Path) -> None:
    """A plan file of the tight DLRM point, as a run writes it (planned here, in this process)."""
    from conftest import cfg_for

    from runner.config.tables import table_specs
    from runner.plan.plan_file import plan_to_dict
    from runner.plan.planner import make_plan
    from runner.plan.spec import plan_spec
    from runner.train.models import planning_model

    cfg = cfg_for(*TIGHT_PLAN, "sharding.storage_reserve_percent=0.1")
    plan = make_plan(plan_spec(cfg), planning_model(cfg), 2, 2, "cuda")[0]
    path.write_text(json.dumps(plan_to_dict(plan, table_specs(cfg.model))))


def test_paired_axes_cross_with_others_refuse_unequal_lengths_and_resume(store: str, tmp_path: Path) -> None:
    """Issue 48, item 1: 2 paired values x 2 others = 4 points with the right overrides and run names; unequal
    lengths are one line; a resumed paired sweep runs only the points it lacks."""
    sweep = tmp_path / "sweep"
    args = ["-m", *TIGHT_PLAN, "cluster.cross_node_bandwidth=pair(3,12.5)",
            "sharding.storage_reserve_percent=pair(0.05,0.1)", "cluster.intra_node_bandwidth=30,600",
            f"tracking.uri={store}", "tracking.experiment=paired", f"hydra.sweep.dir={sweep}"]
    proc = run_cli(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    points = sorted((d for d in sweep.iterdir() if d.name.isdigit()), key=lambda d: int(d.name))
    pairs = [("3", "0.05"), ("12.5", "0.1")]
    wanted = [(b, r, i) for b, r in pairs for i in ("30", "600")]
    got = []
    for d in points:
        lines = [ln[2:] for ln in (d / ".hydra" / "overrides.yaml").read_text().splitlines()]
        found = {ln.split("=")[0]: ln.split("=")[1] for ln in lines if "=" in ln}
        got.append((found["cluster.cross_node_bandwidth"], found["sharding.storage_reserve_percent"],
                    found["cluster.intra_node_bandwidth"]))
    assert got == wanted, got
    _, children = split(store, "paired")
    assert [c.info.run_name for c in children] == [f"xbw={float(b)} reserve={r} ibw={float(i)}" for b, r, i in wanted]
    assert json.loads((sweep / "sweep.json").read_text())["points"] == 4
    report = (sweep / "report" / "report.md").read_text()
    assert "Swept: cluster.cross_node_bandwidth + sharding.storage_reserve_percent (paired), " in report, report[:400]
    assert "[runner] sweep: 4 of 4 done, 0 failed" in proc.stdout

    from runner.config.paired import rewrite
    from runner.launch.sweep.precheck import precheck

    error, _ = precheck(["-m", *TIGHT_PLAN, *rewrite(["cluster.cross_node_bandwidth=pair(3,12.5)",
                                                      "sharding.storage_reserve_percent=pair(0.05,0.1,0.2)"])])
    assert error is not None and "\n" not in error, error  # the command's pre-check: one line, before anything runs
    assert "cluster.cross_node_bandwidth, sharding.storage_reserve_percent" in error
    assert "pair() of 2 and of 3 values" in error

    (points[3] / "status.json").unlink()  # a point as a stopped sweep leaves it: never finished
    resumed = run_cli(["resume", str(sweep)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.count(" kept: it finished before") == 3, resumed.stdout[-3000:]
    ran = [ln for ln in resumed.stdout.splitlines() if ln.startswith("[runner] sweep: ")]  # planned, or reused
    assert len(ran) == 1 and "| job 3" in ran[0], ran


def test_a_reserve_sweep_in_gib_says_the_bytes_each_rank_kept_free_and_charts_heatmaps(store: str,
                                                                                       tmp_path: Path) -> None:
    """Issue 77 item 2: a grid over an absolute reserve (fixed_absolute, GiB per GPU) and a bandwidth. Each point's
    row of points.csv and report.md says the bytes its reservation kept free on each rank, as its run's metric
    plan/reserved_bytes_per_rank; the reserve that leaves no room is an answer; the grid is charted as heatmaps and
    the parent run carries the chart."""
    from mlflow.tracking import MlflowClient

    from runner.launch.sweep.sweep_chart import grid_of
    from runner.launch.sweep.sweep_report import load_points, swept_keys

    proc = run_cli(["-m", *TIGHT_PLAN, "sharding.storage_reserve_policy=fixed_absolute",
                    "sharding.storage_reserve_gib=0.01,0.045", "cluster.intra_node_bandwidth=30,600",
                    f"tracking.uri={store}", "tracking.experiment=gib", f"hydra.sweep.dir={tmp_path}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    parent, children = split(store, "gib")
    rows = {r["job"]: r for r in csv.DictReader((tmp_path / "report" / "points.csv").open())}
    for c in children:
        row = rows[c.data.tags["runner.job"]]
        if float(c.data.params["sharding.storage_reserve_gib"]) == 0.045:  # 0.005 GiB left of 0.05: no plan
            assert c.data.tags["runner.plan_status"] == "infeasible" and row["reserved_bytes_per_rank"] == ""
            continue
        kept = c.data.metrics["plan/reserved_bytes_per_rank"]
        assert kept == int(0.01 * 2**30) and row["reserved_bytes_per_rank"] == str(int(kept)), (kept, row)
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| kept free per rank GiB |" in report and report.count("| 0.010 |") == 2, report[:1500]
    points = load_points(tmp_path)
    assert grid_of(points, swept_keys(points)) is not None  # a grid: drawn as heatmaps
    charts = [a.path for a in MlflowClient(store).list_artifacts(parent.info.run_id, "report")]
    assert "report/estimates.png" in charts, charts
