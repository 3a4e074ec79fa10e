"""The runner's dynamic-programming search gives TorchRec's answers: the same proposals in the same order
(random tables with many ties, and a real model's enumerated options), and the same plans and estimates as
TorchRec's own planner with its own proposer, at many points of a bandwidth x reserve study."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import List

import pytest
from test_planning import cfg_for
from torchrec.distributed.planner.proposers import DynamicProgrammingProposer
from torchrec.distributed.planner.types import PlannerError, Storage, Topology

from runner.config.tables import table_specs
from runner.plan.analysis import per_rank_estimates
from runner.plan.cost.topology import dense_bytes
from runner.plan.plan_file import plan_to_dict
from runner.plan.planner import PlanEstimates, build_planner, torchrec_planner
from runner.plan.sharders import sharders_for
from runner.plan.spec import plan_spec
from runner.plan.torchrec_adapter import planning_loop as search_loop
from runner.plan.torchrec_adapter.dp_proposer import SkippingProposer, VectorisedDynamicProgrammingProposer
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


# train.pipeline=base: the points were chosen for memory without the sparse pipeline's second input buffer (TorchRec's
# train_base counts the input and output once); with it, 0.7 has no plan and fewer points differ
BASE = ["model=dnn_many", "model.generated_tables.count=30", "cluster=gpu_2x8", "train.batch_size=512",
        "sharding.compute_kernels=[fused,dense]", "sharding.proposer=dynamic_programming", "train.pipeline=base"]
POINTS = [(1.0, 0.3), (1.0, 0.7), (12.5, 0.3), (12.5, 0.7), (12.5, 0.89)]  # the last: no plan
MORE = [("cluster=gpu_4x8", "sharding.storage_reserve_percent=0.6"),  # 4 nodes
        ("sharding.storage_reserve_policy=heuristic", "sharding.storage_reserve_percent=0.5")]


def _torchrec_plan(cfg, model, world: int = 16, local: int = 8) -> tuple:
    """TorchRec's planner with TorchRec's own dynamic-programming proposer (everything else as the runner's)."""
    estimates = PlanEstimates()
    planner = torchrec_planner(plan_spec(cfg), world, local, "cuda", estimates, dense_bytes(model))
    return planner.plan(model, sharders_for(cfg.precision)), estimates.best_plan


@pytest.mark.slow  # 30 s: make test runs it, make test-fast leaves it out
def test_plans_and_estimates_equal_torchrecs_at_many_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bandwidths x reserves, a 4-node cluster and the heuristic reserve: the same plan and per-rank estimates
    as TorchRec's planner, loop and estimators with its own proposer, or no plan for both; every kind of skip
    was taken somewhere, uniform placements were shared across proposals, a helper process partitioned
    proposals from the start (as a long search does), and none of it changed the answer."""
    monkeypatch.setattr(search_loop, "HELPER_AFTER_S", 0.0)
    model, seen, infeasible, skipped = None, set(), 0, {"unplaceable": 0, "no_room": 0, "bound": 0}
    reused = helped = 0
    points = [(f"cluster.cross_node_bandwidth={x}", f"sharding.storage_reserve_percent={r}") for x, r in POINTS]
    for point in points + MORE:
        cfg = cfg_for(*BASE, *point)
        world, local = cfg.cluster.nodes * cfg.cluster.workers_per_node, cfg.cluster.workers_per_node
        model = model or planning_model(cfg)
        estimates = PlanEstimates()
        planner = build_planner(plan_spec(cfg), world, local, "cuda", estimates, dense_bytes(model))
        proposer = planner._proposers[0]
        assert isinstance(proposer, SkippingProposer)
        try:
            ours = plan_to_dict(planner.plan(model, sharders_for(cfg.precision)), table_specs(cfg.model))
        except PlannerError:
            with pytest.raises(PlannerError):  # no plan for TorchRec's own proposer either
                _torchrec_plan(cfg, model, world, local)
            infeasible += 1
            continue
        finally:
            for kind in skipped:
                skipped[kind] += getattr(proposer, f"skipped_{kind}")
            reused += planner._counts.get("uniform_reused", 0)
            helped += planner._counts.get("helped", 0)
        plan, best = _torchrec_plan(cfg, model, world, local)
        assert ours == plan_to_dict(plan, table_specs(cfg.model)), point
        assert per_rank_estimates(estimates.best_plan, world) == per_rank_estimates(best, world), point
        seen.add(str(ours))
    assert len(seen) >= 4, (len(seen), infeasible)  # the points differ: the comparison compared something
    assert infeasible >= 1 and all(skipped.values()), (infeasible, skipped)
    assert reused > 0  # uniform placements shared across proposals were taken, and changed nothing
    assert helped > 0 or len(os.sched_getaffinity(0)) < 2  # the helper partitioned some: one core, no helper


def test_a_helper_that_dies_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper process dies holding a proposal, after its first answer: what it held is partitioned in the
    planning process, and the plan and estimates are still TorchRec's."""
    from runner.plan.torchrec_adapter import partition_helper as helper

    serve = helper._serve

    def one_answer_then_die(conn, *args) -> None:  # runs in the forked helper
        class Once:
            def __init__(self) -> None:
                self.sent = False

            def recv(self):
                request = conn.recv()
                if self.sent:  # takes the second proposal and dies with it
                    os._exit(1)
                return request

            def send(self, answer) -> None:
                self.sent = True
                conn.send(answer)

        serve(Once(), *args)

    monkeypatch.setattr(search_loop, "HELPER_AFTER_S", 0.0)
    monkeypatch.setattr(helper, "_serve", one_answer_then_die)
    cfg = cfg_for(*BASE, "cluster.cross_node_bandwidth=12.5", "sharding.storage_reserve_percent=0.7")  # 52 partitions
    model = planning_model(cfg)
    estimates = PlanEstimates()
    planner = build_planner(plan_spec(cfg), 16, 8, "cuda", estimates, dense_bytes(model))
    ours = plan_to_dict(planner.plan(model, sharders_for(cfg.precision)), table_specs(cfg.model))
    assert planner._counts.get("helped", 0) >= 2 or len(os.sched_getaffinity(0)) < 2  # it held more than it answered
    plan, best = _torchrec_plan(cfg, model)
    assert ours == plan_to_dict(plan, table_specs(cfg.model))
    assert per_rank_estimates(estimates.best_plan, 16) == per_rank_estimates(best, 16)


PIPELINE_TYPES = ("train_base", "train_sparse_dist", "train_prefetch_sparse_dist")  # TorchRec's PipelineType values


def test_estimators_give_torchrecs_estimates() -> None:
    """Every shard's perf and storage estimate of the runner's estimators (config looked up once, the storage
    estimator told the pipeline) equals TorchRec's estimators called directly with that ``pipeline_type``, on a
    real model's enumerated options, for each pipeline type; ``train_base`` is TorchRec's default (no pipeline),
    and the sparse-dist pipelines' buffers change the GPUs' storage."""
    from torchrec.distributed.planner.constants import DEFAULT_PERF_ESTIMATOR
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.estimator import EmbeddingPerfEstimatorFactory
    from torchrec.distributed.planner.shard_estimators import EmbeddingStorageEstimator
    from torchrec.distributed.types import PipelineType

    from runner.plan.torchrec_adapter.shard_estimators import shard_estimators

    cfg = cfg_for(*BASE, "cluster.cross_node_bandwidth=3", "sharding.compute_kernels=[]")
    model = planning_model(cfg)
    ours = build_planner(plan_spec(cfg), 16, 8, "cuda", None, dense_bytes(model))
    topology, constraints = ours._topology, ours._constraints
    kwargs = {"topology": topology, "batch_size": ours._batch_size, "constraints": constraints}

    def facts(estimator):
        space = EmbeddingEnumerator(**kwargs, estimator=estimator).enumerate(model, sharders_for(cfg.precision))
        return [(o.fqn, o.sharding_type, o.compute_kernel, [(s.perf, s.storage) for s in o.shards]) for o in space]
    by_type = {}
    for pipeline in PIPELINE_TYPES:
        theirs = [EmbeddingPerfEstimatorFactory.create(DEFAULT_PERF_ESTIMATOR, topology=topology,
                                                       constraints=constraints),
                  EmbeddingStorageEstimator(topology=topology, constraints=constraints,
                                            pipeline_type=PipelineType(pipeline))]
        by_type[pipeline] = facts(theirs)
        assert facts(shard_estimators(topology, constraints, pipeline)) == by_type[pipeline], pipeline
    assert by_type["train_base"] == facts(None)  # TorchRec's enumerator's own estimators: no pipeline
    hbm = {p: [s.hbm for *_, shards in f for _, s in shards] for p, f in by_type.items()}
    assert hbm["train_base"] != hbm["train_sparse_dist"] != hbm["train_prefetch_sparse_dist"]
    assert len({kernel for _, _, kernel, _ in by_type["train_base"]}) >= 3  # the kernels' formulas were compared too


@pytest.mark.parametrize("cap, how", [(12, "proposing again without the"), (20, "sharding.proposer=greedy")])
def test_a_plan_where_torchrecs_dynamic_programming_finds_none(cap: int, how: str, tmp_path) -> None:
    """20 tables on 16 GPUs of 12 GiB: every proposal of TorchRec's proposer holds a shard no GPU can hold, the
    runner proposes again without those options; of 20 GiB: that finds no packing either, the greedy proposer
    does. Each plan places every table within the per-GPU budget and says how it was found."""
    from runner.plan.planner import make_plan
    from runner.plan.report import write_plan_report

    cfg = cfg_for(*BASE, "model.generated_tables.count=20", f"cluster.hbm_cap_gib={cap}")
    model = planning_model(cfg)
    with pytest.raises(PlannerError):
        _torchrec_plan(cfg, model)
    notes: List[str] = []
    plan, best, seconds, _ = make_plan(plan_spec(cfg), model, 16, 8, "cuda", notes=notes)
    assert len(notes) == 1 and how in notes[0], notes
    assert {o.name for o in best} == {t.name for t in table_specs(cfg.model)}
    budget = cap * 1024**3 * (1 - cfg.sharding.storage_reserve_percent)
    assert max(r["hbm_bytes"] for r in per_rank_estimates(best, 16)) <= budget
    report = write_plan_report(plan_spec(cfg), plan, best, 16, 8, "cuda", tmp_path, seconds, notes[0])
    assert notes[0] in (tmp_path / "report.md").read_text() and report.tags["runner.plan_note"] == notes[0]


def test_no_packing_line_names_what_stopped_the_search() -> None:
    """Where the dynamic-programming search finds no packing although the tables fit, its line says each table
    has an option that fits on one rank (not that each fits), and what stopped it: how many proposals held a
    shard no rank can hold, naming the largest such favoured option, and how many left a shard no room."""
    from runner.plan.spec import plan_spec
    from runner.plan.torchrec_adapter.runner_planner import explain_planner_error

    cfg = cfg_for(*BASE, "sharding.storage_reserve_percent=0.89")
    model = planning_model(cfg)
    planner = build_planner(plan_spec(cfg), 16, 8, "cuda", PlanEstimates(), dense_bytes(model))
    with pytest.raises(PlannerError) as exc:
        planner.plan(model, sharders_for(cfg.precision))
    line = explain_planner_error(exc.value, planner, plan_spec(cfg), 16, "cuda")
    assert "\n" not in line and "each has an option that fits on one rank" in line, line
    proposer = planner._proposers[0]
    assert proposer.skipped_unplaceable + proposer.skipped_no_room > 0
    assert f"of its proposals, {proposer.skipped_unplaceable} held a shard no rank can hold" in line, line
    assert f"{proposer.skipped_no_room} left a shard no room" in line, line


def test_a_long_plan_shows_its_progress(capsys) -> None:
    """The search reports its counts while it runs; printed (here from the start) as one line each time."""
    from runner.launch.job.plan_only import PlanProgress
    from runner.plan.planner import make_plan

    cfg = cfg_for(*BASE)
    seen: List[dict] = []
    printer = PlanProgress(after_s=0.0, every_s=0.0)
    make_plan(plan_spec(cfg), planning_model(cfg), 16, 8, "cuda", progress=lambda c: (seen.append(c), printer(c)))
    assert seen[0]["phase"] == "estimating" and seen[0]["done"] == seen[0]["of"] > 30, seen[0]
    seen = [c for c in seen if "phase" not in c]  # then the search's counts
    assert seen and seen[0]["options"] > seen[0]["tables"] == 30 and seen[0]["partitioned"] == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith("[runner] planning: ") for line in lines), lines
    assert f"estimating sharding options, {seen[0]['options']} of {seen[0]['options']}" in lines[0], lines
    assert f"{seen[0]['options']} sharding options of 30 tables" in lines[1], lines


def test_torchrec_s_own_loop_shows_its_proposals_as_they_are_partitioned(monkeypatch) -> None:
    """The proposers the runner's loop does not run (TorchRec's default list) run TorchRec's own loop: its proposals
    are counted as its partitioner takes them, so a long search still says how far it is."""
    from runner.plan.planner import make_plan
    from runner.plan.torchrec_adapter import planning_loop

    monkeypatch.setattr(planning_loop._Counted, "EVERY_S", 0.0)
    cfg = cfg_for(*BASE, "sharding.proposer=default")
    seen: List[dict] = []
    make_plan(plan_spec(cfg), planning_model(cfg), 16, 8, "cuda", progress=seen.append)
    searching = [c["detail"] for c in seen if c.get("phase") == "searching"]
    counts = [int(detail.split(", ")[1].split()[0].replace(",", "")) for detail in searching]
    assert len(counts) > 1 and counts == list(range(1, len(counts) + 1)), counts


def test_a_bug_in_the_runners_search_surfaces_instead_of_a_fallback_plan() -> None:
    """TorchRec's planner saying no (PlannerError, or an error raised inside it) is a planner's answer; an error
    raised by the runner's own code is a bug: it surfaces, not a slower fallback plan."""
    from torchrec.distributed.planner.types import PlannerError
    from torchrec.distributed.planner.utils import bytes_to_gb

    from runner.plan.torchrec_adapter.torchrec_seam import planner_refusal

    def raised(fn):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            return exc
        raise AssertionError("did not raise")

    assert planner_refusal(raised(lambda: (_ for _ in ()).throw(PlannerError("no plan"))))
    assert planner_refusal(raised(lambda: bytes_to_gb("not a number")))  # raised inside torchrec
    assert not planner_refusal(raised(lambda: {}["a key the runner forgot"]))  # raised by the runner's code
