"""What a job returns to a searching sweeper (``hydra/sweeper=optuna``): one metric of its run.

``tracking.objective.metric`` names the metric (default: ``eval/auc`` in train mode, the plan's estimated
step time ``plan/est_step_ms`` in plan mode) and ``direction`` whether larger is better. A point that has
no value (no plan fits, a failed job) is an answer, not a crash: it returns the worst value.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from runner.track import store

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig

_IN_RESULTS = {"eval/auc": "eval_auc", "plan/est_step_ms": "est_step_ms", "train/loss": "final_loss"}


def objective(cfg: RunnerConfig) -> Tuple[str, str]:
    """``(metric, direction)`` of ``cfg``, defaults filled in."""
    o = cfg.tracking.objective
    metric = o.metric or ("plan/est_step_ms" if cfg.mode == "plan" else "eval/auc")
    direction = o.direction or ("max" if "auc" in metric or "accuracy" in metric else "min")
    return metric, direction


def worst(direction: str) -> float:
    return -math.inf if direction == "max" else math.inf


def objective_value(cfg: RunnerConfig, results: Optional[Dict[str, Any]]) -> float:
    """The objective metric's last value in the job's run (or its results); the worst value when it has none."""
    metric, direction = objective(cfg)
    if not results or results.get("plan_status") == "infeasible":
        return worst(direction)
    value = results.get(_IN_RESULTS.get(metric, ""))
    if value is None and results.get("run_id"):
        try:
            value = store.client(results["tracking_uri"]).get_run(results["run_id"]).data.metrics.get(metric)
        except Exception:  # the store is out: the point has no value here
            value = None
    return worst(direction) if value is None or value != value else float(value)
