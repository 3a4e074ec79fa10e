"""What of each device's memory a plan may fill: the storage reservation (TorchRec's class for
``sharding.storage_reserve_policy``, :mod:`runner.config.reservations` declaring each), keeping host memory free on
CPU workers too, the bytes it reserved per rank, and the stock planner's storage estimator told the job's pipeline
(whose input buffers it counts; the runner's planner's is :mod:`.torchrec_adapter.shard_estimators`).

TorchRec's classes take their bytes off each device's HBM only, and a CPU topology has no HBM (TorchRec gives
its devices 0), so on CPU workers a percentage or an absolute reserve would keep nothing free, and TorchRec's
SKU-aware class refuses every CPU plan (it finds 0 HBM left). :class:`HostMemoryToo` therefore asks TorchRec's
own class what it would leave of a GPU whose memory is the CPU worker's host memory, and leaves exactly that
much host memory: on CPU every policy keeps free the bytes it keeps free on a GPU of the same size, computed by
TorchRec's code, not a copy of it. On GPUs TorchRec's class answers alone.
"""

from __future__ import annotations

import copy
import importlib
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from torchrec.distributed.planner import Topology
from torchrec.distributed.planner.types import ShardEstimator, StorageReservation

from runner.config.parts import part
from runner.config.reservations import RESERVATIONS
from runner.plan.cost.calibration import GIB

if TYPE_CHECKING:
    from runner.config.schema import ShardingSchema

_CLASSES = "torchrec.distributed.planner.storage_reservations"


def _dense_estimate(dense_bytes: Optional[int], multiplier: float) -> Optional[int]:
    # None lets TorchRec size the dense part from the module itself (the runner's count excludes the tables'
    # buffers it would otherwise add; 0 means the count found none)
    return int(dense_bytes * multiplier) if dense_bytes else None


def heuristic(s: ShardingSchema, dense_bytes: Optional[int], device_bytes: int) -> Dict[str, Any]:
    multiplier = float(s.storage_reserve_dense_multiplier)
    return {"percentage": float(s.storage_reserve_percent), "parameter_multiplier": multiplier,
            "dense_tensor_estimate": _dense_estimate(dense_bytes, multiplier)}


def fixed_percent(s: ShardingSchema, dense_bytes: Optional[int], device_bytes: int) -> Dict[str, Any]:
    return {"percentage": float(s.storage_reserve_percent)}


def fixed_absolute(s: ShardingSchema, dense_bytes: Optional[int], device_bytes: int) -> Dict[str, Any]:
    return {"hbm_reserved_bytes": int(float(s.storage_reserve_gib or 0.0) * GIB)}


def sku_aware(s: ShardingSchema, dense_bytes: Optional[int], device_bytes: int) -> Dict[str, Any]:
    """The margin is the percent of the home hardware kind's memory (``storage_reserve_home_gib``; null: this
    cluster's devices'), so it does not grow with the devices a job lands on."""
    home = int(float(s.storage_reserve_home_gib) * GIB) if s.storage_reserve_home_gib is not None else device_bytes
    multiplier = float(s.storage_reserve_dense_multiplier)
    base = s.storage_reserve_base_gib
    return {"margin_bytes": int(float(s.storage_reserve_percent) * home),
            "runtime_overhead_bytes": int(float(s.storage_reserve_overhead_gib) * GIB),
            "parameter_multiplier": multiplier,
            "model_base_bytes": int(float(base) * GIB) if base is not None else None,
            "dense_tensor_estimate": _dense_estimate(dense_bytes, multiplier)}


def inference(s: ShardingSchema, dense_bytes: Optional[int], device_bytes: int) -> Dict[str, Any]:
    return {"percentage": float(s.storage_reserve_percent), "dense_tensor_estimate": _dense_estimate(dense_bytes, 1.0)}


def device_memory(topology: Topology) -> int:
    """Bytes of the first device's memory the planner places tables in: HBM on GPUs, host memory on CPU."""
    storage = topology.devices[0].storage
    return int(storage.ddr if topology.compute_device == "cpu" else storage.hbm)


def torchrec_reservation(sharding: ShardingSchema, dense_bytes: Optional[int], topology: Topology
                         ) -> StorageReservation:
    """TorchRec's own reservation object for ``sharding.storage_reserve_policy``, with the arguments the runner
    gives it (HBM only: what the tests compare the runner's with)."""
    found = RESERVATIONS[sharding.storage_reserve_policy]
    kwargs = part(found.builds)(sharding, dense_bytes, device_memory(topology))
    return getattr(importlib.import_module(_CLASSES), found.torchrec_class)(**kwargs)


def _gpu_twin(topology: Topology) -> Topology:
    """A GPU topology whose devices' HBM is ``topology``'s devices' host memory (the rest is never read by a
    reservation)."""
    twin = Topology(world_size=topology.world_size, compute_device="cuda", hbm_cap=0,
                    local_world_size=topology.local_world_size)
    for mine, theirs in zip(twin.devices, topology.devices, strict=True):
        mine.storage.hbm = theirs.storage.ddr
    return twin


class HostMemoryToo(StorageReservation):
    """TorchRec's reservation ``inner``; on CPU topologies the host memory it would leave of a GPU of that size
    (see the module doc)."""

    def __init__(self, inner: StorageReservation) -> None:
        self.inner = inner
        self._last_reserved_topology: Optional[Topology] = None

    def reserve(self, topology: Topology, *args: Any, **kwargs: Any) -> Topology:
        if topology.compute_device != "cpu":
            reserved = self.inner.reserve(topology, *args, **kwargs)
        else:
            twin = self.inner.reserve(_gpu_twin(topology), *args, **kwargs)
            reserved = copy.deepcopy(topology)
            for device, left in zip(reserved.devices, twin.devices, strict=True):
                device.storage.ddr = left.storage.hbm
        self._last_reserved_topology = copy.deepcopy(reserved)
        return reserved

    @property
    def last_reserved_topology(self) -> Optional[Topology]:
        return copy.deepcopy(self._last_reserved_topology)


def build_storage_reservation(sharding: ShardingSchema, topology: Topology,
                              dense_tensor_bytes: Optional[int] = None) -> HostMemoryToo:
    """The reservation ``sharding`` asks for on ``topology``'s devices; ``dense_tensor_bytes``: the dense
    parameters' bytes (:func:`runner.plan.cost.topology.dense_bytes`), which the policies that reserve the dense part
    multiply (None: TorchRec sizes it from the module)."""
    return HostMemoryToo(torchrec_reservation(sharding, dense_tensor_bytes, topology))


def reserved_per_rank(topology: Topology, reserved: Optional[Topology]) -> Optional[List[int]]:
    """Bytes each rank keeps free of the memory tables are placed in (HBM on GPUs, host memory on CPU): its
    device's memory less what the reservation left; None without a reservation."""
    if reserved is None:
        return None
    kind = "ddr" if topology.compute_device == "cpu" else "hbm"
    return [int(getattr(d.storage, kind)) - int(getattr(r.storage, kind))
            for d, r in zip(topology.devices, reserved.devices, strict=True)]


def stock_estimators(topology: Topology, constraints: Dict[str, Any], pipeline: str) -> List[ShardEstimator]:
    """TorchRec's default shard estimators (what its enumerator builds when given none), the storage estimator told
    the job's ``pipeline`` (a ``PipelineType`` value), by public names only: the stock planner runs on TorchRecs the
    adapter was not tested with."""
    from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator
    from torchrec.distributed.types import PipelineType

    try:  # the factory TorchRec's enumerator asks, where the release has it
        from torchrec.distributed.planner.constants import DEFAULT_PERF_ESTIMATOR
        from torchrec.distributed.planner.estimator import EmbeddingPerfEstimatorFactory

        perf = EmbeddingPerfEstimatorFactory.create(DEFAULT_PERF_ESTIMATOR, topology=topology, constraints=constraints)
    except ImportError:
        from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator

        perf = EmbeddingPerfEstimator(topology=topology, constraints=constraints)
    return [perf, EmbeddingStorageEstimator(topology=topology, constraints=constraints,
                                            pipeline_type=PipelineType(pipeline))]
