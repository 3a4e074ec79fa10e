"""An Optuna study kept in its sweep folder (``optuna_study.pkl``), for the runner's Optuna sweeper
(``runner/launch/plugins/hydra_plugins/runner_launcher/optuna_sweeper.py``): Optuna 2.10's SQL storage, the
version hydra-optuna-sweeper 1.3 allows, fails on the SQLAlchemy 2 that MLflow needs."""

from __future__ import annotations

import os
import pickle
import sys
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
        """The study kept at ``path`` (a new one where there is none). A file that cannot be read back (cut
        short by a full disk or a copy that stopped, emptied, garbled) ends the command with one line naming
        it and what to do (exit 2), before any trial runs."""
        if path.exists():
            try:
                with path.open("rb") as f:
                    storage = pickle.load(f)  # the study this sweep folder's own sweeper wrote
                if not isinstance(storage, cls):
                    raise TypeError(f"holds a {type(storage).__name__}")
            except Exception as exc:  # noqa: BLE001 - unpickling damaged bytes raises almost anything
                from runner.launch.sweep.parent import end_stopped_sweep

                line = (f"the Optuna study file {path} cannot be read back ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else 'damaged'}); restore it from a copy, or move it "
                        "away to start the study again in this folder (its finished trials' runs stay in MLflow)")
                end_stopped_sweep("", failed=line)  # the parent run, opened before the study, ends FAILED
                print(f"error: {line}", file=sys.stderr, flush=True)
                raise SystemExit(2) from None
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
