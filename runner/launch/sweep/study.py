"""An Optuna study kept in its sweep folder, for the runner's Optuna sweeper
(``runner/launch/plugins/hydra_plugins/runner_launcher/optuna_sweeper.py``): Optuna's journal storage
(``optuna_journal.log``, one line per change, appended under a file lock, so a stopped sweep resumes from it
and processes on other nodes may open it too), and the search space read from Hydra's sweep syntax.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, cast

if TYPE_CHECKING:
    import optuna

JOURNAL_FILE = "optuna_journal.log"
PLAN_FITS = "plan_fits"  # the constraint every told trial carries: 0.0 its plan fits the devices, 1.0 none fits
OLD_STUDY_FILE = "optuna_study.pkl"  # the pickled in-memory storage of runner versions on Optuna 2.10


def refuse(line: str) -> None:
    """End the sweep before any trial: ``line`` said (exit 2); the parent run (opened before the study) FAILED, or
    for a resume, it and ``sweep.json`` as they were (nothing ran: the sweep is what it was before this command)."""
    from runner.launch.sweep.parent import undo_start

    undo_start(line)
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
        refuse(f"the Optuna study file {old} was kept by an older runner (Optuna 2.10's pickle), which Optuna 5 "
                "cannot read; start the study in a new sweep folder (hydra.sweep.dir=...), or move the file away "
                "to start it again here (its finished trials' runs stay in MLflow)")
    folder.mkdir(parents=True, exist_ok=True)
    if damage := _damage(path):
        refuse(f"the Optuna study journal {path} cannot be read back ({damage}); restore it from a copy, or move "
                "it away to start the study again in this folder (its finished trials' runs stay in MLflow)")
    try:  # Optuna replays the journal here: a record of the wrong shape that passed the checks above is one line too
        return JournalStorage(JournalFileBackend(str(path)))
    except (LookupError, TypeError, ValueError, AttributeError, AssertionError) as exc:
        refuse(f"the Optuna study journal {path} cannot be read back ({type(exc).__name__}: {exc}); restore it "
               "from a copy, or move it away to start the study again in this folder")


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
    *whole, last = data.split(b"\n")
    if not whole:  # made, nothing written yet, or its first record cut short (Optuna's replay skips it)
        return None
    for number, line in enumerate(whole, 1):
        try:
            record = json.loads(line)
        except ValueError:
            return f"line {number} is not a journal record"
        if not isinstance(record, dict) or "op_code" not in record:
            return f"line {number} is not a journal record"
        if (fault := _record_fault(record)) is not None:
            return f"line {number}: {fault}"
    if json.loads(whole[0]).get("op_code") != 0:
        return "its first record does not create a study"
    if last:
        print(f"[runner] warning: the last record of {path} was cut short (a stop while it was written); the "
              "study goes on without that change", file=sys.stderr, flush=True)
    return None


_COUNTS = ("op_code", "study_id", "trial_id", "state")  # Optuna's ids, op codes and states: counts, never floats


def _record_fault(record: Dict[str, Any]) -> Optional[str]:
    """What of one journal record Optuna's replay would fail on or take as another value (None: nothing): ids, op
    codes and states counts (Optuna indexes its lists with them), an objective or a parameter's value a finite
    number (Optuna fails a trial told NaN), its distribution a record (Optuna's JSON)."""
    import math

    for key in _COUNTS:
        value = record.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
            return f"{key}={value!r} is not a count"
    values = record.get("values")
    told = values if isinstance(values, list) else [] if values is None else [values]
    for value in ([record["param_value_internal"]] if "param_value_internal" in record else []) + told:
        # a trial's value may be infinite (a point whose plan does not fit is told the worst), never NaN; a
        # parameter's value is finite
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or (
                value not in told and not math.isfinite(value)):
            return f"value {value!r} is not a number"
    if "param_name" in record:
        from optuna.distributions import json_to_distribution

        try:  # a value outside its own range is no value the study drew
            inside = json_to_distribution(record["distribution"])._contains(record["param_value_internal"])
        except (LookupError, TypeError, ValueError, AttributeError):
            return f"the parameter {record['param_name']!r} has no distribution"
        if not inside:
            return f"the parameter {record['param_name']}={record['param_value_internal']!r} is outside its range"
    return None


def write_trial_file(folder: Path, storage: Any, study_name: str, pruner: Any) -> Optional[Path]:
    """With a pruner: what a trial's job needs to report to its trial (:mod:`runner.track.trial`: the study's
    storage, name and pruner), written to the sweep folder; None without one."""
    from omegaconf import OmegaConf

    from runner.track.trial import TRIAL_FILE

    if pruner is None:
        return None
    path = folder / TRIAL_FILE
    where = storage if isinstance(storage, str) else str((folder / JOURNAL_FILE).resolve())
    OmegaConf.save(OmegaConf.create({"storage": where, "study": study_name, "pruner": pruner}), path)
    return path.resolve()


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
    if isinstance(value, RangeSweep):  # Hydra's values, in order (its stop exclusive): their first, last and step
        values: List[Any] = list(override.sweep_iterator())
        start, step = cast(Tuple[Any, Any], (value.start, value.step))
        if len(values) < 2 or step < 0:
            return CategoricalDistribution(values or [start])
        if all(isinstance(v, int) for v in (*values, step)):
            return IntDistribution(values[0], values[-1], step=int(step))
        return FloatDistribution(float(values[0]), float(values[-1]), step=float(step))
    if isinstance(value, IntervalSweep):
        log = "log" in value.tags
        low, high = cast(Tuple[Any, Any], (value.start, value.end))
        if isinstance(low, int) and isinstance(high, int):
            return IntDistribution(low, high, log=log)
        return FloatDistribution(float(low), float(high), log=log)
    return None


def search_space(params: Dict[str, Any], arguments: List[str]) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """The search space (key -> distribution) and the fixed overrides (key -> the override as written, e.g.
    ``model=dlrm`` or ``~train.resume``) of a study, from ``hydra.sweeper.params`` and the command's arguments (a
    swept argument on the command line is searched too; a key in both is the command line's)."""
    texts = {str(k): f"{k}={v}" for k, v in (params or {}).items()}
    for arg in arguments:
        texts[arg.partition("=")[0]] = arg
    dists = {key: distribution(key, text.partition("=")[2]) if "=" in text else None for key, text in texts.items()}
    return {k: d for k, d in dists.items() if d is not None}, {k: texts[k] for k, d in dists.items() if d is None}


def value_text(value: Any) -> str:
    """A drawn value as Hydra's override grammar reads it back as the same value: ``null``, ``true``, numbers as
    they are, a string quoted where it would otherwise read as another type or hold the grammar's characters."""
    import re

    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    plain = re.fullmatch(r"[A-Za-z_/][A-Za-z0-9_./\-]*", text) and text.lower() not in ("null", "true", "false",
                                                                                        "inf", "nan")
    return text if plain else "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def trial_overrides(params: Dict[str, Any], fixed: Dict[str, str]) -> List[str]:
    """A trial's command-line overrides: its drawn values, then the study's fixed overrides as written."""
    return [f"{k}={value_text(v)}" for k, v in params.items()] + [o for k, o in fixed.items() if k not in params]


def job_values(value: Any, directions: int) -> List[float]:
    """A trial's job's return value as the study's values, one per direction (ValueError where they differ)."""
    values = [float(v) for v in value] if isinstance(value, (list, tuple)) else [float(value)]
    if len(values) != directions:
        raise ValueError(f"the job returned {len(values)} value(s) for {directions} direction(s)")
    return values


def mark_fit(trial: optuna.Trial, job_dir: Path) -> None:
    """Record on the running ``trial`` whether its job (folder ``job_dir``) found a plan that fits the devices, as
    Optuna 5's constraint ``plan_fits`` (``Trial.set_constraint``; 1.0 is violated), before its value is told.
    A point where no plan fits has no objective value: the samplers that honour constraints (TPE, NSGA-II, GP)
    learn from it where the feasible region ends instead of modelling the worst value it returns as a result
    (COMPLETE needs one), and the best trial and the Pareto front leave it out. Every trial carries the
    constraint, since Optuna's GP sampler wants as many on each; a trial already finished (a training trial its
    pruner stopped, which had a plan) is left as it is."""
    from optuna.exceptions import UpdateFinishedTrialError

    from runner.runtime import rundir

    fits = (rundir.read_json(job_dir / rundir.RESULTS) or {}).get("plan_status") != "infeasible"
    try:
        trial.set_constraint(PLAN_FITS, 0.0 if fits else 1.0)
    except UpdateFinishedTrialError:
        pass


def infeasible(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether a told trial violated a constraint (no plan fits the devices)."""
    return any(v > 0 for v in trial.constraints.values())


def tally(study: optuna.Study) -> Dict[str, int]:
    """The study's trials by outcome: ``feasible`` (completed with a plan), ``infeasible`` (completed, its
    constraint violated: no plan fits, an answer), ``failed`` (the job failed), ``pruned``, ``running``."""
    import optuna

    counts = {"trials": 0, "feasible": 0, "infeasible": 0, "failed": 0, "pruned": 0, "running": 0}
    state = optuna.trial.TrialState
    for t in study.get_trials(deepcopy=False):
        counts["trials"] += 1
        key = ("infeasible" if infeasible(t) else "feasible") if t.state == state.COMPLETE else \
            {state.FAIL: "failed", state.PRUNED: "pruned"}.get(t.state, "running")
        counts[key] += 1
    return counts


def write_results(study: optuna.Study, directions: List[str], folder: Path) -> None:
    """The study's counts (trials with a plan, infeasible ones apart from failed ones) and its best trial (or
    Pareto front) among those with a plan, printed and kept in ``optimization_results.yaml``."""
    import time

    import optuna
    from omegaconf import OmegaConf

    done = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    counts = tally(study)
    out: Dict[str, Any] = {"name": "optuna", "study_name": study.study_name, **counts, "completed": len(done),
                           "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    print(f"[runner] optuna: {counts['trials']} trial(s): {counts['feasible']} with a plan, {counts['infeasible']} "
          f"infeasible (no plan fits: told as the violated constraint {PLAN_FITS}), {counts['failed']} failed, "
          f"{counts['pruned']} pruned", flush=True)
    if not done:
        print("[runner] optuna: no trial completed", flush=True)
    elif not counts["feasible"]:
        print("[runner] optuna: no trial had a plan that fits: no best trial", flush=True)
    elif len(directions) == 1:
        best = study.best_trial  # Optuna's: the best of the trials whose constraints hold
        out.update(best_params=dict(best.params), best_value=best.value, best_trial=best.number)
        print(f"[runner] optuna: best trial {best.number}: {best.params}; Best value: {best.value}", flush=True)
    else:
        front = [{"trial": t.number, "params": dict(t.params), "values": list(t.values)} for t in study.best_trials]
        out["pareto_front"] = front
        print(f"[runner] optuna: Pareto front of {len(front)} trial(s) ({' x '.join(directions)}): "
              + "; ".join(f"trial {f['trial']} {f['params']} -> {f['values']}" for f in front), flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(out), folder / "optimization_results.yaml")
