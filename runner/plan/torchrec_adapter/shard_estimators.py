"""TorchRec's default shard estimators, with the perf estimator's config lookups done once.

TorchRec's perf estimator looks up, for every shard of every sharding option, which of its hardware
config's methods carry an annotation (custom compute, comms, coefficients): each lookup lists and reads
every public attribute of the config (``dir``), several times per shard. That is about half the time
of enumerating a thousand tables' options. :class:`LookupOnceConfig` is TorchRec's default config
(the class its factory registers as the default) whose ``dir`` lists only its annotated methods, found
once per class, and whose coefficients per (sharding type, kernel) are read once: every lookup finds
the same method or coefficients as before, so every estimate is the same number
(``tests/plan/test_search.py`` compares them with TorchRec's own estimators).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from torchrec.distributed.planner.constants import DEFAULT_PERF_ESTIMATOR
from torchrec.distributed.planner.estimator import EmbeddingPerfEstimatorFactory
from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator
from torchrec.distributed.planner.types import ParameterConstraints, ShardEstimator, Topology

_DefaultConfig: Any = EmbeddingPerfEstimatorFactory._registry[DEFAULT_PERF_ESTIMATOR.lower()]
_MARKER_PREFIX = "_is_"  # every TorchRec estimator annotation marks its method with an attribute named _is_*


def _annotated(config: Any) -> Tuple[str, ...]:
    """The public names of ``config``'s methods that carry an annotation marker, in ``dir`` order."""
    names = []
    for name in dir(type(config)):
        if name.startswith("_"):
            continue
        attr = getattr(type(config), name, None)
        func = getattr(attr, "__func__", attr)
        if callable(func) and any(k.startswith(_MARKER_PREFIX) and v for k, v in getattr(func, "__dict__", {}).items()):
            names.append(name)
    return tuple(names)


class LookupOnceConfig(_DefaultConfig):
    """TorchRec's default perf-estimator config; see the module doc."""

    _names_by_class: Dict[type, Tuple[str, ...]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._coefficients_by_key: Dict[Tuple[str, Optional[str]], Any] = {}

    def __dir__(self) -> List[str]:
        names = LookupOnceConfig._names_by_class.get(type(self))
        if names is None:
            names = LookupOnceConfig._names_by_class[type(self)] = _annotated(self)
        return list(names)

    def get_coefficients_for_sharding(self, sharding_type: str, compute_kernel: Optional[str] = None) -> Any:
        key = (sharding_type, compute_kernel)
        found = self._coefficients_by_key.get(key)
        if found is None:
            found = self._coefficients_by_key[key] = super().get_coefficients_for_sharding(sharding_type,
                                                                                          compute_kernel)
        return found


def shard_estimators(topology: Topology, constraints: Optional[Dict[str, ParameterConstraints]],
                     pipeline: str) -> List[ShardEstimator]:
    """What TorchRec's enumerator builds when given none (its default perf and storage estimators), with the
    perf estimator's config looked up once, and the storage estimator told the job's ``pipeline`` (a
    ``PipelineType`` value: :func:`runner.config.pipelines.planned_pipeline`), whose input buffers it counts."""
    return [EmbeddingPerfEstimatorFactory.create_with_config(LookupOnceConfig(), topology=topology,
                                                             constraints=constraints),
            storage_estimator(topology, constraints, pipeline)]


def storage_estimator(topology: Topology, constraints: Optional[Dict[str, ParameterConstraints]],
                      pipeline: str) -> ShardEstimator:
    """TorchRec's storage estimator for a job running ``pipeline`` (a ``PipelineType`` value)."""
    from torchrec.distributed.types import PipelineType

    return EmbeddingStorageEstimator(topology=topology, constraints=constraints, pipeline_type=PipelineType(pipeline))
