"""A calibration exported in TorchRec's own terms (:mod:`runner.plan.cost.torchrec_export`): TorchRec's own planner,
given the exported file and nothing of the runner, estimates every shard as the runner's calibrated plan does."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Tuple

import pytest
from conftest import cfg_for
from test_calibration import _calibration

import runner.cli  # noqa: F401  (schema and resolvers)
from runner.plan.cost.calibration import load_calibration, save
from runner.plan.cost.topology import gibps_to_bytes_per_ms
from runner.plan.cost.torchrec_export import (
    default_export_path,
    export_beside,
    export_calibration_command,
    export_values,
    torchrec_hooks_missing,
)

# one table per sharding type, so that one plan meets every collective TorchRec's estimator asks for
TYPES = {"t0": "row_wise", "t1": "table_wise", "t2": "data_parallel", "t3": "column_wise", "t4": "table_row_wise",
         "t5": "table_wise"}
RS_GIBPS, AR_GIBPS = 0.8, 3.1  # the all-to-all's: 2.0, as fitted from the synthetic measurements


def _import(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"exported_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _calibrated(tmp_path: Path) -> Path:
    """A calibration from synthetic measurements whose reduce-scatter and all-reduce differ from the all-to-all."""
    cal = _calibration()
    c = cal.constants
    collectives = {**c["collectives"], **{name: {"intra": {**c["collectives"][name]["intra"], "bandwidth_gibps": bw}}
                                          for name, bw in (("reduce_scatter", RS_GIBPS), ("all_reduce", AR_GIBPS))}}
    assert c["intra_node_bandwidth"] == pytest.approx(2.0, rel=1e-3)
    return save(cal.with_constants({**c, "collectives": collectives}), tmp_path / "c.calibration.yaml")


def _shards(best: List[Any]) -> Dict[str, Tuple[str, str, List[Any]]]:
    return {o.name: (o.sharding_type, o.compute_kernel, sorted((s.perf for s in o.shards), key=lambda p: p.total))
            for o in best}


def test_torchrec_s_planner_with_the_export_estimates_every_shard_as_the_runner_s_calibrated_plan(
        tmp_path: Path) -> None:
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator

    from runner.plan.planner import PlanEstimates, make_plan, planner_inputs
    from runner.plan.sharders import sharders_for
    from runner.plan.spec import plan_spec
    from runner.train.models import planning_model

    path = _calibrated(tmp_path)
    a2a = load_calibration(path).constants["intra_node_bandwidth"]
    out = tmp_path / "exported" / "h.py"
    assert export_calibration_command([str(path), str(out)]) == 0
    imports = [n for n in ast.walk(ast.parse(out.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert {(n.module if isinstance(n, ast.ImportFrom) else n.names[0].name).split(".")[0] for n in imports} == {
        "typing", "torchrec"}  # TorchRec only: a TorchRec user needs nothing of the runner
    exported = _import(out)
    cfg = cfg_for("mode=plan", f"cluster.calibration={path}",
                  *[f"+sharding.constraints.{t}.sharding_types=[{k}]" for t, k in TYPES.items()])
    spec, model = plan_spec(cfg), planning_model(cfg)
    _, best, _, _ = make_plan(spec, model, 2, 2, "cpu", facts={})
    ours = _shards(best)
    # TorchRec's own planner as a TorchRec user runs it: the exported topology, comms bandwidth and perf config; the
    # same model, batch and per-table constraints (pooling factors, sharding types) as the runner's plan
    _, batch, constraints = planner_inputs(spec, 2, 2, "cpu", None)
    # twice: the file's topology (the measured constants on the topology too), and a user's own Topology with
    # TorchRec's default memory bandwidths and multiplier, given only the comms bandwidth (the config carries the rest)
    for topology in (exported.topology(world_size=2, local_world_size=2),
                     Topology(world_size=2, local_world_size=2, compute_device="cpu",
                              generalized_comms_bandwidths=exported.CalibratedCommsBandwidth())):
        enumerator = EmbeddingEnumerator(
            topology=topology, batch_size=batch, constraints=constraints,
            estimator=[exported.perf_estimator(topology, constraints),
                       EmbeddingStorageEstimator(topology=topology, constraints=constraints)])
        stats = PlanEstimates()
        EmbeddingShardingPlanner(topology=topology, batch_size=batch, enumerator=enumerator, constraints=constraints,
                                 stats=[stats]).plan(model, sharders_for(cfg.precision))
        _same_shards(ours, _shards(stats.best_plan), a2a)


def _same_shards(ours: Dict[str, Tuple[str, str, List[Any]]], theirs: Dict[str, Tuple[str, str, List[Any]]],
                 a2a: float) -> None:
    assert {t: v[0] for t, v in theirs.items()} == TYPES and set(ours) == set(theirs)
    # the runner's topology and the export both answer each collective as measured (a reduce-scatter, the forward
    # of row-wise and table-row-wise shards, with the measured reduce-scatter's bandwidth, not the all-to-all's
    # ``a2a``): every term is equal
    checked = 0
    for table, (kind, kernel, our_perfs) in ours.items():
        assert theirs[table][:2] == (kind, kernel), table
        for mine, theirs_perf in zip(our_perfs, theirs[table][2], strict=True):
            for term in ("fwd_compute", "fwd_comms", "bwd_compute", "bwd_comms", "prefetch_compute"):
                assert getattr(theirs_perf, term) == pytest.approx(getattr(mine, term), rel=1e-9, abs=1e-15), (
                    table, term)
            checked += 1
    assert checked >= len(TYPES) and a2a != RS_GIBPS
    assert all(p.fwd_comms > 0 for p in theirs["t0"][2]) and all(p.bwd_comms > 0 for p in theirs["t2"][2])


def test_the_runner_s_topology_answers_each_measured_collective_and_a_configured_bandwidth_wins(
        tmp_path: Path) -> None:
    from torchrec.distributed.planner.types import CollectiveType

    from runner.plan.cost.topology import build_topology

    cal = load_calibration(_calibrated(tmp_path))
    a2a = cal.constants["intra_node_bandwidth"]
    measured = build_topology(cfg_for().cluster, 2, 2, "cpu", calibration=cal).comms_bandwidths
    assert measured.get_bw(2, 2, CollectiveType.REDUCE_SCATTER) == gibps_to_bytes_per_ms(RS_GIBPS)
    assert measured.get_bw(2, 2, CollectiveType.ALL_REDUCE) == gibps_to_bytes_per_ms(AR_GIBPS)
    assert measured.get_bw(2, 2, CollectiveType.ALL_TO_ALL) == pytest.approx(gibps_to_bytes_per_ms(a2a))
    assert measured.get_bw(2, 2, CollectiveType.ALL_GATHER) == pytest.approx(gibps_to_bytes_per_ms(a2a))
    # a bandwidth the config sets is every collective's of its scope (a sweep's "what if")
    what_if = build_topology(cfg_for("cluster.intra_node_bandwidth=7.0").cluster, 2, 2, "cpu", calibration=cal)
    for kind in (CollectiveType.REDUCE_SCATTER, CollectiveType.ALL_TO_ALL):
        assert what_if.comms_bandwidths.get_bw(2, 2, kind) == gibps_to_bytes_per_ms(7.0)
    # without a calibration: TorchRec's own
    assert type(build_topology(cfg_for().cluster, 2, 2, "cpu").comms_bandwidths).__name__ == "BasicCommsBandwidths"


def test_the_export_answers_each_collective_as_measured_and_torchrec_s_basic_numbers_where_not(
        tmp_path: Path) -> None:
    from torchrec.distributed.planner.types import BasicCommsBandwidths, CollectiveType

    exported = _import(export_beside_path(tmp_path))
    comms = exported.CalibratedCommsBandwidth()
    assert comms.get_bw(2, 2, CollectiveType.REDUCE_SCATTER) == gibps_to_bytes_per_ms(RS_GIBPS)
    assert comms.get_bw(2, 2, CollectiveType.ALL_REDUCE) == gibps_to_bytes_per_ms(AR_GIBPS)
    basic = BasicCommsBandwidths(intra_host_bw=exported.INTRA_HOST_BW, inter_host_bw=gibps_to_bytes_per_ms(12.5))
    # not measured: the all-gather, and everything across nodes (a one-node calibration) answer as TorchRec's
    for local, world, kind in ((2, 2, CollectiveType.ALL_GATHER), (2, 4, CollectiveType.ALL_TO_ALL),
                               (2, 4, CollectiveType.ALL_REDUCE), (2, 4, CollectiveType.REDUCE_SCATTER)):
        assert comms.get_bw(local, world, kind) == basic.get_bw(local, world, kind), kind
    # the kernels' constants ride on the config, which the factory hands to TorchRec's estimator
    config = exported.CalibratedPerfConfig()
    cal = _calibration()
    assert config.get_bwd_compute_multiplier(2.0) == cal.constants["bwd_compute_multiplier"]
    assert config.get_device_bw("cpu", "fused", 1.0, 1.0, 1.0, 1.0) == gibps_to_bytes_per_ms(
        cal.constants["device_bw_gibps"])
    assert config.get_device_bw("cuda", "fused", 7.0, 1.0, 1.0, 1.0) == 7.0  # another device keeps the topology's
    # a part that fell back leaves TorchRec's constant in place
    values = export_values(dataclasses.replace(cal, trusted={**cal.trusted, "collectives": False, "kernels": False}))
    assert values["measured_bw"] == {} and values["intra_host_bw"] == gibps_to_bytes_per_ms(600.0)
    assert values["device_mem_bw"] is None and values["bwd_compute_multiplier"] is None
    assert values["fell_back"] == ["collectives", "kernels"]


def export_beside_path(tmp_path: Path) -> Path:
    """What ``mode=calibrate`` writes beside calibration.yaml (its call, :func:`export_beside`)."""
    line = export_beside(load_calibration(_calibrated(tmp_path)), tmp_path / "calibration" / "calibration.yaml")
    assert line.startswith("for TorchRec's own planner") and "calibration_torchrec.py" in line
    return tmp_path / "calibration" / "calibration_torchrec.py"


def test_a_file_that_cannot_be_exported_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = _calibrated(tmp_path)
    assert default_export_path(path) == tmp_path / "c_torchrec.py"
    assert default_export_path(tmp_path / "20260601-000000-cpu-x-1x2.calibration.yaml").name == \
        "calibration_20260601_000000_cpu_x_1x2_torchrec.py"
    edited = tmp_path / "edited.calibration.yaml"
    edited.write_text(path.read_text().replace("bwd_compute_multiplier: ", "bwd_compute_multiplier: 1", 1))
    cases = {(str(edited),): f"{edited} cannot be exported: it was changed after it was written",
             (str(tmp_path / "none.yaml"),): "cannot be exported: it cannot be read",
             (): "expected python -m runner export-calibration <calibration.yaml> [out.py]",
             (str(path), str(tmp_path / "out.txt")): "name one ending in .py"}
    for args, words in cases.items():
        capsys.readouterr()
        assert export_calibration_command(list(args)) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and words in err, err
    # a TorchRec without the hooks: one line naming the stacks that have them, and nothing written
    monkeypatch.setitem(sys.modules, "torchrec.distributed.planner.estimator", None)
    line = torchrec_hooks_missing()
    assert line is not None and "has no HardwarePerfConfig" in line and "TorchRec 1.6.1 on has them" in line
    assert export_calibration_command([str(path)]) == 2 and "torchrec-1.6 stack" in capsys.readouterr().err
    assert export_beside(_calibration(), tmp_path / "beside" / "c.yaml").startswith(
        "not exported for TorchRec's own planner: TorchRec ")
    assert not (tmp_path / "beside").exists() and not default_export_path(path).exists()
