"""Issue 79, item 3: an Optuna study that goes on keeps its definition. A changed direction, objective metric or
search space is refused in one line naming each change and how to start a new study (exit 2); a changed sampler,
pruner, n_trials or n_jobs is said in one line and kept. In-process: the sweep's config composed by Hydra's own
``compose`` (``hydra/sweeper=optuna``), a real Optuna study in a journal file, the sweeper's own check."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List

import pytest
from conftest import ROOT

# the swept keys as a command gives them (the sweeper's arguments; hydra.sweeper.params would be read the same)
SPACE = ["sharding.storage_reserve_percent=interval(0.05,0.5)", "sharding.proposer=choice(greedy,dynamic_programming)"]


def sweep_cfg(*overrides: str) -> Any:
    """The config the runner's Optuna sweeper is given (``hydra.*`` included) for a plan-only study."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import runner.cli  # noqa: F401  (schema, resolvers, the runner's Hydra plugins on the path)

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", return_hydra_config=True,
                       overrides=["hydra/sweeper=optuna", "mode=plan", *overrides])


def go_on(folder: Path, *overrides: str, space_args: List[str] = SPACE) -> Any:
    """What the sweeper does as the study is loaded (or made) from ``folder``'s journal: the study, checked."""
    import optuna

    from runner.launch.sweep.study import journal_storage, keep_or_refuse, search_space

    cfg = sweep_cfg(*overrides)
    space, _ = search_space(dict(cfg.hydra.sweeper.params), space_args)
    direction = cfg.hydra.sweeper.direction
    directions: List[str] = [direction] if isinstance(direction, str) else list(direction)
    study = optuna.create_study(study_name="runner", storage=journal_storage(folder), directions=directions,
                                load_if_exists=True)
    keep_or_refuse(study, cfg.hydra.sweeper, cfg.tracking.objective, str(cfg.mode), space, str(folder))
    return study


def refused(capsys: pytest.CaptureFixture, folder: Path, *overrides: str, space_args: List[str] = SPACE) -> str:
    with pytest.raises(SystemExit) as ended:
        go_on(folder, *overrides, space_args=space_args)
    assert ended.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: the Optuna study 'runner' in ") and "\n" not in err, err
    assert "hydra.sweeper.study_name=<a new name>" in err and "hydra.sweep.dir=" in err
    return err


def test_a_changed_definition_is_refused_and_a_changed_way_of_running_is_said(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import optuna

    from runner.launch.sweep.study import search_space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = go_on(tmp_path)  # a new study: its definition kept in it
    space, _ = search_space({}, SPACE)
    study.tell(study.ask(fixed_distributions=space), 1.0)  # a trial, as the sweeper asks for one
    assert capsys.readouterr().out == ""
    go_on(tmp_path)  # the same command: nothing said
    assert "optuna" not in capsys.readouterr().out

    err = refused(capsys, tmp_path, "hydra.sweeper.direction=maximize")
    assert "hydra.sweeper.direction minimize -> maximize" in err
    err = refused(capsys, tmp_path, "tracking.objective.metric=plan/max_mem_bytes")
    assert "plan/est_step_ms -> plan/max_mem_bytes" in err
    err = refused(capsys, tmp_path, space_args=["sharding.storage_reserve_percent=interval(0.1,0.5)",
                                                "train.batch_size=choice(64,128)"])
    assert "sharding.storage_reserve_percent interval(0.05, 0.5) -> interval(0.1, 0.5)" in err
    assert "search key sharding.proposer removed (was choice(greedy, dynamic_programming))" in err
    assert "search key train.batch_size added (choice(64, 128))" in err
    err = refused(capsys, tmp_path, space_args=[SPACE[0], "sharding.proposer=choice(greedy)"])
    assert "sharding.proposer choice(greedy, dynamic_programming) -> choice(greedy)" in err
    assert len(optuna.load_study(study_name="runner", storage=study._storage).trials) == 1  # left as it was

    go_on(tmp_path, "hydra/sweeper/sampler=random", "hydra/sweeper/pruner=median", "hydra.sweeper.n_trials=30",
          "hydra.sweeper.n_jobs=2")
    out = capsys.readouterr().out.strip()
    assert out.startswith("[runner] optuna: study 'runner' goes on with sampler TPESampler -> RandomSampler; "
                          "pruner none -> MedianPruner; n_trials 20 -> 30; n_jobs 1 -> 2") and "\n" not in out, out
    go_on(tmp_path, "hydra/sweeper/sampler=random", "hydra/sweeper/pruner=median", "hydra.sweeper.n_trials=30",
          "hydra.sweeper.n_jobs=2")
    assert capsys.readouterr().out == ""  # the new settings were kept: said once


def test_a_study_made_before_its_definition_was_kept_is_checked_by_what_optuna_kept(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A journal from before this check (no definition in the study): its directions and its trials'
    distributions are what it is checked against."""
    import optuna
    from optuna.distributions import FloatDistribution

    from runner.launch.sweep.study import journal_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    old = optuna.create_study(study_name="runner", storage=journal_storage(tmp_path), direction="minimize")
    old.tell(old.ask({"sharding.storage_reserve_percent": FloatDistribution(0.05, 0.5)}), 1.0)
    err = refused(capsys, tmp_path, "hydra.sweeper.direction=maximize")
    assert "hydra.sweeper.direction minimize -> maximize" in err
    assert "search key sharding.proposer added (choice(greedy, dynamic_programming))" in err
    assert "objective metric" not in err  # unknown for such a study: not compared
