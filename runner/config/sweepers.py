"""The runner's sweepers (runner/launch/plugins/hydra_plugins/runner_launcher/): the grid sweeper in place of
Hydra's, for a sweep the pre-check composed and validated point by point (the pre-check names it in
``hydra.sweeper._target_``; a sweep's recorded command leaves that out); ``hydra/sweeper=optuna``
(conf/hydra/sweeper/optuna.yaml) names the runner's Optuna sweeper itself."""

CHECKED_SWEEPER = "hydra_plugins.runner_launcher.basic_sweeper.CheckedBasicSweeper"
OPTUNA_SWEEPER = "hydra_plugins.runner_launcher.optuna_sweeper.OptunaSweeper"
RUNNER_SWEEPERS = {"hydra._internal.core_plugins.basic_sweeper.BasicSweeper": CHECKED_SWEEPER}
