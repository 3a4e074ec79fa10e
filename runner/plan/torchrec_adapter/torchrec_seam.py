"""Every private name of TorchRec that the runner's planner relies on, in one list, and the version they were
tested with.

TorchRec's planner has no hooks for what the runner's speed-ups do: one search loop for every proposer
(:mod:`.planning_loop`), enumerations shared across a sweep (:mod:`.enumeration_reuse`), cheap copies of
sharding options (:mod:`.dataclass_copies`), partitions that keep their prefix (:mod:`.shared_placements`),
the vectorised and skipping proposers (:mod:`.dp_proposer`, :mod:`.greedy_proposers`) and the balanced
proposer's planner (:mod:`runner.plan.torchrec_adapter.balanced.balanced_planner`). They read or override the
private attributes below, patch one private method and import names TorchRec does not export.
The pin ``torchrec==1.9.2`` is their first protection. This list and a conformance check are the second:

- ``tests/plan/test_torchrec_seam.py`` checks every name on the installed TorchRec;
- where a listed name is gone, or on another version whose behaviour fails the conformance check
  (:mod:`.conformance`: the compact enumeration and TorchRec-named proposers against TorchRec's own, once per
  stack), the runner plans with TorchRec's stock planner (its own storage reservations, no private name), and
  says so in one note line (:func:`seam_note`), rather than failing or silently answering differently; another
  version that passes gets the runner's planner, said in one note line too (:func:`conformance_note`). This
  module imports nothing of TorchRec's at module level; the rest of the adapter (but
  :mod:`.conformance`, which imports nothing at module level either) is imported only after :func:`seam_note`
  found nothing (``tests/plan/test_torchrec_seam.py`` checks both in a subprocess).
"""

from __future__ import annotations

import copy
import dis
import functools
import importlib
import inspect
import os
from typing import Any, Dict, List, Optional, Set, Tuple

TESTED_WITH = "1.9.2"

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
ALTERNATIVES: Dict[str, str] = {  # a listed name -> the one an older supported TorchRec has in its place
    _P + "enumerators.EmbeddingEnumerator._sharder_data_map": "_sharder_map",  # 1.6: estimators take the sharders
}
PYTHON_PRIVATE = ("_deepcopy_dispatch",)  # copy's dispatch table (:mod:`.dataclass_copies`): Python's, not TorchRec's


def _stored_in(code: Any) -> Set[str]:
    """Every attribute name a code object (and the code nested in it) sets."""
    nested = (_stored_in(const) for const in code.co_consts if hasattr(const, "co_names"))
    return {i.argval for i in dis.get_instructions(code) if i.opname == "STORE_ATTR"}.union(*nested)


def _set_by(cls: type) -> Set[str]:
    """The attribute names TorchRec's code of ``cls`` (its methods and its TorchRec bases') sets."""
    codes = (getattr(inspect.unwrap(member) if callable(member) else member, "__code__", None)
             for c in cls.__mro__ if c.__module__.startswith("torchrec") for member in vars(c).values())
    return {name for code in codes if code is not None for name in _stored_in(code)}


def missing() -> List[str]:
    """The listed names the installed TorchRec (and Python) lacks: an attribute counts as there when the class
    has it or TorchRec's code of the class uses it (``self.<name>``); empty when every one is there."""
    gone = []
    for path, names in ATTRIBUTES.items():
        module, name = path.rsplit(".", 1)
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            gone.append(path)
            continue
        present = _set_by(cls) | set(dir(cls))
        gone += [f"{path}.{n}" for n in names if not {n, ALTERNATIVES.get(f"{path}.{n}", n)} & present]
    for module, names in MODULE_NAMES.items():
        try:
            found = importlib.import_module(module)
        except ImportError:
            gone.append(module)
            continue
        gone += [f"{module}.{n}" for n in names if not hasattr(found, n)]
    return gone + [f"copy.{n}" for n in PYTHON_PRIVATE if not hasattr(copy, n)]


@functools.lru_cache(maxsize=1)
def _gate() -> Tuple[Optional[str], Optional[str]]:
    """(the stock planner's note, the runner's planner's note): at most one of them set, both None on the TorchRec
    the adapter was tested with."""
    import torchrec

    version = str(getattr(torchrec, "__version__", "unknown"))
    stock = "planned with TorchRec's stock planner and proposers, without the runner's search"
    if gone := missing():
        return (f"torchrec {version} lacks {len(gone)} name(s) the runner's planner relies on ({', '.join(gone[:3])}"
                f"{', ...' if len(gone) > 3 else ''}): {stock}", None)
    if version == TESTED_WITH:
        return None, None
    from runner.plan.torchrec_adapter.conformance import CHECKING, verdict  # imports nothing of TorchRec's

    if os.environ.get(CHECKING) == "1":  # the conformance check's own process: the runner's planner is checked
        return None, None

    passed, reason = verdict(say=lambda line: print(f"[runner] {line}", flush=True))
    if not passed:
        return f"torchrec {version} is not the version the runner's planner was tested with ({TESTED_WITH}) and " \
               f"{reason}: {stock}", None
    return None, (f"torchrec {version} is not the version the runner's planner was tested with ({TESTED_WITH}); "
                  f"{reason}: planned with the runner's planner")


def seam_note() -> Optional[str]:
    """None where the runner's planner plans: on the TorchRec the adapter was tested with, or on another one that
    has every listed name and passes the conformance check (:mod:`.conformance`, run once per stack and
    remembered); else the note line of a job that then plans with TorchRec's stock planner (and TorchRec's
    proposers), with the reason. The rest of this package is imported only when this is None."""
    return _gate()[0]


def conformance_note() -> Optional[str]:
    """The note line of a job whose TorchRec is not the tested one but passed the conformance check; else None."""
    return _gate()[1]


def forget() -> None:
    """Decide again at the next question (a test that changes the installed TorchRec's look)."""
    _gate.cache_clear()


def planner_refusal(exc: BaseException) -> bool:
    """A planner's answer that no plan was found (``PlannerError``, or an error raised inside TorchRec's planner),
    as opposed to a bug in the runner's own search: that one surfaces instead of a slower fallback plan."""
    from torchrec.distributed.planner.types import PlannerError

    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return isinstance(exc, PlannerError) or (tb is not None and "/torchrec/" in tb.tb_frame.f_code.co_filename)
