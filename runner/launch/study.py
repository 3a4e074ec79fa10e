"""An Optuna study kept in its sweep folder (``optuna_study.pkl``), for the runner's Optuna sweeper
(``runner/launch/plugins/hydra_plugins/runner_launcher/optuna_sweeper.py``): Optuna 2.10's SQL storage, the
version hydra-optuna-sweeper 1.3 allows, fails on the SQLAlchemy 2 that MLflow needs."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, Callable

from optuna.storages import InMemoryStorage

STUDY_FILE = "optuna_study.pkl"


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
