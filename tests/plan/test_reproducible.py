"""The balanced search's answer does not depend on the machine: its budget is counted in work, so a clock that
runs 1000x fast (a machine 1000x slower, as the search would see it) gives the same plan; it stops at the bound or
after rounds that improve nothing; and the wall-clock safety stop, where it fires, is said in the plan's note
and tag."""

from __future__ import annotations

import json
import time
from typing import Any, Dict, List

import numpy as np
import pytest
from conftest import cfg_for

from runner.config.tables import table_specs
from runner.plan.plan_file import plan_to_dict
from runner.plan.planner import make_plan
from runner.plan.spec import plan_spec
from runner.plan.torchrec_adapter.balanced import proposer as balanced_proposer
from runner.plan.torchrec_adapter.balanced.effort import Effort
from runner.plan.torchrec_adapter.balanced.problem import DEVICE, Choice, Problem, rating
from runner.plan.torchrec_adapter.balanced.proposer import search
from runner.train.models import planning_model

MANY = ["model=dnn_many", "model.generated_tables.count=60", "cluster=gpu_2x8", "sharding.proposer=balanced",
        "sharding.balanced_compare=[]", "cluster.calibration=none"]


def _plan(*overrides: str) -> tuple:
    cfg = cfg_for(*MANY, *overrides)
    notes: List[str] = []
    facts: Dict[str, Any] = {}
    plan, _, _, _ = make_plan(plan_spec(cfg), planning_model(cfg), 16, 8, "cuda", notes=notes, facts=facts)
    return json.dumps(plan_to_dict(plan, table_specs(cfg.model)), sort_keys=True), notes, facts


def test_a_clock_a_thousand_times_faster_gives_the_same_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(balanced_proposer, "_POOL", {})  # no earlier point's plan as a start: two separate runs
    first, _, facts = _plan()
    assert facts["search"]["work"] > 0 and facts["search"]["stopped"] in ("bound", "patience", "rounds", "work")
    real = time.perf_counter
    start = real()
    monkeypatch.setattr(time, "perf_counter", lambda: start + 1000 * (real() - start))
    monkeypatch.setattr(balanced_proposer, "_POOL", {})
    second, _, again = _plan()
    assert second == first
    assert again["search"] == facts["search"]
    assert "cut_short" not in again


def test_the_safety_stop_says_the_plan_was_cut_short() -> None:
    _, notes, facts = _plan("sharding.planner_timeout_s=0.000001")
    assert "planner_timeout_s" in facts["cut_short"] and "cut short" in facts["cut_short"]
    assert any("cut short" in n for n in notes)
    assert facts["search"]["stopped"] in ("timeout", "bound")


def _device_tables(sizes: List[float]) -> List[List[Choice]]:
    mem = np.array([[1, 0]])
    return [[Choice(DEVICE, np.array([s]), mem)] for s in sizes]


def test_the_search_stops_at_once_where_the_bound_is_reached() -> None:
    problem = Problem(_device_tables([1.0] * 16), np.array([[100, 0]] * 4), 4)  # 4 a rank: the mean rank
    effort = Effort(1_000_000)
    best, facts = search(problem, {}, effort, patience=20_000)
    assert rating(problem, best) == pytest.approx(4.0)
    assert facts["stopped"] == "bound" and facts["rounds"] == 0


def test_the_search_stops_after_work_that_improves_nothing() -> None:
    problem = Problem(_device_tables([1.0] * 13), np.array([[100, 0]] * 2), 2)  # 7 on one rank: 7.7% above the mean
    effort = Effort(1_000_000)
    best, facts = search(problem, {}, effort, patience=300)
    assert rating(problem, best) == pytest.approx(7.0)
    assert facts["stopped"] == "patience" and 0 < facts["rounds"] < 200 and 300 <= facts["work"] < 1_000_000
    longer = Effort(1_000_000)
    _, more = search(problem, {}, longer, patience=600)  # more patience: more rounds, the same answer
    assert more["stopped"] == "patience" and more["rounds"] > facts["rounds"]
    few = Effort(effort.spent // 3)  # less work than the first search did: stopped by the work
    worse, cut = search(problem, {}, few, patience=300)
    assert cut["stopped"] == "work" and rating(problem, worse) >= rating(problem, best)
