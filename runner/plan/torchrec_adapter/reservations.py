"""The storage reservations of the runner's planner: TorchRec's, keeping host memory free on CPU workers too."""

from __future__ import annotations

import copy
from typing import Any, Optional

from torchrec.distributed.planner import Topology
from torchrec.distributed.planner.storage_reservations import (
    FixedPercentageStorageReservation,
    HeuristicalStorageReservation,
)


class _HostMemoryToo:
    """TorchRec's percentage reservations shrink only HBM; CPU workers plan in host memory (DDR), so
    the same fraction of DDR is kept free there too, or ``storage_reserve_percent`` would do nothing."""

    _percentage: float
    _last_reserved_topology: Optional[Topology]

    def reserve(self, topology: Topology, *args: Any, **kwargs: Any) -> Topology:
        reserved = super().reserve(topology, *args, **kwargs)  # type: ignore[misc]
        if topology.compute_device == "cpu":
            for device in reserved.devices:
                device.storage.ddr = int((1 - self._percentage) * device.storage.ddr)
            self._last_reserved_topology = copy.deepcopy(reserved)
        return reserved


class FixedReservation(_HostMemoryToo, FixedPercentageStorageReservation):
    pass


class HeuristicReservation(_HostMemoryToo, HeuristicalStorageReservation):
    pass


RESERVATIONS = (FixedReservation, HeuristicReservation)  # for :func:`runner.plan.topology.build_storage_reservation`
