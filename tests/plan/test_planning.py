"""Planning without processes: the real TorchRec planner on a meta model, plans read back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
from conftest import cfg_for
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from torchrec.distributed.planner.constants import CROSS_NODE_BANDWIDTH, INTRA_NODE_BANDWIDTH

import runner.cli  # noqa: F401  (schema and resolvers)
from runner.config.errors import ConfigError, PlanError
from runner.config.tables import table_specs
from runner.plan.analysis import comms_per_rank
from runner.plan.cost.topology import gibps_to_bytes_per_ms
from runner.plan.plan_file import load_plan, plan_to_dict
from runner.plan.planner import make_plan
from runner.plan.spec import plan_spec
from runner.train.models import build_model
from runner.train.optimizers import apply_sparse_optimizer

ROOT = Path(__file__).resolve().parents[2]
# dim 256: TorchRec splits columns only at widths >= 128, so column/grid shards are real splits
WIDE = ["model.embedding_dim=256", "model.dense_arch_layer_sizes=[256]"]


def plan_for(cfg, world: int = 2, local: int = 2, device: str = "cpu"):
    model = build_model(cfg, torch.device("meta"))
    apply_sparse_optimizer(model, cfg.optimizer)
    plan, best, _, _ = make_plan(plan_spec(cfg), model, world, local, device)
    return plan_to_dict(plan, table_specs(cfg.model)), best


def types_of(plan: dict) -> dict:
    return {t: p["sharding_type"] for tables in plan.values() for t, p in tables.items()}


def test_config_bandwidths_are_gib_per_s_like_torchrec_defaults() -> None:
    assert gibps_to_bytes_per_ms(600.0) == pytest.approx(INTRA_NODE_BANDWIDTH)
    assert gibps_to_bytes_per_ms(12.5) == pytest.approx(CROSS_NODE_BANDWIDTH)


@pytest.mark.parametrize("option,expected,world,local", [
    ("rowwise", "row_wise", 2, 2), ("tablewise", "table_wise", 2, 2), ("columnwise", "column_wise", 2, 2),
    ("tablecolumnwise", "table_column_wise", 2, 2), ("dataparallel", "data_parallel", 2, 2),
    ("tablerowwise", "table_row_wise", 4, 2), ("gridshard", "grid_shard", 4, 2),
])
def test_each_sharding_option_gives_that_type_for_every_table_on_cpu(option, expected, world, local) -> None:
    plan, _ = plan_for(cfg_for(f"sharding={option}", *WIDE), world, local)
    assert set(types_of(plan).values()) == {expected}
    for tables in plan.values():
        for p in tables.values():
            if expected in ("column_wise", "table_column_wise", "grid_shard"):
                assert len({s["offsets"][1] for s in p["shards"]}) > 1  # really split by columns
            if expected == "data_parallel":
                assert p["compute_kernel"] == "dense" and p["shards"] == []
            else:
                assert p["compute_kernel"] == "fused"


def test_per_table_constraints_override_the_group() -> None:
    cfg = cfg_for("sharding=tablewise", "+sharding.constraints.t0.sharding_types=[row_wise]",
                  "+sharding.constraints.t5.sharding_types=[data_parallel]")
    types = types_of(plan_for(cfg)[0])
    assert types.pop("t0") == "row_wise" and types.pop("t5") == "data_parallel"
    assert set(types.values()) == {"table_wise"}


def test_constraint_on_unknown_table_is_refused() -> None:
    with pytest.raises(ConfigError, match="sharding.constraints.nope"):
        cfg_for("+sharding.constraints.nope.sharding_types=[row_wise]")


def test_kernel_the_cpu_cannot_run_fails_in_one_line() -> None:
    with pytest.raises(PlanError) as e:
        plan_for(cfg_for("sharding=rowwise", "sharding.compute_kernels=[fused_uvm_caching]"))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("proposer", ["default", "dynamic_programming", "greedy", "uniform"])
def test_every_proposer_plans(proposer: str) -> None:
    # the dynamic-programming proposer bins HBM: plan for GPUs
    plan, best = plan_for(cfg_for(f"sharding.proposer={proposer}"), 2, 2, "cuda")
    assert len(types_of(plan)) == 6 and len(best) == 6
    if proposer == "uniform":
        assert len(set(types_of(plan).values())) == 1


def test_grid_search_plans_small_models_and_refuses_big_searches_in_one_line() -> None:
    two = "model.tables=[{name:a,num_embeddings:1000},{name:b,num_embeddings:500}]"
    plan, _ = plan_for(cfg_for("sharding.proposer=grid_search", two))
    assert set(types_of(plan)) == {"a", "b"}
    with pytest.raises(PlanError, match="grid_max_proposals=10000"):
        plan_for(cfg_for("sharding.proposer=grid_search"))


def test_dynamic_programming_on_cpu_is_refused_in_one_line() -> None:
    with pytest.raises(PlanError, match="sharding.proposer='dynamic_programming'"):
        plan_for(cfg_for("sharding.proposer=dynamic_programming"))


def test_reserve_too_high_names_table_and_budget() -> None:
    ok = cfg_for("cluster.ddr_cap_gib=0.05", "sharding.storage_reserve_policy=fixed",
                 "sharding.storage_reserve_percent=0.1")
    plan_for(ok)
    tight = cfg_for("cluster.ddr_cap_gib=0.05", "sharding.storage_reserve_policy=fixed",
                    "sharding.storage_reserve_percent=0.95")
    with pytest.raises(PlanError) as e:
        plan_for(tight)
    msg = str(e.value)
    assert "t0" in msg and "0.95" in msg and "GiB" in msg and "\n" not in msg


def test_plan_json_round_trips_through_load_plan(tmp_path: Path) -> None:
    cfg = cfg_for("sharding=gridshard", *WIDE)
    plan, _ = plan_for(cfg, 4, 2)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    loaded = load_plan(str(path), table_specs(cfg.model), 4, 2, "cpu")
    assert plan_to_dict(loaded, table_specs(cfg.model)) == plan


def test_pinned_plan_errors_are_one_line(tmp_path: Path) -> None:
    cfg = cfg_for("sharding=rowwise", "cluster=2node")
    plan, _ = plan_for(cfg, 4, 2)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    specs = table_specs(cfg.model)
    with pytest.raises(PlanError, match="no such file"):
        load_plan(str(tmp_path / "missing.json"), specs, 4, 2, "cpu")
    with pytest.raises(PlanError, match="rank 3 but this job has 2 ranks"):
        load_plan(str(path), specs, 2, 2, "cpu")
    with pytest.raises(PlanError, match="do not match the model"):
        load_plan(str(path), specs[:3], 4, 2, "cpu")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(PlanError, match="not a plan JSON"):
        load_plan(str(tmp_path / "bad.json"), specs, 4, 2, "cpu")


def test_comms_follow_topology() -> None:
    cfg = cfg_for("sharding=tablewise")
    plan, _ = plan_for(cfg, 4, 2)
    two_nodes = comms_per_rank(plan, 4, 2, 128, {})
    one_node = comms_per_rank(plan, 4, 4, 128, {})
    assert max(two_nodes["cross_node_bytes"]) > 0
    assert one_node["cross_node_bytes"] == [0.0] * 4
    assert sum(one_node["intra_node_bytes"]) == pytest.approx(
        sum(two_nodes["intra_node_bytes"]) + sum(two_nodes["cross_node_bytes"]))


def test_data_parallel_traffic_is_a_ring_all_reduce() -> None:
    cfg = cfg_for("sharding=dataparallel")
    plan, _ = plan_for(cfg, 2, 2)
    comms = comms_per_rank(plan, 2, 2, 128, {})
    table_bytes = sum(t.num_embeddings * t.embedding_dim * 4 for t in table_specs(cfg.model))
    assert comms["intra_node_bytes"][0] == pytest.approx(2 * (2 - 1) / 2 * table_bytes)


def test_plans_for_a_16_gpu_cluster_on_this_machine() -> None:
    cfg = cfg_for("cluster=gpu_2x8", "mode=plan")
    plan, best = plan_for(cfg, 16, 8, "cuda")
    ranks = {s["rank"] for tables in plan.values() for p in tables.values() for s in p["shards"]}
    assert ranks and max(ranks) <= 15 and len(best) == 6


def test_generated_tables_are_deterministic_and_mixed() -> None:
    cfg = cfg_for("model=dnn_many")
    specs = table_specs(cfg.model)
    assert len(specs) == 100 and specs == table_specs(cfg.model)
    rows = [s.num_embeddings for s in specs]
    assert min(rows) >= 1000 and max(rows) <= 100_000_000 and max(rows) / min(rows) > 1e4
    assert {s.embedding_dim for s in specs} == {32, 64, 128, 256}


def test_ids_per_feature_is_the_planners_pooling_factor() -> None:
    from runner.plan.planner import build_constraints

    cfg = cfg_for("data.ids_per_feature=3", "+sharding.constraints.t1.pooling_factor=7")
    constraints = build_constraints(cfg.sharding, [t.name for t in table_specs(cfg.model)], 3.0)
    assert constraints["t0"].pooling_factors == [3.0] and constraints["t1"].pooling_factors == [7.0]
    plan_many, _ = plan_for(cfg)
    assert len(types_of(plan_many)) == 6


def test_split_step_plans_leave_out_data_parallel() -> None:
    from runner.config.schema import uses_split_step
    from runner.plan.planner import build_constraints

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        plain = compose(config_name="config")
        accum = compose(config_name="config", overrides=["train.grad_accumulation_steps=2"])
        fp16 = compose(config_name="config", overrides=["precision=fp16"])
    assert not uses_split_step(plain.train, plain.precision) and uses_split_step(accum.train, accum.precision) \
        and uses_split_step(fp16.train, fp16.precision)
    free = build_constraints(accum.sharding, ["t0", "t1"], 1.0, ("data_parallel",))
    assert all("data_parallel" not in c.sharding_types and "row_wise" in c.sharding_types for c in free.values())
    assert build_constraints(plain.sharding, ["t0", "t1"], 1.0) == {}


def test_pinned_plan_keeps_cache_and_hbm_settings(tmp_path: Path) -> None:
    """A planned fused_uvm_caching table's cache parameters and enforce_hbm survive plan.json."""
    cfg = cfg_for("cluster.device=cuda", "+sharding.constraints.t0.compute_kernels=[fused_uvm_caching]",
                  "+sharding.constraints.t0.cache_load_factor=0.3", "+sharding.constraints.t0.enforce_hbm=true")
    model = build_model(cfg, torch.device("meta"))
    apply_sparse_optimizer(model, cfg.optimizer)
    planned, _, _, _ = make_plan(plan_spec(cfg), model, 2, 2, "cuda")
    as_dict = plan_to_dict(planned, table_specs(cfg.model))
    t0 = next(tables["t0"] for tables in as_dict.values() if "t0" in tables)
    assert t0["compute_kernel"] == "fused_uvm_caching" and t0["cache_params"]["load_factor"] == 0.3, t0
    assert t0["enforce_hbm"] is True
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(as_dict))
    loaded = load_plan(str(path), table_specs(cfg.model), 2, 2, "cuda")
    for module, tables in planned.plan.items():
        for table, ps in tables.items():  # type: ignore[union-attr]
            again = loaded.plan[module][table]  # type: ignore[index]
            assert (again.cache_params, again.enforce_hbm, again.stochastic_rounding, again.bounds_check_mode,
                    again.output_dtype) == (ps.cache_params, ps.enforce_hbm, ps.stochastic_rounding,
                                            ps.bounds_check_mode, ps.output_dtype), table
    assert plan_to_dict(loaded, table_specs(cfg.model)) == as_dict


def test_a_table_with_fewer_rows_than_its_row_shards_is_refused_on_cpu_in_one_line() -> None:
    """Found by make fuzz-config: a 1-row table split row-wise over 2 CPU ranks left rank 1 an empty shard, and
    FBGEMM's CPU kernel failed at the first step with an unexpected error. The plan is refused, naming the table
    and what to do; on GPUs (where empty shards run) the same plan stands."""
    from runner.config.errors import PlanError
    from runner.plan.planner import make_plan
    from runner.train.models import planning_model

    for types in ("rowwise", "tablerowwise"):
        cfg = cfg_for(f"sharding={types}", "model.tables=[{name:a,num_embeddings:1},{name:b,num_embeddings:100}]")
        with pytest.raises(PlanError) as refused:
            make_plan(plan_spec(cfg), planning_model(cfg), 2, 2, "cpu")
        assert str(refused.value).startswith("table a (1 row(s)) is split over 2 shards (")
        assert "+sharding.constraints.a.sharding_types=[table_wise]" in str(refused.value)
    plan, *_ = make_plan(plan_spec(cfg), planning_model(cfg), 2, 2, "cuda")
    assert plan.plan


def _pairwise_comms(plan: Dict[str, Any], world: int, local: int, batch: int) -> Dict[str, List[float]]:
    """The traffic model, one send per pair of ranks (the reference the bulk sums must equal)."""
    intra, cross = [0.0] * world, [0.0] * world

    def send(src: int, dst: int, n: float) -> None:
        if src != dst:
            (intra if src // local == dst // local else cross)[src] += n

    for tables in plan.values():
        for p in tables.values():
            if p["sharding_type"] == "data_parallel":
                for r in range(world):
                    send(r, (r + 1) % world, 2 * (world - 1) / world * p["rows"] * p["dim"] * 4)
                continue
            cols: Dict[int, List[Dict[str, Any]]] = {}
            for s in p["shards"]:
                cols.setdefault(s["offsets"][1], []).append(s)
            for shards in cols.values():
                owners, width = sorted({s["rank"] for s in shards}), shards[0]["sizes"][1]
                if p["sharding_type"] in ("row_wise", "table_row_wise"):
                    n = len(owners)
                    for r in range(world):
                        for o in owners:
                            send(r, o, batch * 8 / n)
                    for o in owners:
                        for d in range(world):
                            send(o, d, (world if d in owners else 1) * batch * width * 4 / n)
                            send(d, o, batch * width * 4 / n)
                else:
                    for o in owners:
                        for r in range(world):
                            send(r, o, batch * 8)
                            send(r, o, batch * width * 4)
                            send(o, r, batch * width * 4)
    return {"intra_node_bytes": intra, "cross_node_bytes": cross}


def test_the_traffic_sums_equal_one_send_per_pair_of_ranks() -> None:
    """comms_per_rank's bulk sums against the pairwise model, on random plans of every traffic pattern."""
    import random

    rng = random.Random(3)
    for world, local in ((1, 1), (4, 2), (8, 8), (24, 8), (32, 4)):
        tables = {}
        for i in range(30):
            kind = rng.choice(["table_wise", "column_wise", "row_wise", "table_row_wise", "data_parallel"])
            width = rng.choice([16, 32, 64])
            if kind == "row_wise":
                ranks = list(range(world))
            elif kind == "table_row_wise":
                node = rng.randrange(world // local)
                ranks = list(range(node * local, (node + 1) * local))
            else:
                ranks = [rng.randrange(world) for _ in range(1 if kind == "table_wise" else 2)]
            shards = [{"rank": r, "sizes": [10, width], "offsets": [0, j * width if kind == "column_wise" else 0]}
                      for j, r in enumerate(ranks)]
            tables[f"t{i}"] = {"sharding_type": kind, "shards": shards, "rows": 100 + i, "dim": width}
        plan = {"ebc": tables}
        bulk, pairs = comms_per_rank(plan, world, local, 64, {}), _pairwise_comms(plan, world, local, 64)
        for key in pairs:
            assert bulk[key] == pytest.approx(pairs[key], rel=1e-12, abs=1e-6), (world, local, key)


@pytest.mark.parametrize("sparse", ["sgd", "rowwise_adagrad", "adam"])
def test_a_planned_model_marked_with_its_optimizer_enumerates_as_one_given_the_optimizers(sparse: str) -> None:
    """``planning_model`` records each table's fused optimizer without building one per table
    (``mark_sparse_optimizer``): TorchRec enumerates the same options, storage and perf as after
    ``apply_optimizer_in_backward``."""
    from runner.plan.planner import build_planner
    from runner.plan.sharders import sharders_for
    from runner.train.optimizers import mark_sparse_optimizer, sparse_optimizer

    cfg = cfg_for("mode=plan", "cluster=gpu_2x8", f"optimizer.sparse={sparse}")
    found = []
    for mark in (apply_sparse_optimizer, mark_sparse_optimizer):
        model = build_model(cfg, torch.device("meta"))
        mark(model, cfg.optimizer)
        planner = build_planner(plan_spec(cfg), 16, 8, "cuda")
        options = planner._enumerator.enumerate(module=model, sharders=sharders_for(cfg.precision))
        found.append([(o.fqn, o.sharding_type, o.compute_kernel, o.tensor._optimizer_classes,
                       [(s.storage.hbm, s.storage.ddr, s.perf.total) for s in o.shards]) for o in options])
    assert found[0] == found[1] and len(found[0]) > 10
    assert {tuple(o[3]) for o in found[0]} == {(sparse_optimizer(cfg.optimizer)[0],)}


def test_a_pinned_plan_whose_placement_is_not_one_is_one_line(tmp_path: Path) -> None:
    """make fuzz-files: a rank or shard offset turned negative reached TorchRec (a ValueError naming no file), a
    rank list emptied or NaN offsets were taken; each is now refused naming the file and the table."""
    cfg = cfg_for("sharding=tablecolumnwise")
    specs = table_specs(cfg.model)
    plan, _ = plan_for(cfg, 2, 2)
    path = tmp_path / "plan.json"
    table = next(t for tables in plan.values() for t in tables.values() if t["shards"])
    for key, value in (("rank", -1), ("offsets", [-1, 0]), ("offsets", [float("nan"), 0]), ("sizes", "x")):
        damaged = json.loads(json.dumps(plan))
        entry = next(t for tables in damaged.values() for t in tables.values() if t == table)
        entry["shards"][0][key] = value
        path.write_text(json.dumps(damaged))
        with pytest.raises(PlanError, match=f"sharding.plan={path}: table .*: shards=.* are not shards"):
            load_plan(str(path), specs, 2, 2, "cpu")
    for key, value in (("ranks", []), ("ranks", [-1]), ("sharding_type", "diagonal"), ("compute_kernel", 3)):
        damaged = json.loads(json.dumps(plan))
        next(iter(next(iter(damaged.values())).values()))[key] = value
        path.write_text(json.dumps(damaged))
        with pytest.raises(PlanError, match=f"sharding.plan={path}: table .*: {key}="):
            load_plan(str(path), specs, 2, 2, "cpu")
