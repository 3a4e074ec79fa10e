"""Every proposer ``sharding.proposer`` may name, each declared once, here.

A declaration says how the proposer is built (a function of the planner's TorchRec adapter, imported only
once the installed TorchRec is the one the adapter was tested with), which of TorchRec's proposers stands in
for it on TorchRec's stock planner, whether its plans are TorchRec's (the runner's speed-ups of TorchRec's
proposers give TorchRec's answers) or its own, where it runs, the ``sharding.*`` keys it reads, the proposer
the planner falls back to when it finds no packing, and whether a sweep's points plan together with it.
The schema's allowed values (:mod:`.schema`), the planner (:mod:`runner.plan.proposer_build`), the
plan report and the sweep's planning read it; nothing else names a proposer. Adding one is its module in
``runner/plan/torchrec_adapter/``, its declaration below and its test (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

_ADAPTER = "runner.plan.torchrec_adapter."
_STOCK = "runner.plan.proposer_build:"


@dataclass(frozen=True)
class Proposer:
    name: str
    summary: str
    """What it does, in a few words (the schema's documentation, ``--help``)."""
    builds: Optional[str] = None
    """``module:function`` building it: ``(sharding, device_type, world_size) -> proposer``; None: TorchRec's
    default list of proposers."""
    stock: Optional[str] = None
    """``module:function`` building TorchRec's proposer (or list of them) that the stock planner uses for it:
    ``(sharding) -> proposer``; None: TorchRec's default list."""
    torchrecs_answer: bool = True
    """Its plans are the TorchRec proposer's ``stock`` gives (speed-ups only); False: a search of its own, rated by
    TorchRec's estimates and never worse than TorchRec's plans it starts from."""
    cpu: bool = True
    """Whether CPU workers may use it (the dynamic-programming proposer bins HBM, which they do not have)."""
    knobs: Tuple[str, ...] = ()
    """The ``sharding.*`` keys it reads."""
    falls_back_to: Optional[str] = None
    """The proposer tried next when it finds no packing of tables that fit."""
    plans_sweeps_together: bool = False
    """A plan-only grid sweep of it plans all its points in one pass first
    (:mod:`runner.launch.sweep.plan_together`)."""
    own_planner: bool = False
    """It runs its own planner (the balanced search's), not the runner's search loop over TorchRec's."""
    retries_placeable: bool = False
    """Where it finds no plan, it proposes again without the options that have a shard no device can hold."""
    balanced_start: bool = False
    """The balanced search may start from its plan (a value of ``sharding.balanced_compare``)."""
    balanced_default: bool = False
    """... and does where ``sharding.balanced_compare`` is null (on workers that may use it)."""
    check_at: Tuple[str, ...] = ()
    """Overrides its conformance check on a new TorchRec adds (:mod:`runner.launch.conformance_check`)."""


PROPOSERS: Dict[str, Proposer] = {p.name: p for p in (
    Proposer("default", "TorchRec's default list: grid search, greedy, uniform"),
    Proposer("balanced", "the runner's search for the plan with the least loaded busiest rank, never worse than "
             "its starts (docs/planning.md)", builds=_ADAPTER + "balanced.balanced_planner:build",
             torchrecs_answer=False,
             knobs=("balanced_work", "balanced_patience", "balanced_gap", "balanced_compare", "dp_hbm_bins"),
             plans_sweeps_together=True,
             own_planner=True),
    Proposer("dynamic_programming", "TorchRec's dynamic-programming proposer, vectorised",
             builds=_ADAPTER + "dp_proposer:build", stock=_STOCK + "stock_dynamic_programming", cpu=False,
             knobs=("dp_hbm_bins",), falls_back_to="greedy", retries_placeable=True, balanced_start=True,
             balanced_default=True),
    Proposer("greedy", "TorchRec's two greedy proposers", builds=_ADAPTER + "greedy_proposers:build",
             stock=_STOCK + "stock_greedy", balanced_start=True),
    Proposer("grid_search", "TorchRec's grid search, refusing loudly above its limit",
             builds=_ADAPTER + "grid_search:build", stock=_STOCK + "stock_grid_search", knobs=("grid_max_proposals",),
             check_at=("model.generated_tables.count=3",)),  # its proposals grow exponentially with the tables
    Proposer("uniform", "TorchRec's uniform proposer", builds=_ADAPTER + "grid_search:build_uniform",
             stock=_STOCK + "stock_uniform"),
)}
BALANCED_STARTS = tuple(n for n, p in PROPOSERS.items() if p.balanced_start)
