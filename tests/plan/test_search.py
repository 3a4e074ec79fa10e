"""The runner's dynamic-programming search gives TorchRec's answers: the same proposals in the same order
(random tables with many ties, and a real model's enumerated options), and the same plans and estimates as
TorchRec's own planner with its own proposer, at many points of a bandwidth x reserve study."""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import List

import pytest
from test_planning import cfg_for
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.proposers import DynamicProgrammingProposer
from torchrec.distributed.planner.types import PlannerError, Storage, Topology

from runner.config.tables import table_specs
from runner.plan.analysis import per_rank_estimates
from runner.plan.io import plan_to_dict
from runner.plan.planner import PlanEstimates, build_planner
from runner.plan.search import SkippingProposer, VectorisedDynamicProgrammingProposer
from runner.plan.sharders import sharders_for
from runner.plan.topology import dense_bytes
from runner.train.models import planning_model


@dataclass(eq=False)
class _Option:  # what the proposer reads of a sharding option
    fqn: str
    total_storage: Storage
    total_perf: float


def _proposals(proposer: DynamicProgrammingProposer, space: list, topology: Topology) -> List[List[int]]:
    proposer.load(space)
    proposer.propose()
    proposer.feedback(partitionable=True, storage_constraint=topology)
    return proposer._proposal_list


def _compare(seed: int) -> int:
    """TorchRec's proposals and the vectorised ones for random tables; how many there were."""
    rng = random.Random(seed)
    world, bins = rng.choice([2, 4, 8]), rng.choice([5, 20, 100])
    cap = rng.choice([1, 4, 16]) * 1024**3
    topology = Topology(world_size=world, compute_device="cuda", hbm_cap=cap)
    space, tables = [], rng.randint(1, 25)
    for t in range(tables):
        for _ in range(rng.randint(1, 6)):  # coarse values: many ties in perf and in bins; some too big
            hbm = rng.choice([0, 1, 2, 3, 8, 40]) * cap * world // (8 * tables * rng.choice([1, 2, 4]))
            space.append(_Option(f"t{t}", Storage(hbm=hbm, ddr=0), float(rng.randint(1, 8))))
    theirs = _proposals(DynamicProgrammingProposer(hbm_bins_per_device=bins), space, topology)
    ours = _proposals(VectorisedDynamicProgrammingProposer(hbm_bins_per_device=bins), space, topology)
    assert ours == theirs, seed
    return len(theirs)


def test_vectorised_dp_proposes_what_torchrec_proposes() -> None:
    counts = [_compare(seed) for seed in range(60)]
    assert sum(c > 20 for c in counts) > 20, counts  # most cases had many proposals to agree on


BASE = ["model=dnn_many", "model.generated_tables.count=30", "cluster=gpu_2x8", "train.batch_size=512",
        "sharding.compute_kernels=[fused,dense]", "sharding.proposer=dynamic_programming"]
POINTS = [(1.0, 0.3), (1.0, 0.7), (12.5, 0.3), (12.5, 0.7), (12.5, 0.89)]  # the last: no plan


def _torchrec_plan(cfg, model, world: int = 16, local: int = 8) -> tuple:
    """TorchRec's planner with TorchRec's own dynamic-programming proposer (everything else as the runner's)."""
    estimates = PlanEstimates()
    ours = build_planner(cfg, world, local, "cuda", estimates, dense_bytes(model))
    planner = EmbeddingShardingPlanner(topology=ours._topology, batch_size=ours._batch_size,
                                       storage_reservation=copy.deepcopy(ours._storage_reservation),
                                       proposer=DynamicProgrammingProposer(hbm_bins_per_device=cfg.sharding.dp_hbm_bins),
                                       constraints=ours._constraints, stats=[estimates], debug=False)
    return planner.plan(model, sharders_for(cfg.precision)), estimates.best_plan


def test_plans_and_estimates_equal_torchrecs_at_many_points() -> None:
    model, seen, infeasible = None, set(), 0
    for xbw, reserve in POINTS:
        cfg = cfg_for(*BASE, f"cluster.cross_node_bandwidth={xbw}", f"sharding.storage_reserve_percent={reserve}")
        model = model or planning_model(cfg)
        estimates = PlanEstimates()
        planner = build_planner(cfg, 16, 8, "cuda", estimates, dense_bytes(model))
        assert isinstance(planner._proposers[0], SkippingProposer)
        try:
            ours = plan_to_dict(planner.plan(model, sharders_for(cfg.precision)), table_specs(cfg.model))
        except PlannerError:
            with pytest.raises(PlannerError):  # no plan for TorchRec's own proposer either
                _torchrec_plan(cfg, model)
            infeasible += 1
            continue
        plan, best = _torchrec_plan(cfg, model)
        assert ours == plan_to_dict(plan, table_specs(cfg.model)), (xbw, reserve)
        assert per_rank_estimates(estimates.best_plan, 16) == per_rank_estimates(best, 16), (xbw, reserve)
        seen.add(str(ours))
    assert len(seen) >= 3, (len(seen), infeasible)  # the points differ: the comparison compared something
