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

    from conftest import FAST

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


def test_optuna_plan_study_returns_the_objective_and_answers_infeasible_trials(store: str, tmp_path: Path) -> None:
    import json

    # 6 DLRM tables on 2 GPUs of 0.05 GiB: reserves above about 0.55 leave no room (those trials return +inf)
    proc = run_cli(["-m", "experiment=optuna_plan", "model=dlrm", "cluster=local", *TIGHT_PLAN,
                    "hydra.sweeper.n_trials=5", "sharding.storage_reserve_percent=interval(0.05,0.95)",
                    f"tracking.uri={store}", "tracking.experiment=optuna", f"hydra.sweep.dir={tmp_path}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    parent, children = split(store, "optuna")
    assert len(children) == 5 and all(c.info.status == "FINISHED" for c in children)
    values = {c.info.run_id: json.loads((tmp_path / c.data.tags["runner.job"] / "status.json").read_text())["objective"]
              for c in children}
    for c in children:  # each trial returned its plan's estimated step, or the worst value when no plan fits
        feasible = c.data.tags["runner.plan_status"] == "feasible"
        assert values[c.info.run_id] == (c.data.metrics["plan/est_step_ms"] if feasible else float("inf"))
    assert {c.data.params["sharding.proposer"] for c in children} <= {"dynamic_programming", "greedy"}
    assert 0 < list(values.values()).count(float("inf")) < 5  # the study met both answers (seeded sampler)
    best = min(values, key=values.get)
    assert parent.info.status == "FINISHED" and parent.data.tags["runner.best_run_id"] == best
    assert parent.data.metrics["sweep/best_est_step_ms"] == values[best]
    assert f"Best value: {values[best]}" in proc.stdout + proc.stderr

    # resumed: the study (kept in the sweep folder) had a trial still running when it stopped (made here as
    # the sweeper makes one: asked, with the sweep's fixed values); it runs again in its own job folder, the
    # result is told to it, and the finished trials count toward n_trials
    study, made = _study_with_an_interrupted_trial(tmp_path)
    resumed = run_cli(["resume", str(tmp_path), "hydra.sweeper.n_trials=7"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "6 trial(s) there (1 interrupted, run again); 1 more to run" in resumed.stdout, resumed.stdout[-2000:]
    study = _study(tmp_path)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 7
    again, children = split(store, "optuna")
    assert again.info.run_id == parent.info.run_id and again.info.status == "FINISHED" and len(children) == 7
    assert sorted(int(c.data.tags["runner.job"]) for c in children) == list(range(7))  # job number = trial number
    (rerun,) = [c for c in children if c.data.tags["runner.job"] == "5"]
    key = "sharding.storage_reserve_percent"
    assert float(rerun.data.params[key]) == made.params[key]  # the interrupted trial's own value
    status = json.loads((tmp_path / "5" / "status.json").read_text())
    assert study.trials[5].value == status["objective"]


def test_optuna_trials_run_asynchronously_and_a_multi_objective_study_keeps_its_pareto_front(
        store: str, tmp_path: Path) -> None:
    """Two trials at once (joblib's processes), a slow one (1,000 tables) and a fast one (10): the third trial
    starts as soon as the fast one ends, before the slow one has; the study has two objectives (estimated step,
    memory), and what it prints and keeps as its Pareto front is the non-dominated set of its trials."""
    import yaml

    proc = run_cli(["-m", "experiment=plan_many_tables", "cluster=gpu_4x8", "cluster.nodes=16",
                    "model.generated_tables.count=choice(10,1000)", "hydra/sweeper=optuna",
                    "hydra/sweeper/sampler=grid", "hydra.sweeper.n_trials=3", "hydra.sweeper.n_jobs=2",
                    "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweeper.direction=[minimize,minimize]",
                    "tracking.objective.more_metrics=[plan/max_mem_bytes]", f"tracking.uri={store}",
                    "tracking.experiment=async", f"hydra.sweep.dir={tmp_path}"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, children = split(store, "async")
    assert len(children) == 3 and all(c.info.status == "FINISHED" for c in children)
    count = {int(c.data.tags["runner.job"]): int(c.data.params["model.generated_tables.count"]) for c in children}
    assert sorted(count.values())[0] == 10 and sorted(count.values())[-1] == 1000  # the grid gave both at first
    slow, fast = sorted(children[:2], key=lambda c: -int(c.data.params["model.generated_tables.count"]))
    third = children[2]
    assert fast.info.end_time < slow.info.end_time, "the 10-table trial ended first"
    assert third.info.start_time < slow.info.end_time, "the third trial waited for the slow one (a batch)"
    values = {int(c.data.tags["runner.job"]): json.loads((tmp_path / c.data.tags["runner.job"] / "status.json")
                                                           .read_text())["objective"] for c in children}
    assert all(len(v) == 2 for v in values.values())
    for c in children:
        assert values[int(c.data.tags["runner.job"])] == [c.data.metrics["plan/est_step_ms"],
                                                          c.data.metrics["plan/max_mem_bytes"]]

    def dominated(a: list, b: list) -> bool:
        return all(y <= x for x, y in zip(a, b, strict=True)) and a != b

    front = {n for n, v in values.items() if not any(dominated(v, w) for w in values.values())}
    kept = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert {f["trial"] for f in kept["pareto_front"]} == front
    assert f"Pareto front of {len(front)} trial(s) (minimize x minimize)" in proc.stdout


def test_a_median_pruner_stops_the_training_trial_whose_eval_auc_is_below_the_median(store: str,
                                                                                     tmp_path: Path) -> None:
    """Two training trials, one after the other: one learns (sparse_lr 0.5), one cannot (every rate 1e-9). Each
    reports its eval AUC at its checkpoints (every 10 steps); the median pruner stops the second at the first
    checkpoint where its AUC is below the first's there: PRUNED in the study, its run FINISHED, tagged and said."""
    import optuna

    from runner.launch.sweep.study import journal_storage

    proc = run_cli(["-m", "hydra/sweeper=optuna", "hydra/sweeper/sampler=grid", "hydra.sweeper.sampler.seed=1",
                    "hydra/sweeper/pruner=median", "hydra.sweeper.pruner.n_startup_trials=1",
                    "hydra.sweeper.direction=maximize", "hydra.sweeper.n_trials=2", "optimizer=sgd_sgd",
                    "optimizer.dense_lr=1e-9", "optimizer.sparse_lr=choice(0.5,1e-9)", "model=dlrm", *FAST,
                    "train.checkpoint.every_steps=10", f"tracking.uri={store}", "tracking.experiment=pruned",
                    f"hydra.sweep.dir={tmp_path}"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = optuna.load_study(study_name="runner", storage=journal_storage(tmp_path))
    assert [t.state.name for t in study.trials] == ["COMPLETE", "PRUNED"], study.trials
    learned, pruned = study.trials
    assert learned.params["optimizer.sparse_lr"] == 0.5 and sorted(learned.intermediate_values) == [10, 20]
    # the median of one finished trial is its value: the pruned one went on while its AUC was not below it, and
    # stopped at the first checkpoint where it was
    at = max(pruned.intermediate_values)
    mine, theirs = pruned.intermediate_values, learned.intermediate_values
    assert at < 30 and mine[at] < theirs[at] and all(mine[s] >= theirs[s] for s in mine if s < at), (mine, theirs)
    _, children = split(store, "pruned")
    assert [c.info.status for c in children] == ["FINISHED", "FINISHED"]
    assert "runner.pruned_at_step" not in children[0].data.tags
    assert children[1].data.tags["runner.pruned_at_step"] == str(at)
    assert f"Optuna's pruner stopped this trial after step {at} of 30 (eval/auc {mine[at]:.4f}" in proc.stdout


def _study(sweep: Path):
    import optuna

    from runner.launch.sweep.study import journal_storage

    return optuna.load_study(study_name="reserve_and_proposer", storage=journal_storage(sweep))


def _study_with_an_interrupted_trial(sweep: Path) -> tuple:
    study = _study(sweep)
    first = study.trials[0]
    trial = study.ask(fixed_distributions=first.distributions)
    for key, value in first.user_attrs.items():
        trial.set_user_attr(key, value)
    return study, study.trials[-1]


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
    from runner.train.models import planning_model

    cfg = cfg_for(*TIGHT_PLAN, "sharding.storage_reserve_percent=0.1")
    plan = make_plan(cfg, planning_model(cfg), 2, 2, "cuda")[0]
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
