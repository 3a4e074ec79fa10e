"""The runner's Optuna study, kept in its sweep folder, for the runner's Optuna sweeper
(``runner/launch/plugins/hydra_plugins/runner_launcher/optuna_sweeper.py``): Optuna's journal storage
(``optuna_journal.log``, one line per change, appended under a file lock, so a stopped sweep resumes from it
and processes on other nodes may open it too), the search space read from Hydra's sweep syntax, a trial's
overrides and values, the study's results, and what the study is, checked when it goes on (a resume, or the same
command with the same sweep folder).

A study's *definition* is what its trials were drawn and judged by: its directions, the metrics its jobs return
(``tracking.objective.metric`` and ``more_metrics``) and its search space. Optuna keeps only the directions, and
``create_study(load_if_exists=True)`` loads the old ones without a word when the command gives others; the space
it does not keep at all. So the runner keeps the definition in the study itself (a user attribute, in whatever
storage holds the study) and a command that changes it is refused in one line naming each change and how to start
a new study: the old trials would steer the sampler and the best trial would be judged on another question.
How the study is *run* (sampler, pruner, ``n_trials``, ``n_jobs``) may change between runs of it: the change is
kept and said in one line.

One concept: a study as the runner keeps it, from its journal to its results. The search space is read once from
Hydra's syntax and is both what trials are drawn from and part of the definition checked on a resume; the journal's
checks and the definition's end the command the same way (:func:`refuse`), before any trial.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple, cast

from omegaconf import DictConfig, OmegaConf

from runner.runtime import run_files
from runner.track.objective import objectives
from runner.track.trial import TRIAL_FILE

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
    try:  # Optuna replays the journal here: an entry of the wrong shape that passed the checks above is one line too
        return JournalStorage(JournalFileBackend(str(path)))
    except (LookupError, TypeError, ValueError, AttributeError, AssertionError) as exc:
        refuse(f"the Optuna study journal {path} cannot be read back ({type(exc).__name__}: {exc}); restore it "
               "from a copy, or move it away to start the study again in this folder")


def _damage(path: Path) -> Optional[str]:
    """What is wrong with the journal at ``path`` (None: none, or no journal yet). Optuna's replay skips what it
    cannot read; here every whole line must be an entry and the first must create the study. A last line cut
    short (a stop while an entry was appended) is what Optuna's journal is built to survive: the study goes on
    without that change, and a line says so."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror}"
    *whole, last = data.split(b"\n")
    if not whole:  # made, nothing written yet, or its first entry cut short (Optuna's replay skips it)
        return None
    for number, line in enumerate(whole, 1):
        try:
            entry = json.loads(line)
        except ValueError:
            return f"line {number} is not a journal record"
        if not isinstance(entry, dict) or "op_code" not in entry:
            return f"line {number} is not a journal record"
        if (fault := _entry_fault(entry)) is not None:
            return f"line {number}: {fault}"
    if json.loads(whole[0]).get("op_code") != 0:
        return "its first record does not create a study"
    if last:
        print(f"[runner] warning: the last record of {path} was cut short (a stop while it was written); the "
              "study goes on without that change", file=sys.stderr, flush=True)
    return None


_COUNTS = ("op_code", "study_id", "trial_id", "state")  # Optuna's ids, op codes and states: counts, never floats


def _entry_fault(entry: Dict[str, Any]) -> Optional[str]:
    """What of one journal entry Optuna's replay would fail on or take as another value (None: nothing): ids, op
    codes and states counts (Optuna indexes its lists with them), an objective or a parameter's value a finite
    number (Optuna fails a trial told NaN), its distribution a mapping (Optuna's JSON)."""
    for key in _COUNTS:
        value = entry.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
            return f"{key}={value!r} is not a count"
    values = entry.get("values")
    told = values if isinstance(values, list) else [] if values is None else [values]
    for value in ([entry["param_value_internal"]] if "param_value_internal" in entry else []) + told:
        # a trial's value may be infinite (a point whose plan does not fit is told the worst), never NaN; a
        # parameter's value is finite
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or (
                value not in told and not math.isfinite(value)):
            return f"value {value!r} is not a number"
    if "param_name" in entry:
        from optuna.distributions import json_to_distribution

        try:  # a value outside its own range is no value the study drew
            inside = json_to_distribution(entry["distribution"])._contains(entry["param_value_internal"])
        except (LookupError, TypeError, ValueError, AttributeError):
            return f"the parameter {entry['param_name']!r} has no distribution"
        if not inside:
            return f"the parameter {entry['param_name']}={entry['param_value_internal']!r} is outside its range"
    return None


def write_trial_file(folder: Path, storage: Any, study_name: str, pruner: Any) -> Optional[Path]:
    """With a pruner: what a trial's job needs to report to its trial (:mod:`runner.track.trial`: the study's
    storage, name and pruner), written to the sweep folder; None without one."""
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

    fits = (run_files.read_json(job_dir / run_files.RESULTS) or {}).get("plan_status") != "infeasible"
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
    import optuna

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


DEFINITION = "runner.definition"  # the study's user attributes that hold it
SETTINGS = "runner.settings"


def definition(directions: List[str], metrics: List[str], space: Mapping[str, Any]) -> Dict[str, Any]:
    """A study's definition as JSON values: directions, objective metrics, and each searched key's distribution
    (Optuna's own JSON of it)."""
    from optuna.distributions import distribution_to_json

    return {"directions": [str(d).lower() for d in directions], "metrics": list(metrics),
            "space": {key: json.loads(distribution_to_json(d)) for key, d in sorted(space.items())}}


def settings(sampler: Any, pruner: Any, n_trials: int, n_jobs: int) -> Dict[str, Any]:
    """How a study is run: the sampler's and pruner's configs (``_target_`` and keys; None: no pruner), trials
    and trials at once."""
    return {"sampler": _plain(sampler), "pruner": _plain(pruner), "n_trials": int(n_trials), "n_jobs": int(n_jobs)}


def _plain(part: Any) -> Any:
    return OmegaConf.to_container(part, resolve=True) if isinstance(part, DictConfig) else part


def _kept(study: optuna.Study) -> Dict[str, Any]:
    """The definition the study was made with; for a study made before the runner kept it, what Optuna kept:
    its directions and its trials' distributions (its metrics are then unknown, and not compared)."""
    found = study.user_attrs.get(DEFINITION)
    if isinstance(found, dict):
        return found
    space: Dict[str, Any] = {}
    for trial in study.get_trials(deepcopy=False):
        space.update(trial.distributions)
    return {**definition([d.name for d in study.directions], [], space), "metrics": None}


def _text(dist: Dict[str, Any]) -> str:
    """A distribution as Hydra's sweep syntax writes it (``choice(...)``, ``interval(...)``, ``range(...)``)."""
    attrs = dist.get("attributes", {})
    if "choices" in attrs:
        return f"choice({', '.join(map(str, attrs['choices']))})"
    low, high, step = attrs.get("low"), attrs.get("high"), attrs.get("step")
    if step not in (None, 1) or (step == 1 and dist.get("name") == "FloatDistribution"):
        return f"range {low}..{high} step {step}"  # Hydra's range() stops before its end: its last value here
    text = f"interval({low}, {high})"
    text = f"int({text})" if dist.get("name") == "IntDistribution" else text
    return f"tag(log, {text})" if attrs.get("log") else text


def changes(kept: Mapping[str, Any], now: Mapping[str, Any]) -> List[str]:
    """Each difference between two definitions, in words (empty: the same study)."""
    out = []
    if kept["directions"] != now["directions"]:
        out.append(f"hydra.sweeper.direction {_one(kept['directions'])} -> {_one(now['directions'])}")
    if kept.get("metrics") is not None and kept["metrics"] != now["metrics"]:
        out.append(f"objective metric(s) (tracking.objective.metric, more_metrics) {_one(kept['metrics'])} -> "
                   f"{_one(now['metrics'])}")
    before, after = kept["space"], now["space"]
    for key in sorted(set(before) | set(after)):
        if key not in after:
            out.append(f"search key {key} removed (was {_text(before[key])})")
        elif key not in before:
            out.append(f"search key {key} added ({_text(after[key])})")
        elif before[key] != after[key]:
            out.append(f"{key} {_text(before[key])} -> {_text(after[key])}")
    return out


def _one(values: List[str]) -> str:
    return values[0] if len(values) == 1 else f"[{', '.join(values)}]"


def setting_changes(kept: Mapping[str, Any], now: Mapping[str, Any]) -> List[str]:
    """Each difference in how the study is run, in words."""
    out = []
    for part in ("sampler", "pruner"):
        a, b = kept.get(part), now.get(part)
        if a != b:
            out.append(f"{part} {_part_text(a, b)} -> {_part_text(b, a)}")
    for key in ("n_trials", "n_jobs"):
        if key in kept and kept[key] != now[key]:
            out.append(f"{key} {kept[key]} -> {now[key]}")
    return out


def _part_text(part: Any, other: Any) -> str:
    """A sampler's or pruner's config as its class and the keys where it differs from ``other``."""
    if not isinstance(part, dict):
        return "none"
    name = str(part.get("_target_", "?")).rsplit(".", 1)[-1]
    if not isinstance(other, dict) or other.get("_target_") != part.get("_target_"):
        return name
    differ = [f"{k}={part.get(k)}" for k in sorted(set(part) | set(other)) if k != "_target_" and
              part.get(k) != other.get(k)]
    return f"{name}({', '.join(differ)})"


def check_study(study: optuna.Study, now: Dict[str, Any], run: Dict[str, Any], where: str) -> Optional[str]:
    """Compare the study with this command's definition ``now`` and settings ``run``: the one-line refusal when
    the definition changed (the study is left as it was), else None, with the definition and settings kept in the
    study and a line said where the settings changed."""
    if not study.user_attrs.get(DEFINITION) and not study.get_trials(deepcopy=False):
        study.set_user_attr(DEFINITION, now)  # a new study: made with this definition
        study.set_user_attr(SETTINGS, run)
        return None
    changed = changes(_kept(study), now)
    if changed:
        return (f"the Optuna study {study.study_name!r} in {where} was defined otherwise: {'; '.join(changed)}; a "
                "study's trials were drawn and judged by its definition, so it cannot change: start a new study "
                "with hydra.sweeper.study_name=<a new name>, or in a new sweep folder (hydra.sweep.dir=...), or "
                "resume this one with its own definition")
    if not study.user_attrs.get(DEFINITION):  # a study made before the runner kept its definition
        study.set_user_attr(DEFINITION, now)
    before = study.user_attrs.get(SETTINGS)
    said = setting_changes(before, run) if isinstance(before, dict) else []
    if said:
        print(f"[runner] optuna: study {study.study_name!r} goes on with {'; '.join(said)} (how it is run may "
              "change; its trials so far are kept)", flush=True)
    if said or not isinstance(before, dict):
        study.set_user_attr(SETTINGS, run)
    return None


def keep_or_refuse(study: optuna.Study, sweeper: Any, objective: Any, mode: str, space: Mapping[str, Any],
                   where: str) -> None:
    """The runner's Optuna sweeper's check of a study it loaded or made, before any trial: the sweep's
    ``hydra.sweeper`` (``sweeper``), ``tracking.objective`` (``objective``), job ``mode`` and search ``space``
    against what the study keeps; a changed definition ends the command in one line (exit 2,
    :func:`refuse`)."""
    direction = sweeper.direction
    directions = [str(direction)] if isinstance(direction, str) else [str(d) for d in direction]
    metrics = [m for m, _ in objectives(objective, mode)]
    run = settings(sweeper.get("sampler"), sweeper.get("pruner"), sweeper.n_trials, sweeper.n_jobs)
    refusal = check_study(study, definition(directions, metrics, space), run, where)
    if refusal:
        refuse(refusal)
