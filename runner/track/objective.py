"""What a job returns to a searching sweeper (``hydra/sweeper=optuna``): one metric of its run.

``tracking.objective.metric`` names the metric (default: ``eval/auc`` in train mode, the plan's estimated
step time ``plan/est_step_ms`` in plan mode) and ``direction`` whether larger is better. A point that has
no value (no plan fits, a failed job) is an answer, not a crash: it returns the worst value.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

from runner.config.modes import MODES
from runner.runtime import run_files
from runner.track import store
from runner.track.events import last_logged

if TYPE_CHECKING:
    from runner.config.schema import ObjectiveSchema

Objective = Union[float, List[float]]  # one metric's value, or each metric's for a multi-objective study
_IN_RESULTS = {"eval/auc": "eval_auc", "eval/ne": "eval_ne", "eval/logloss": "eval_logloss",
               "plan/est_step_ms": "est_step_ms", "train/loss": "final_loss"}


def objective(o: ObjectiveSchema, mode: str) -> Tuple[str, str]:
    """``(metric, direction)`` of ``tracking.objective`` (``o``) for a job of ``mode``, defaults filled in."""
    metric = o.metric or MODES[mode].objective
    return metric, o.direction or _by_name(metric)


def objectives(o: ObjectiveSchema, mode: str) -> List[Tuple[str, str]]:
    """Every ``(metric, direction)`` a job returns: :func:`objective`'s, then ``more_metrics``'."""
    return [objective(o, mode)] + [(m, _by_name(m)) for m in o.more_metrics]


def _by_name(metric: str) -> str:
    return "max" if "auc" in metric or "accuracy" in metric else "min"


def worst(direction: str) -> float:
    return -math.inf if direction == "max" else math.inf


def objective_value(wanted: List[Tuple[str, str]], results: Optional[Dict[str, Any]],
                    run_folder: Optional[Path] = None) -> Objective:
    """The objective metrics' (``wanted``: :func:`objectives`) last values in the job's results, else in what rank 0
    logged (``run_folder``'s event log: the value the run gets, whether or not the store is there now), else in its
    run; the worst value for each it has not; one number, or a list where ``more_metrics`` asks for more."""
    values = [_value(results, metric, direction, run_folder) for metric, direction in wanted]
    return values[0] if len(values) == 1 else values


def _value(results: Optional[Dict[str, Any]], metric: str, direction: str, run_folder: Optional[Path]) -> float:
    if not results or results.get("plan_status") == "infeasible":
        return worst(direction)
    value = results.get(_IN_RESULTS.get(metric, ""))
    if value is None and run_folder is not None:
        value = last_logged(run_folder / run_files.EVENTS, metric)
    if value is None and results.get("run_id"):
        try:
            value = store.client(results["tracking_uri"]).get_run(results["run_id"]).data.metrics.get(metric)
        except Exception:  # the store is out: the point has no value here
            value = None
    return worst(direction) if value is None or value != value else float(value)

