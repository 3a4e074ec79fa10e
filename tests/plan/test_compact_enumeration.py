"""The balanced planner's compact enumeration gives TorchRec's numbers: every option of every table, shard by
shard (size, offset, storage, perf), equal to TorchRec's own enumerator and estimators, at several sizes, for
every sharding type and kernel the presets use (fused, dense, UVM and UVM-caching on GPUs; the CPU sharder's
types). A mid-size plan (300 tables on 256 GPUs) holds little memory and gives DMP a valid plan."""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest
from test_planning import WIDE, cfg_for
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

from runner.config.tables import table_specs
from runner.plan.plan_file import load_plan, plan_to_dict
from runner.plan.planner import make_plan, planner_inputs
from runner.plan.sharders import sharders_for
from runner.plan.spec import plan_spec
from runner.plan.torchrec_adapter.compact_enumeration import (
    CompactEnumerator,
    expand_all,
    layout_of,
    shard_arrays,
    shard_count,
    shard_storages,
)
from runner.plan.torchrec_adapter.shard_estimators import shard_estimators
from runner.train.models import planning_model

MANY = ("experiment=plan_many_tables",)
POINTS: Dict[str, Tuple[Tuple[str, ...], int, int, str]] = {  # name -> (overrides, world, local, device)
    # all GPU kernels (UVM and UVM-caching too), one table with its own cache load factor, 16 GPUs
    "gpu_all_kernels": (MANY + ("model.generated_tables.count=24", "sharding.compute_kernels=[]",
                                "+sharding.constraints.g003.cache_load_factor=0.3"), 16, 8, "cuda"),
    # 24 GPUs (3 nodes): rows that do not divide evenly, so row-wise options have shards of two or three sizes
    "gpu_uneven_rows": (MANY + ("model.generated_tables.count=30", "cluster=gpu_4x8", "cluster.nodes=3",
                                "cluster.cross_node_bandwidth=3"), 24, 8, "cuda"),
    # the CPU sharder's types (row-wise, table-row-wise and grid shards over gloo too), 2 nodes x 2 workers
    "cpu_every_type": (("cluster=2node", *WIDE, "sharding.types=[table_wise,row_wise,table_row_wise,column_wise,"
                                                   "table_column_wise,grid_shard,data_parallel]"), 4, 2, "cpu"),
}


def _enumerators(point: str):
    overrides, world, local, device = POINTS[point]
    cfg = cfg_for(*overrides)
    topology, batch, constraints = planner_inputs(plan_spec(cfg), world, local, device, None)
    model, sharders = planning_model(cfg), sharders_for(cfg.precision)

    def kwargs():
        return {"topology": topology, "batch_size": batch, "constraints": constraints,
                "estimator": shard_estimators(topology, constraints, plan_spec(cfg).pipeline)}
    theirs = EmbeddingEnumerator(**kwargs()).enumerate(model, sharders)
    ours = CompactEnumerator(**kwargs()).enumerate(model, sharders)
    return theirs, ours, world


@pytest.mark.parametrize("point", sorted(POINTS) + ["gpu_uneven_rows, forked", "cpu_every_type, forked"])
def test_every_option_equals_torchrecs_shard_by_shard(point: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``forked``: the later half of the options estimated in a fork (what a plan of thousands of options does),
    what it set on each option and shard sent back."""
    from runner.plan.torchrec_adapter import parallel_estimates

    point, forked = point.split(", ")[0], point.endswith("forked")
    if forked:
        monkeypatch.setattr(parallel_estimates, "FORK_MIN_OPTIONS", 2)
    before = len(parallel_estimates.FORKED)
    theirs, ours, world = _enumerators(point)
    assert (len(parallel_estimates.FORKED) > before) == forked
    assert len(ours) == len(theirs) > 0
    assert [o.is_weighted for o in ours] == [o.is_weighted for o in theirs]
    kinds = {(o.sharding_type, o.compute_kernel) for o in theirs}
    held_once = 0
    for full, compact, expanded in zip(theirs, ours, expand_all(ours), strict=True):
        key = (full.fqn, full.sharding_type, full.compute_kernel)
        assert (compact.fqn, compact.sharding_type, compact.compute_kernel) == key
        assert layout_of(compact) is not None and shard_count(compact) == len(full.shards)
        held_once += len(compact.shards) < len(full.shards)
        assert len(expanded.shards) == len(full.shards), key
        for mine, torchrec in zip(expanded.shards, full.shards, strict=True):
            assert (mine.size, mine.offset, mine.storage, mine.perf) == \
                   (torchrec.size, torchrec.offset, torchrec.storage, torchrec.perf), key
        assert expanded.storage_hash() == full.storage_hash() and expanded.total_perf == full.total_perf
        perf, mem, rows, summed = shard_arrays(compact)
        assert summed is None or summed.tolist() == mem.sum(0).tolist(), key
        assert perf.tolist() == [s.perf.total for s in full.shards], key
        assert mem.tolist() == [[s.storage.hbm, s.storage.ddr, s.storage.ssd] for s in full.shards], key
        assert sorted(set(map(tuple, rows.tolist()))) == sorted(set(map(tuple, mem.tolist()))), key  # the peak's
        assert shard_storages(compact) == [s.storage for s in full.shards], key
    assert held_once > 0  # row-wise and data-parallel options held their shards once
    if point == "gpu_all_kernels":
        assert {"fused", "fused_uvm", "fused_uvm_caching", "dense"} <= {k for _, k in kinds}, kinds
    if point == "gpu_uneven_rows":
        rw = [o for o in ours if o.sharding_type == "row_wise"]
        assert any(len(o.shards) > 1 for o in rw)  # shards of more than one size, each held once
    if point == "cpu_every_type":
        assert {"row_wise", "table_row_wise", "grid_shard", "column_wise", "table_column_wise", "table_wise",
                "data_parallel"} <= {t for t, _ in kinds}, kinds


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_mid_size_plan_holds_little_memory_and_is_valid(tmp_path: Path) -> None:
    """300 tables on 256 GPUs (32 nodes x 8): TorchRec's enumeration would hold about 150,000 shards; the
    balanced planner holds the distinct ones, and its plan loads as a pinned plan would (every table, every
    shard's rank and size checked against the tables)."""
    cfg = cfg_for(*MANY, "model.generated_tables.count=300", "cluster=gpu_4x8", "cluster.nodes=32",
                  "sharding.balanced_work=500000")
    model = planning_model(cfg)
    before = _rss_bytes()
    notes: List[str] = []
    facts: Dict[str, object] = {}
    plan, best, _, _ = make_plan(plan_spec(cfg), model, 256, 8, "cuda", notes=notes, facts=facts)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before  # at least the plan's own peak
    assert grown < 400 * 2**20, f"planning 300 tables on 256 GPUs grew the process by {grown / 2**20:.0f} MiB"
    assert len(best) == 300 and facts["lower_bound_ms"] is not None
    assert "not tried as a start at this size" in notes[0], notes  # TorchRec's DP start skipped: said
    for option in best:  # TorchRec's full options for the chosen plan: every shard with its rank
        assert all(s.rank is not None for s in option.shards)
        if option.sharding_type in ("row_wise", "data_parallel"):
            assert sorted(s.rank for s in option.shards) == list(range(256))
    path = tmp_path / "plan.json"
    specs = table_specs(cfg.model)
    path.write_text(json.dumps(plan_to_dict(plan, specs)))
    loaded = load_plan(str(path), specs, 256, 8, "cuda")
    placed = {name: p for module in loaded.plan.values() for name, p in module.items()}
    assert len(placed) == 300
    for option in best:
        assert placed[option.name].sharding_type == option.sharding_type
        if option.sharding_type == "data_parallel":  # a copy on every rank: TorchRec gives it no sharding spec
            assert placed[option.name].sharding_spec is None and placed[option.name].ranks == list(range(256))
            continue
        assert [s.placement.rank() for s in placed[option.name].sharding_spec.shards] == \
               [s.rank for s in option.shards]
    assert np.isfinite(facts["lower_bound_ms"])


def test_the_even_row_wise_split_equals_torchrecs_at_many_sizes() -> None:
    """The compact row-wise split (no per-rank list) against TorchRec's own call: every rank's size and offset,
    at table heights around, below and far above the world size (empty ranks, a short last rank, even splits)."""
    import random

    import torch
    from torchrec.distributed.sharding_plan import calculate_shard_sizes_and_offsets

    from runner.plan.torchrec_adapter.compact_enumeration import even_row_wise

    rng = random.Random(7)
    points = [(rows, world) for world in (1, 2, 3, 7, 8, 16, 24) for rows in range(1, 3 * world + 3)]
    points += [(rng.randint(1, 10**9), rng.choice((64, 1000, 1024, 2048))) for _ in range(200)]
    for rows, world in points:
        args = dict(tensor=torch.empty(rows, 16, device="meta"), world_size=world, local_world_size=8,
                    sharding_type="row_wise", col_wise_shard_dim=None, device_memory_sizes=None)
        found = even_row_wise(args)
        assert found is not None
        sizes, offsets = calculate_shard_sizes_and_offsets(**args)
        distinct, first, index = found
        assert [distinct[i] for i in index] == sizes, (rows, world)
        for i, offset in enumerate(first):
            assert offset == offsets[int(np.flatnonzero(index == i)[0])], (rows, world)
        assert len(distinct) == len({tuple(s) for s in sizes}), (rows, world)
    assert even_row_wise({**args, "sharding_type": "table_row_wise"}) is None
