"""What planning found beside the plan, typed: where the plan came from and how (decisions read these, never a
message's text), and what it compares with."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, TypedDict

PlanChoices = Tuple[List[Dict[str, Any]], Dict[str, Any]]
"""A sweep planned together (:mod:`runner.launch.sweep.plan_together`): its plans, and what this point compared."""


class PlanFacts(TypedDict, total=False):
    """What :func:`runner.plan.planner.make_plan` found beside the plan: where it came from, how, and what it
    compares with. No decision reads a message's text; they read these."""

    planner: str  # "runner" (the runner's planner, through the TorchRec adapter) or "stock" (TorchRec's own)
    plan_source: str  # "runner" (the runner's own plan) or "torchrec" (a TorchRec proposer's); "pinned" by report
    fallback: Optional[str]  # how a plan was found where the named proposer found none: "placeable_only", a proposer
    lower_bound_ms: Optional[float]  # the bound on any plan's estimated step (torchrec_adapter/balanced/bound.py)
    lower_bound_kind: Optional[str]  # which bound is tight: mean rank, largest shard, LP relaxation, whole shards
    compared: Dict[str, float]  # TorchRec's plans' ratings, as the balanced proposer compared them
    torchrec: Dict[str, Optional[float]]  # the same, by proposer (None: no plan)
    skipped: Dict[str, int]  # TorchRec's proposers not tried as starts at this size, with the shards that decided it
    calibration: str  # the calibration file the plan's constants came from, or "none" (TorchRec's defaults)
    calibration_note: str  # the line that says which constants, and why
    step: Dict[str, Any]  # the whole step, per rank and its parts (step_estimate.whole_step); with a calibration
    cut_short: Optional[str]  # where the safety stop (sharding.planner_timeout_s) cut the search: what it did
    search: Dict[str, Any]  # the balanced search's work, rounds and why it stopped (torchrec_adapter/balanced/effort)
    bandwidths: Dict[str, float]  # the intra- and cross-node bandwidths (GiB/s) the plan was made with
    reserved_bytes: Optional[List[int]]  # bytes each rank's storage reservation kept free (HBM, or host memory on CPU)
