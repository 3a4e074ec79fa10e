"""The runner's sweepers (runner/launch/plugins/hydra_plugins/runner_launcher/), each in place of Hydra's: the
grid sweeper for a sweep the pre-check composed and validated point by point, the Optuna sweeper whose study
lives in the sweep folder and resumes. The pre-check names them (``hydra.sweeper._target_=...``); a sweep's
recorded command leaves that out."""

CHECKED_SWEEPER = "hydra_plugins.runner_launcher.basic_sweeper.CheckedBasicSweeper"
RESUMING_OPTUNA = "hydra_plugins.runner_launcher.optuna_sweeper.ResumingOptunaSweeper"
RUNNER_SWEEPERS = {"hydra._internal.core_plugins.basic_sweeper.BasicSweeper": CHECKED_SWEEPER,
                   "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper": RESUMING_OPTUNA}
