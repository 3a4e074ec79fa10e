"""Hydra's Optuna sweeper whose study lives in the sweep folder and resumes there (the pre-check names this
class in ``hydra.sweeper._target_`` for ``hydra/sweeper=optuna``).

- **Its storage.** Without ``hydra.sweeper.storage`` the study is kept in ``<sweep folder>/optuna_study.pkl``
  (:class:`runner.launch.sweep.study.SweepFolderStorage`: Optuna's in-memory storage, written again, whole and
  atomically, at each change; study name
  ``hydra.sweeper.study_name``, else ``runner``), so a stopped study can resume. (Optuna 2.10's SQL storage,
  the version hydra-optuna-sweeper 1.3 allows, fails on the SQLAlchemy 2 MLflow needs.)
- **Resume** (``python -m runner resume <sweep folder>``, or the same command with the same
  ``hydra.sweep.dir``): the study is loaded with the trials it has. A trial the stop interrupted (still
  RUNNING in the storage) runs again with its own values in its own job folder (job number = trial number)
  and its result is told to that trial; finished trials count toward ``n_trials``, so the study runs only
  the trials it still lacks, numbered on from the last (a seeded sampler seeded with its seed plus the
  number of trials there, so that it does not draw its first run's values again).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any, List

from hydra.utils import instantiate
from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper
from omegaconf import OmegaConf

DEFAULT_STUDY = "runner"
log = logging.getLogger(__name__)


class ResumingOptunaSweeper(OptunaSweeper):
    def sweep(self, arguments: List[str]) -> None:
        import optuna  # here, not at import: Hydra imports every plugin module at each start (optuna: 2.5 s)

        from runner.launch.sweep.study import STUDY_FILE, SweepFolderStorage

        impl: Any = self.sweeper
        if impl.storage is None:
            folder = Path(impl.config.hydra.sweep.dir)
            folder.mkdir(parents=True, exist_ok=True)
            impl.storage = SweepFolderStorage.open(folder / STUDY_FILE)
        impl.study_name = impl.study_name or DEFAULT_STUDY
        try:
            study = optuna.load_study(study_name=impl.study_name, storage=impl.storage)
        except KeyError:  # a new study: the sweeper creates it
            return super().sweep(arguments)
        trials = study.get_trials(deepcopy=False)
        stale = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
        for trial in stale:
            self._rerun(study, trial)
        impl.n_trials = max(0, impl.n_trials - len(trials))
        impl.job_idx = len(trials)
        seed = OmegaConf.select(impl.config, "hydra.sweeper.sampler.seed")
        if seed is not None and not isinstance(impl.sampler, functools.partial):  # not the grid sampler
            # a seeded sampler would draw its first run's values again: seeded on from the trials it has
            impl.sampler = instantiate(impl.config.hydra.sweeper.sampler, seed=int(seed) + len(trials))
        where = impl.storage.path if isinstance(impl.storage, SweepFolderStorage) else impl.storage
        print(f"[runner] optuna study {impl.study_name!r} resumed from {where}: {len(trials)} trial(s) "
              f"there ({len(stale)} interrupted, run again); {impl.n_trials} more to run", flush=True)
        return super().sweep(arguments)

    def _rerun(self, study: Any, trial: Any) -> None:
        """An interrupted trial's job again, with its values, in its folder; its result told to it."""
        import optuna

        impl: Any = self.sweeper
        overrides = tuple(f"{k}={v}" for k, v in {**trial.params, **trial.user_attrs}.items())
        (ret,) = impl.launcher.launch([overrides], initial_job_idx=trial.number)
        try:
            value = ret.return_value
            values = [float(v) for v in value] if isinstance(value, (list, tuple)) else [float(value)]
            study.tell(trial.number, values=values if len(values) > 1 else values[0])
        except Exception as exc:  # noqa: BLE001  (as the sweeper does: the trial fails, the study goes on)
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            log.warning(f"Failed experiment: {exc}")
