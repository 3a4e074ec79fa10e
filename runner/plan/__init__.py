"""Planning: a sharding plan for a model on a cluster, and what it is expected to cost. A library with one door.

The door is this module: every name in :data:`__all__`, and nothing else, is what the rest of the runner may use
(``tests/test_layout.py`` holds it to that; ``tests/plan/`` tests the insides). The way in::

    spec = plan_spec(cfg)                                   # the job's plan part, read once from the config
    plan, chosen, seconds, sharders = make_plan(spec, model, world, local_world, device_type, pg, facts=facts)
    write_plan_report(spec, plan, chosen, world, local_world, device_type, folder, ...)   # plan/ of the run folder

Inside, a plan is one pipeline, read top to bottom from :func:`make_plan` (:mod:`.planner`):

1. **gate**: the installed TorchRec is the one the adapter was tested with (:mod:`.torchrec_adapter.torchrec_seam`;
   otherwise TorchRec's stock planner plans, and a note says so); a pinned plan is loaded and rated instead.
2. **inputs**: the topology with the cost model's constants (:mod:`.cost`), the storage reservation
   (:mod:`.plan_memory`), per-table constraints from the sharding policy.
3. **proposers and search**: the proposer the config names (:mod:`.proposer_build`; declared in
   :mod:`runner.config.proposers`), TorchRec's planning loop at scale (:mod:`.torchrec_adapter`), the runner's
   balanced search (:mod:`.torchrec_adapter.balanced`), fall-backs where a proposer finds no plan.
4. **rating**: TorchRec's estimates per shard and, with a calibration, the whole step (:mod:`.cost.step_estimate`).

The cost model has one room, :mod:`.cost`: the calibration file, its trust, its fit, the step estimate, learning
from runs and TorchRec's topology knobs. What runs on workers to measure is ``mode=calibrate`` of the job
(:mod:`runner.train.calibrate`), which hands its raw measurements to :func:`calibrate_results`.

Planning is a pure step: config parts and a model on the meta device in, plan and estimates out, no worker process
needed. It imports only :mod:`runner.config` and :mod:`runner.runtime`; never ``track``, ``train``, ``data`` or
``launch`` (the caller builds the model and reports). This module imports nothing until a name is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict

_DOOR: Dict[str, str] = {
    # planning a job
    "PlanSpec": "spec", "plan_spec": "spec", "PlanFacts": "spec", "PlanChoices": "spec",
    "make_plan": "planner", "reusable_model": "planner", "plan_entries": "planner", "runners_planner": "planner",
    "sharders_for": "sharders",
    # the plan folder every run writes, and what is read back from it
    "write_plan_report": "report", "plan_description": "analysis", "CHART": "analysis", "ESTIMATES": "analysis",
    "draw_plan_chart": "chart", "load_matplotlib": "chart",
    # the cost model: which calibration a job plans with, its files, its fit from raw measurements, its words
    "for_config": "cost.choice", "hashed": "cost.choice", "check_file": "cost.calibration",
    "check_folder": "cost.calibration", "calibrate_results": "cost.fit", "SHARDED_DIM": "cost.fit",
    "TINY_ROWS": "cost.fit", "REUSE_ROWS": "cost.fit", "PARTS": "cost.trust",
    "allowed_median_error": "cost.trust", "median_error": "cost.trust", "dense_facts": "cost.step_estimate",
    "step_phrase": "cost.step_estimate", "dense_bytes": "cost.topology", "GIB": "cost.topology",
    "learn_command": "cost.learn", "export_calibration_command": "cost.torchrec_export",
    # the runner's planner against TorchRec's own on the same inputs (runner.launch.conformance_check)
    "CHECKING": "torchrec_adapter.conformance", "enumeration_differences": "torchrec_adapter.comparison",
    "proposer_differs": "torchrec_adapter.comparison",
}
__all__ = sorted(_DOOR)


def __getattr__(name: str) -> Any:
    if name not in _DOOR:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (its door: {', '.join(__all__)})")
    return getattr(importlib.import_module(f"{__name__}.{_DOOR[name]}"), name)


if TYPE_CHECKING:  # what mypy sees of the door; at run time each name is imported when first asked for
    from runner.plan.analysis import CHART, ESTIMATES, plan_description
    from runner.plan.chart import draw_plan_chart, load_matplotlib
    from runner.plan.cost.calibration import check_file, check_folder
    from runner.plan.cost.choice import for_config, hashed
    from runner.plan.cost.fit import REUSE_ROWS, SHARDED_DIM, TINY_ROWS, calibrate_results
    from runner.plan.cost.learn import learn_command
    from runner.plan.cost.step_estimate import dense_facts, step_phrase
    from runner.plan.cost.topology import GIB, dense_bytes
    from runner.plan.cost.torchrec_export import export_calibration_command
    from runner.plan.cost.trust import PARTS, allowed_median_error, median_error
    from runner.plan.planner import make_plan, plan_entries, reusable_model, runners_planner
    from runner.plan.report import write_plan_report
    from runner.plan.sharders import sharders_for
    from runner.plan.spec import PlanChoices, PlanFacts, PlanSpec, plan_spec
    from runner.plan.torchrec_adapter.comparison import enumeration_differences, proposer_differs
    from runner.plan.torchrec_adapter.conformance import CHECKING
