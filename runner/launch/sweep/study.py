"""An Optuna study kept in its sweep folder, for the runner's Optuna sweeper
(``runner/launch/plugins/hydra_plugins/runner_launcher/optuna_sweeper.py``): Optuna's journal storage
(``optuna_journal.log``, one line per change, appended under a file lock, so a stopped sweep resumes from it
and processes on other nodes may open it too), and the search space read from Hydra's sweep syntax.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, cast

JOURNAL_FILE = "optuna_journal.log"
OLD_STUDY_FILE = "optuna_study.pkl"  # the pickled in-memory storage of runner versions on Optuna 2.10


def _refuse(line: str) -> None:
    from runner.launch.sweep.parent import end_stopped_sweep

    end_stopped_sweep("", failed=line)  # the parent run, opened before the study, ends FAILED
    print(f"error: {line}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def journal_storage(folder: Path) -> Any:
    """The journal storage of the study kept in ``folder`` (a new one where there is none). A study file of the
    old format (Optuna 2.10's pickle), or a journal that cannot be read back (cut short by a full disk, garbled),
    ends the command with one line naming it and what to do (exit 2), before any trial runs."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    path = folder / JOURNAL_FILE
    old = folder / OLD_STUDY_FILE
    if old.exists() and not path.exists():
        _refuse(f"the Optuna study file {old} was kept by an older runner (Optuna 2.10's pickle), which Optuna 5 "
                "cannot read; start the study in a new sweep folder (hydra.sweep.dir=...), or move the file away "
                "to start it again here (its finished trials' runs stay in MLflow)")
    folder.mkdir(parents=True, exist_ok=True)
    damage = _damage(path)
    if damage:
        _refuse(f"the Optuna study journal {path} cannot be read back ({damage}); restore it from a copy, or move "
                "it away to start the study again in this folder (its finished trials' runs stay in MLflow)")
    return JournalStorage(JournalFileBackend(str(path)))


def _damage(path: Path) -> Optional[str]:
    """What is wrong with the journal at ``path`` (None: none, or no journal yet). Optuna's replay skips what it
    cannot read; here every whole line must be a record and the first must create the study. A last line cut
    short (a stop while a record was appended) is what Optuna's journal is built to survive: the study goes on
    without that change, and a line says so."""
    import json

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror}"
    if not data:
        return None  # made, nothing written yet
    *whole, last = data.split(b"\n")
    for number, line in enumerate(whole, 1):
        try:
            record = json.loads(line)
        except ValueError:
            return f"line {number} is not a journal record"
        if not isinstance(record, dict) or "op_code" not in record:
            return f"line {number} is not a journal record"
    if not whole or json.loads(whole[0]).get("op_code") != 0:
        return "its first record does not create a study"
    if last:
        print(f"[runner] warning: the last record of {path} was cut short (a stop while it was written); the "
              "study goes on without that change", file=sys.stderr, flush=True)
    return None


def distribution(key: str, text: str) -> Any:
    """The Optuna distribution of one swept key in Hydra's sweep syntax (``choice(a,b)``, ``range(1,9,2)``,
    ``interval(0.1,0.9)``, ``tag(log,interval(1e-4,1e-1))``, ``int(interval(8,64))``); None for a plain value
    (a fixed override of every trial)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    (override,) = OverridesParser.create().parse_overrides([f"{key}={text}"])
    value: Any = override.value()
    if isinstance(value, ChoiceSweep):
        choices = [c if c is None or isinstance(c, (bool, int, float, str)) else str(c) for c in value.list]
        return CategoricalDistribution(choices)
    if isinstance(value, RangeSweep):
        start, stop, step = cast(Tuple[Any, Any, Any], (value.start, value.stop, value.step))
        if all(isinstance(v, int) for v in (start, stop, step)):
            return IntDistribution(int(start), int(stop) - int(step), step=int(step))  # Hydra's stop is exclusive
        return FloatDistribution(float(start), float(stop) - float(step), step=float(step))
    if isinstance(value, IntervalSweep):
        log = "log" in value.tags
        low, high = cast(Tuple[Any, Any], (value.start, value.end))
        if isinstance(low, int) and isinstance(high, int):
            return IntDistribution(low, high, log=log)
        return FloatDistribution(float(low), float(high), log=log)
    return None


def search_space(params: Dict[str, Any], arguments: List[str]) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """The search space (key -> distribution) and the fixed overrides (key -> value) of a study, from
    ``hydra.sweeper.params`` and the command's arguments (a swept argument on the command line is searched too;
    a key in both is the command line's)."""
    texts = {str(k): str(v) for k, v in (params or {}).items()}
    for arg in arguments:
        key, _, value = arg.partition("=")
        texts[key] = value
    space: Dict[str, Any] = {}
    fixed: Dict[str, str] = {}
    for key, text in texts.items():
        dist = distribution(key, text)
        if dist is None:
            fixed[key] = text
        else:
            space[key] = dist
    return space, fixed


def trial_overrides(params: Dict[str, Any], fixed: Dict[str, str]) -> List[str]:
    """A trial's command-line overrides: its drawn values, then the study's fixed overrides."""
    return [f"{k}={v}" for k, v in params.items()] + [f"{k}={v}" for k, v in fixed.items() if k not in params]
