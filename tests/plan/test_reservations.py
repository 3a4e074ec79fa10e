"""Every storage reservation ``sharding.storage_reserve_policy`` names leaves what TorchRec's own reservation class
leaves, on many GPU topologies (plan-only, in-process), option by option; on CPU workers it leaves of host memory
what TorchRec's class leaves of a GPU that size; bad values and a policy an older TorchRec lacks are refused in
one line."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import pytest
from conftest import cfg_for
from torchrec.distributed.planner import Topology
from torchrec.distributed.planner.storage_reservations import (
    FixedAbsoluteStorageReservation,
    FixedPercentageStorageReservation,
    HeuristicalStorageReservation,
    InferenceStorageReservation,
    SKUAwareStorageReservation,
)
from torchrec.distributed.planner.types import PlannerError

from runner.config.errors import ConfigError
from runner.config.reservations import RESERVATIONS, missing_from_stack
from runner.config.validation import validate
from runner.plan.cost.topology import dense_bytes
from runner.plan.plan_memory import build_storage_reservation, reserved_per_rank
from runner.plan.planner import build_constraints
from runner.plan.sharders import sharders_for
from runner.plan.spec import plan_spec
from runner.train.models import planning_model

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # TorchRec's heuristic class warns when built
GIB = 1024**3
# policy -> (its keys, TorchRec's class built with the arguments the keys say, written out here by hand:
# percent, GiB, dense bytes, device bytes); each at two settings
POLICIES: Dict[str, List[Tuple[Tuple[str, ...], Any]]] = {
    "heuristic": [(("sharding.storage_reserve_percent=0.15",),
                   lambda d, dev: HeuristicalStorageReservation(0.15, 6.0, d * 6)),
                  (("sharding.storage_reserve_percent=0.4", "sharding.storage_reserve_dense_multiplier=3"),
                   lambda d, dev: HeuristicalStorageReservation(0.4, 3.0, d * 3))],
    "fixed_percent": [(("sharding.storage_reserve_percent=0.1",),
                       lambda d, dev: FixedPercentageStorageReservation(0.1)),
                      (("sharding.storage_reserve_percent=0.6",),
                       lambda d, dev: FixedPercentageStorageReservation(0.6))],
    "fixed": [(("sharding.storage_reserve_percent=0.3",), lambda d, dev: FixedPercentageStorageReservation(0.3))],
    "fixed_absolute": [(("sharding.storage_reserve_gib=4",), lambda d, dev: FixedAbsoluteStorageReservation(4 * GIB)),
                       (("sharding.storage_reserve_gib=0.5",),
                        lambda d, dev: FixedAbsoluteStorageReservation(GIB // 2))],
    "sku_aware": [(("sharding.storage_reserve_percent=0.15",),  # home: this cluster's own devices
                   lambda d, dev: SKUAwareStorageReservation(int(0.15 * dev), 0, 6.0, None, d * 6)),
                  (("sharding.storage_reserve_percent=0.2", "sharding.storage_reserve_home_gib=80",
                    "sharding.storage_reserve_overhead_gib=1.5"),
                   lambda d, dev: SKUAwareStorageReservation(int(0.2 * 80 * GIB), int(1.5 * GIB), 6.0, None, d * 6)),
                  (("sharding.storage_reserve_base_gib=3",),  # a measured base in place of the margin and dense part
                   lambda d, dev: SKUAwareStorageReservation(int(0.15 * dev), 0, 6.0, 3 * GIB, d * 6))],
    "inference": [(("sharding.storage_reserve_percent=0.25",), lambda d, dev: InferenceStorageReservation(0.25, d))],
}
# (world, GPUs per node, HBM GiB per GPU)
TOPOLOGIES = [(2, 2, 16), (8, 8, 32), (16, 8, 80), (64, 8, 141), (24, 8, 40)]


def _inputs(overrides: Tuple[str, ...]) -> Tuple[Any, ...]:
    cfg = cfg_for(*overrides)
    spec = plan_spec(cfg)
    model = planning_model(cfg)
    constraints = build_constraints(spec.sharding, [t.name for t in spec.tables], spec.pooling, spec.excluded)
    return spec, model, sharders_for(cfg.precision), constraints, dense_bytes(model)


def _left(reservation: Any, topology: Topology, model: Any, sharders: Any, constraints: Any, batch: int) -> Any:
    """Each device's memory left for tables, or ``refused`` where the reservation takes it all (TorchRec's
    ``PlannerError``: the SKU-aware margin of an 80 GiB GPU on a 16 GiB one)."""
    try:
        reserved = reservation.reserve(topology=topology, batch_size=batch, module=model, sharders=sharders,
                                       constraints=constraints)
    except PlannerError:
        return "refused"
    return [d.storage.hbm if topology.compute_device == "cuda" else d.storage.ddr for d in reserved.devices]


CASES = [(p, i) for p, settings in POLICIES.items() for i in range(len(settings))]


@pytest.mark.parametrize("policy, setting", CASES, ids=[f"{p}-{i}" for p, i in CASES])
def test_each_policy_leaves_what_torchrecs_class_leaves(policy: str, setting: int) -> None:
    keys, theirs = POLICIES[policy][setting]
    spec, model, sharders, constraints, dense = _inputs((f"sharding.storage_reserve_policy={policy}", *keys))
    for world, local, hbm_gib in TOPOLOGIES:
        gpus = Topology(world_size=world, local_world_size=local, compute_device="cuda", hbm_cap=int(hbm_gib * GIB))
        ours = build_storage_reservation(spec.sharding, gpus, dense)
        expected = _left(theirs(dense, hbm_gib * GIB), gpus, model, sharders, constraints, spec.batch)
        assert _left(ours, gpus, model, sharders, constraints, spec.batch) == expected, (policy, world, hbm_gib)
        if expected != "refused":
            assert reserved_per_rank(gpus, ours.last_reserved_topology) == [hbm_gib * GIB - n for n in expected]
        # CPU workers: host memory of that size keeps free what TorchRec's class keeps free of that GPU
        cpus = Topology(world_size=world, local_world_size=local, compute_device="cpu", ddr_cap=int(hbm_gib * GIB))
        on_cpu = build_storage_reservation(spec.sharding, cpus, dense)
        assert _left(on_cpu, cpus, model, sharders, constraints, spec.batch) == expected, (policy, world, "cpu")
    assert expected != "refused" and 0 < min(expected) < hbm_gib * GIB  # at 141 GiB: kept free, and some left


def test_every_declared_policy_is_compared() -> None:
    assert set(POLICIES) == set(RESERVATIONS)


@pytest.mark.parametrize("overrides, says", [
    (("sharding.storage_reserve_policy=fixed_absolute",), "sharding.storage_reserve_gib=None is not allowed; "
     "expected a size in GiB >= 0 with sharding.storage_reserve_policy=fixed_absolute"),
    (("sharding.storage_reserve_gib=-1",), "sharding.storage_reserve_gib=-1.0 is not allowed; expected null or a "
     "size in GiB >= 0"),
    (("sharding.storage_reserve_home_gib=0",), "sharding.storage_reserve_home_gib=0.0 is not allowed"),
    (("sharding.storage_reserve_dense_multiplier=0",), "sharding.storage_reserve_dense_multiplier=0.0 is not allowed"),
    (("sharding.storage_reserve_overhead_gib=-0.5",), "sharding.storage_reserve_overhead_gib=-0.5 is not allowed"),
    (("sharding.storage_reserve_base_gib=-2",), "sharding.storage_reserve_base_gib=-2.0 is not allowed"),
])
def test_bad_values_are_refused_in_one_line(overrides: Tuple[str, ...], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(cfg_for(*overrides))
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_policy_an_older_torchrec_lacks_names_the_stack_that_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from runner.config import validation

    assert missing_from_stack("sku_aware", "1.9.2") is None and missing_from_stack("heuristic", "1.6.1") is None
    monkeypatch.setattr(validation, "_installed_torchrec", lambda: "1.6.1")
    with pytest.raises(ConfigError) as err:
        validate(cfg_for("sharding.storage_reserve_policy=fixed_absolute", "sharding.storage_reserve_gib=4"))
    line = str(err.value)
    assert "\n" not in line and "sharding.storage_reserve_policy='fixed_absolute'" in line, line
    assert "a policy TorchRec 1.6.1 has (heuristic, fixed_percent, inference)" in line, line
    assert "first in TorchRec 1.7.0 (the torchrec-1.7 stack of requirements/stacks.toml)" in line, line
    monkeypatch.setattr(validation, "_installed_torchrec", lambda: "1.8.0")
    with pytest.raises(ConfigError, match="torchrec-1.9 stack"):
        validate(cfg_for("sharding.storage_reserve_policy=sku_aware"))
