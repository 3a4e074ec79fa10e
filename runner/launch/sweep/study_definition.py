"""What an Optuna study is, checked when it goes on (a resume, or the same command with the same sweep folder).

A study's *definition* is what its trials were drawn and judged by: its directions, the metrics its jobs return
(``tracking.objective.metric`` and ``more_metrics``) and its search space. Optuna keeps only the directions, and
``create_study(load_if_exists=True)`` loads the old ones without a word when the command gives others; the space
it does not keep at all. So the runner keeps the definition in the study itself (a user attribute, in whatever
storage holds the study) and a command that changes it is refused in one line naming each change and how to start
a new study: the old trials would steer the sampler and the best trial would be judged on another question.

How the study is *run* (sampler, pruner, ``n_trials``, ``n_jobs``) may change between runs of it: the change is
kept and said in one line.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional

if TYPE_CHECKING:
    import optuna

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
    from omegaconf import DictConfig, OmegaConf

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
    :func:`runner.launch.sweep.study.refuse`)."""
    from runner.launch.sweep.study import refuse
    from runner.track.objective import objectives

    direction = sweeper.direction
    directions = [str(direction)] if isinstance(direction, str) else [str(d) for d in direction]
    metrics = [m for m, _ in objectives(objective, mode)]
    run = settings(sweeper.get("sampler"), sweeper.get("pruner"), sweeper.n_trials, sweeper.n_jobs)
    refusal = check_study(study, definition(directions, metrics, space), run, where)
    if refusal:
        refuse(refusal)
