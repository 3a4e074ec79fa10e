"""The runner's Optuna sweeper (hydra/sweeper=optuna, Optuna 5): a plan-only study telling infeasible trials as a
violated constraint and resumed from its journal; asynchronous trials with a multi-objective study's Pareto front;
a median pruner stopping a training trial on its eval AUC."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import FAST, run_cli
from test_sweeps import TIGHT_PLAN, split

pytestmark = pytest.mark.slow  # each test runs a whole study


def test_optuna_plan_study_returns_the_objective_and_tells_infeasible_trials_as_a_violated_constraint(
        store: str, tmp_path: Path) -> None:
    """6 DLRM tables on 2 GPUs of 0.05 GiB: reserves above about 0.55 leave no room, about half the interval. Such
    a trial's job answers (its run FINISHED, the worst value returned, as with the basic sweeper); the study holds
    it COMPLETE with Optuna's constraint ``plan_fits`` violated (in the journal), and counts it apart from failures
    (in its summary and the parent run)."""
    import yaml

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
    fits = {int(c.data.tags["runner.job"]): c.data.tags["runner.plan_status"] == "feasible" for c in children}
    _assert_constraints(tmp_path, fits)
    infeasible = list(fits.values()).count(False)
    kept = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert (kept["trials"], kept["feasible"], kept["infeasible"], kept["failed"]) == (5, 5 - infeasible, infeasible, 0)
    assert (f"5 trial(s): {5 - infeasible} with a plan, {infeasible} infeasible (no plan fits: told as the violated "
            "constraint plan_fits), 0 failed") in proc.stdout
    assert parent.data.metrics["sweep/infeasible_points"] == infeasible and parent.data.metrics[
        "sweep/failed_points"] == 0

    # resumed: the study (kept in the sweep folder) had a trial still running when it stopped (made here as a
    # sweep stopped at its worst moment leaves one: asked, its overrides not kept with it yet); it runs again in
    # its own job folder with the command's overrides (its run in the same store), the result is told to it, and
    # the finished trials count toward n_trials
    study, made = _study_with_an_interrupted_trial(tmp_path)
    resumed = run_cli(["resume", str(tmp_path), "hydra.sweeper.n_trials=7"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "6 trial(s) there (1 interrupted, run again); 1 more to run" in resumed.stdout, resumed.stdout[-2000:]
    assert "trial 5 was interrupted before its overrides were kept with it" in resumed.stdout
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
    # the rerun trial, told on resume, carries its constraint as the others do
    _assert_constraints(tmp_path, {int(c.data.tags["runner.job"]): c.data.tags["runner.plan_status"] == "feasible"
                                   for c in children})


def _assert_constraints(sweep: Path, fits: dict) -> None:
    """Every trial of the study carries Optuna's constraint ``plan_fits``: 1.0 (violated) where its job found no
    plan, 0.0 where it found one; the journal holds it, as Optuna's ``set_constraint`` writes it."""
    study = _study(sweep)
    assert {t.number: t.constraints for t in study.trials} == {n: {"plan_fits": 0.0 if ok else 1.0}
                                                               for n, ok in fits.items()}
    journal = (sweep / "optuna_journal.log").read_text()
    assert journal.count('"constraints:plan_fits"') == len(fits), journal[-2000:]
    best = study.best_trial  # Optuna's: among the trials whose constraints hold
    assert fits[best.number] and best.value == min(t.value for t in study.trials if fits[t.number])


def test_optuna_trials_run_asynchronously_and_a_multi_objective_study_keeps_its_pareto_front(
        store: str, tmp_path: Path) -> None:
    """Two trials at once (joblib's processes), a slow one (1,600 tables) and a fast one (10): the sweeper asks for
    the third as soon as either has been told, while the other still runs (Hydra's batches would wait for both);
    the study has two objectives (estimated step, memory), and what it prints and keeps as its Pareto front is the
    non-dominated set of its trials.

    Both what the sweeper does, read from the study's journal (when each trial was asked for and told), and what
    the pool did, read from the runs (the fast one ended first, the third began before the slow one ended). Not
    when each run began: on a loaded machine a pool process may still be importing when its trial comes
    (measured 2026-11-28 with two busy processes beside the study: the 1,600-table job's run began 3.1 s after the
    10-table one had ended, in the pool's other process, and still ended last)."""
    import optuna
    import yaml

    from runner.launch.sweep.study import journal_storage

    proc = run_cli(["-m", "experiment=plan_many_tables", "cluster=gpu_4x8", "cluster.nodes=16",
                    "model.generated_tables.count=choice(10,1600)", "hydra/sweeper=optuna",
                    "hydra/sweeper/sampler=grid", "hydra.sweeper.n_trials=3", "hydra.sweeper.n_jobs=2",
                    "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweeper.direction=[minimize,minimize]",
                    "tracking.objective.more_metrics=[plan/max_mem_bytes]", f"tracking.uri={store}",
                    "tracking.experiment=async", f"hydra.sweep.dir={tmp_path}"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, children = split(store, "async")
    assert len(children) == 3 and all(c.info.status == "FINISHED" for c in children)
    count = {int(c.data.tags["runner.job"]): int(c.data.params["model.generated_tables.count"]) for c in children}
    assert sorted(count.values())[0] == 10 and sorted(count.values())[-1] == 1600  # the grid gave both at first
    first, second, later = optuna.load_study(study_name="runner", storage=journal_storage(tmp_path)).trials
    assert {first.params["model.generated_tables.count"], second.params["model.generated_tables.count"]} == {10, 1600}
    told = sorted([first.datetime_complete, second.datetime_complete])
    assert max(first.datetime_start, second.datetime_start) < told[0], "the first two trials were not out at once"
    assert told[0] <= later.datetime_start < told[1], "the third trial waited for both of the first two (a batch)"
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
    study.ask(fixed_distributions=first.distributions)  # the sweep stopped before it kept the trial's overrides
    return study, study.trials[-1]
