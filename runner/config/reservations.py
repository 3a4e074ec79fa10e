"""Every storage reservation ``sharding.storage_reserve_policy`` may name, each declared once, here.

A storage reservation is how much of each device's memory the planner keeps free for what is not an embedding
table (the dense part, the input batches in flight, a margin). Each policy is one of TorchRec's reservation
classes (``torchrec.distributed.planner.storage_reservations``); its declaration says which, the first TorchRec
release that has it (an older stack refuses it before launch, naming the stack that has it), the ``sharding.*``
keys it reads and the function of :mod:`runner.plan.plan_memory` that builds it. The schema's allowed values
(:mod:`.schema`), the validation, the planner and the plan report read it; nothing else names a policy.
TorchRec's classes reserve GPU memory (HBM) only; on CPU workers the runner keeps the same bytes of host memory
free (:mod:`runner.plan.plan_memory`), so every policy plans and trains on CPU too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

_BUILD = "runner.plan.plan_memory:"
OLDEST = "1.6.1"  # the oldest TorchRec of requirements/stacks.toml: a policy it has needs no check


@dataclass(frozen=True)
class Reservation:
    name: str
    summary: str
    """What it keeps free, in a few words (the schema's documentation, ``--help``)."""
    torchrec_class: str
    """Its class in ``torchrec.distributed.planner.storage_reservations``."""
    builds: str
    """``module:function`` giving the class's keyword arguments: ``(sharding, dense_bytes, device_bytes) -> kwargs``."""
    knobs: Tuple[str, ...]
    """The ``sharding.*`` keys it reads."""
    since: str = OLDEST
    """The first TorchRec release that has the class (``requirements/stacks.toml`` names the stacks)."""
    new_name: Optional[str] = None
    """Set on an old name that still works: the policy it now names (said in one note line)."""


_PERCENT = ("storage_reserve_percent",)
RESERVATIONS: Dict[str, Reservation] = {r.name: r for r in (
    Reservation("heuristic", "storage_reserve_percent of each device, plus the dense part's parameters, gradients "
                "and optimizer state (storage_reserve_dense_multiplier x their bytes) and 20 copies of the input "
                "batch", "HeuristicalStorageReservation", _BUILD + "heuristic",
                _PERCENT + ("storage_reserve_dense_multiplier",)),
    Reservation("fixed_percent", "exactly storage_reserve_percent of each device",
                "FixedPercentageStorageReservation", _BUILD + "fixed_percent", _PERCENT),
    Reservation("fixed", "fixed_percent's old name", "FixedPercentageStorageReservation", _BUILD + "fixed_percent",
                _PERCENT, new_name="fixed_percent"),
    Reservation("fixed_absolute", "exactly storage_reserve_gib GiB of each device",
                "FixedAbsoluteStorageReservation", _BUILD + "fixed_absolute", ("storage_reserve_gib",), since="1.7.0"),
    Reservation("sku_aware", "a margin anchored to one hardware kind (storage_reserve_percent of "
                "storage_reserve_home_gib), the dense part (as heuristic) or a measured base in its place "
                "(storage_reserve_base_gib), 20 copies of the input batch and a runtime overhead "
                "(storage_reserve_overhead_gib)", "SKUAwareStorageReservation", _BUILD + "sku_aware",
                _PERCENT + ("storage_reserve_home_gib", "storage_reserve_dense_multiplier", "storage_reserve_base_gib",
                            "storage_reserve_overhead_gib"), since="1.9.2"),
    Reservation("inference", "storage_reserve_percent of each device, the dense parameters once and one input batch "
                "(TorchRec's reservation for inference: no gradients or optimizer state, too little for training on "
                "GPUs)", "InferenceStorageReservation", _BUILD + "inference", _PERCENT),
)}


def canonical(policy: str) -> str:
    """The policy's name (an old name's new one)."""
    return RESERVATIONS[policy].new_name or policy


def _release(version: str) -> Tuple[int, ...]:
    return tuple(int(p) for p in version.split("+")[0].split(".")[:3] if p.isdigit())


def missing_from_stack(policy: str, installed: Optional[str]) -> Optional[str]:
    """What allows ``policy`` where the installed TorchRec (``installed``, its version; None: unknown) lacks its
    class, as the allowed-values part of one refusal line; None where it has it."""
    found = RESERVATIONS[policy]
    if installed is None or _release(installed) >= _release(found.since):
        return None
    has = ", ".join(n for n, r in RESERVATIONS.items()
                    if r.new_name is None and _release(installed) >= _release(r.since))
    return (f"a policy TorchRec {installed} has ({has}): {policy} is TorchRec's {found.torchrec_class}, first in "
            f"TorchRec {found.since} (the torchrec-{'.'.join(found.since.split('.')[:2])} stack of "
            "requirements/stacks.toml)")
