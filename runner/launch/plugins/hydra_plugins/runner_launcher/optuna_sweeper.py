"""Hydra's Optuna sweeper whose study lives in the sweep folder and resumes there (the pre-check names this
class in ``hydra.sweeper._target_`` for ``hydra/sweeper=optuna``).

- **Its storage.** Without ``hydra.sweeper.storage`` the study is kept in ``<sweep folder>/optuna_study.pkl``
  (Optuna's in-memory storage, written again, whole and atomically, at each change; study name
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
import os
import pickle
from pathlib import Path
from typing import Any, Callable, List

from hydra.utils import instantiate
from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper
from omegaconf import OmegaConf
from optuna.storages import InMemoryStorage

STUDY_FILE = "optuna_study.pkl"
DEFAULT_STUDY = "runner"
log = logging.getLogger(__name__)


def _saved(method: Callable) -> Callable:
    def change(self: "SweepFolderStorage", *args: Any, **kwargs: Any) -> Any:
        out = method(self, *args, **kwargs)
        self.save()
        return out
    return change


class SweepFolderStorage(InMemoryStorage):
    """Optuna's in-memory storage, written to ``path`` after each change (read back by :meth:`open`)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    @classmethod
    def open(cls, path: Path) -> "SweepFolderStorage":
        if path.exists():
            with path.open("rb") as f:
                storage = pickle.load(f)  # the study this sweep folder's own sweeper wrote
            storage.path = path
            return storage
        return cls(path)

    def save(self) -> None:
        part = self.path.with_name(self.path.name + ".part")
        with part.open("wb") as f:
            pickle.dump(self, f)
        os.replace(part, self.path)


for _name in ("create_new_study", "set_study_directions", "set_study_user_attr", "set_study_system_attr",
              "create_new_trial", "set_trial_state", "set_trial_param", "set_trial_values",
              "set_trial_intermediate_value", "set_trial_user_attr", "set_trial_system_attr"):
    setattr(SweepFolderStorage, _name, _saved(getattr(InMemoryStorage, _name)))


class ResumingOptunaSweeper(OptunaSweeper):
    def sweep(self, arguments: List[str]) -> None:
        import optuna

        impl = self.sweeper
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

        impl = self.sweeper
        overrides = tuple(f"{k}={v}" for k, v in {**trial.params, **trial.user_attrs}.items())
        (ret,) = impl.launcher.launch([overrides], initial_job_idx=trial.number)
        try:
            value = ret.return_value
            values = [float(v) for v in value] if isinstance(value, (list, tuple)) else [float(value)]
            study.tell(trial.number, values=values if len(values) > 1 else values[0])
        except Exception as exc:  # noqa: BLE001  (as the sweeper does: the trial fails, the study goes on)
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            log.warning(f"Failed experiment: {exc}")
