"""Every private name of TorchRec that the runner's planner relies on, in one list, and the version they were
tested with.

TorchRec's planner has no hooks for what the runner's speed-ups do: one search loop for every proposer
(:mod:`.planning_loop`), enumerations shared across a sweep (:mod:`.enumeration_reuse`), cheap copies of
sharding options (:mod:`.record_copies`), partitions that keep their prefix (:mod:`.shared_placements`),
the vectorised and skipping proposers (:mod:`.dp_proposer`, :mod:`.greedy_proposers`) and the balanced
proposer's planner (:mod:`runner.plan.balanced_planner`). They read or override the private attributes
below, patch one private method and import names TorchRec does not export.
The pin ``torchrec==1.8.0`` is their first protection. This list is the second:

- ``tests/plan/test_torchrec_seam.py`` checks every name on the installed TorchRec;
- on another version the runner plans with TorchRec's stock planner, and says so in one note line
  (:func:`seam_note`), rather than failing or silently answering differently.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import re
from typing import Dict, List, Optional, Tuple

TESTED_WITH = "1.8.0"

_P = "torchrec.distributed.planner."
ATTRIBUTES: Dict[str, Tuple[str, ...]] = {  # class -> private attributes and methods read, set or overridden
    _P + "planners.EmbeddingShardingPlanner": (
        "_batch_size", "_best_plan", "_callbacks", "_constraints", "_debug", "_enumerator", "_num_plans",
        "_num_proposals", "_partitioner", "_perf_model", "_proposers", "_stats", "_storage_reservation",
        "_timeout_seconds", "_topology"),
    _P + "partitioners.GreedyPerfPartitioner": ("_uniform_partition",),  # patched while a search runs
    _P + "proposers.DynamicProgrammingProposer": (
        "_current_proposal", "_hbm_bins_per_device", "_inited", "_proposal_list", "_sharding_options_by_fqn"),
    _P + "proposers.GreedyProposer": ("_current_proposal", "_sharding_options_by_fqn"),
    _P + "proposers.GridSearchProposer": ("_max_proposals", "_sharding_options_by_fqn"),
    _P + "enumerators.EmbeddingEnumerator": (
        "_batch_size", "_constraints", "_estimators", "_last_stored_module", "_last_stored_search_space",
        "_last_stored_sharders", "_sharder_data_map", "_sharder_map"),
    _P + "estimator.estimator.EmbeddingPerfEstimatorFactory": ("_registry",),
    _P + "shard_estimators.EmbeddingStorageEstimator": ("_constraints", "_topology"),
    _P + "storage_reservations.HeuristicalStorageReservation": ("_last_reserved_topology", "_percentage"),
    _P + "storage_reservations.FixedPercentageStorageReservation": ("_last_reserved_topology", "_percentage"),
    # training reads these two (train/split_step.py, train/optimizers.py)
    "torchrec.distributed.model_parallel.DistributedModelParallel": ("_dmp_wrapped_module",),
    "torchrec.distributed.batched_embedding_kernel.EmbeddingFusedOptimizer": ("_emb_module",),
}
MODULE_NAMES: Dict[str, Tuple[str, ...]] = {  # module -> names it does not export, imported by the runner
    _P + "planners": ("to_sharding_plan",),
    _P + "utils": ("reset_shard_rank",),
    _P + "constants": ("MAX_SIZE", "DEFAULT_PERF_ESTIMATOR"),
    # replaced while the compact enumeration runs (:mod:`.compact_enumeration`): the enumerator calls it by this name
    _P + "enumerators": ("calculate_shard_sizes_and_offsets",),
}
PYTHON_PRIVATE = ("_deepcopy_dispatch",)  # copy's dispatch table (:mod:`.record_copies`): Python's, not TorchRec's


def _class(path: str) -> type:
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def missing() -> List[str]:
    """The listed names the installed TorchRec (and Python) lacks: an attribute counts as there when the class
    has it or TorchRec's code of the class sets it (``self.<name>``); empty when every one is there."""
    gone = []
    for path, names in ATTRIBUTES.items():
        try:
            cls = _class(path)
        except (ImportError, AttributeError):
            gone.append(path)
            continue
        source = "".join(inspect.getsource(c) for c in cls.__mro__ if c.__module__.startswith("torchrec"))
        gone += [f"{path}.{n}" for n in names if not hasattr(cls, n) and not re.search(rf"self\.{n}\b", source)]
    for module, names in MODULE_NAMES.items():
        found = importlib.import_module(module)
        gone += [f"{module}.{n}" for n in names if not hasattr(found, n)]
    return gone + [f"copy.{n}" for n in PYTHON_PRIVATE if not hasattr(copy, n)]


@functools.lru_cache(maxsize=1)
def seam_note() -> Optional[str]:
    """None on the TorchRec the runner's planner was tested with; else the note line of a job that then plans
    with TorchRec's stock planner (and TorchRec's proposers) instead of the runner's."""
    import torchrec

    version = str(getattr(torchrec, "__version__", "unknown"))
    if version == TESTED_WITH:
        return None
    return (f"torchrec {version} is not the version the runner's planner was tested with ({TESTED_WITH}): "
            "planned with TorchRec's stock planner and proposers, without the runner's search (pin "
            f"torchrec=={TESTED_WITH} for it)")


def planner_refusal(exc: BaseException) -> bool:
    """A planner's answer that no plan was found (``PlannerError``, or an error raised inside TorchRec's planner),
    as opposed to a bug in the runner's own search: that one surfaces instead of a slower fallback plan."""
    from torchrec.distributed.planner.types import PlannerError

    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return isinstance(exc, PlannerError) or (tb is not None and "/torchrec/" in tb.tb_frame.f_code.co_filename)
