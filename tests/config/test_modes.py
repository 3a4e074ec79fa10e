"""The modes' and sweepers' declarations (runner/config/modes.py, runner/config/sweepers.py), in-process: every
mode the schema allows is declared, with functions that import; every sweeper target the runner meets resolves to
its declaration, and one it does not declare is refused in one line naming the key."""

from __future__ import annotations

import dataclasses

import pytest

import runner.cli  # noqa: F401  (schema and resolvers)
from runner.config.choices import allowed_values
from runner.config.errors import ConfigError
from runner.config.modes import DEFAULT, MODES
from runner.config.parts import part
from runner.config.schema import RunnerConfig
from runner.config.sweepers import CHECKED_SWEEPER, OPTUNA_SWEEPER, RUNNER_SWEEPERS, SWEEPERS, sweeper_of
from runner.launch.sweep.precheck import precheck


def test_every_mode_the_schema_allows_is_declared_with_functions_that_import() -> None:
    (field,) = [f for f in dataclasses.fields(RunnerConfig) if f.name == "mode"]
    allowed, _ = allowed_values(field)
    assert set(allowed) == set(MODES) and field.default == DEFAULT in MODES
    for name, mode in MODES.items():
        assert mode.name == name
        for spec in (mode.drives, mode.works, mode.reports):
            assert spec is None or callable(part(spec)), (name, spec)
    assert {n for n, m in MODES.items() if m.on_workers} == {n for n, m in MODES.items() if m.works is not None}


def test_every_sweeper_target_resolves_to_its_declaration() -> None:
    (hydras,) = RUNNER_SWEEPERS
    assert sweeper_of(hydras) is sweeper_of(CHECKED_SWEEPER) and sweeper_of(CHECKED_SWEEPER).grid
    optuna = sweeper_of(OPTUNA_SWEEPER)
    assert not optuna.grid and optuna.previews is not None and callable(part(optuna.previews))
    for sweeper in SWEEPERS.values():
        assert sweeper.previews is None or callable(part(sweeper.previews))
    with pytest.raises(ConfigError, match=r"hydra\.sweeper\._target_='some\.Other' is not allowed; expected one of"):
        sweeper_of("some.Other")


def test_the_pre_check_refuses_a_sweeper_the_runner_does_not_declare() -> None:
    error, _ = precheck(["-m", "mode=plan", "train.seed=1,2", "hydra.sweeper._target_=some.Other"])
    assert error is not None and error.startswith("hydra.sweeper._target_='some.Other' is not allowed"), error
