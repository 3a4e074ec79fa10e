"""What each of the planner's speed-ups (``runner/plan/torchrec_adapter/``) buys today: the runner's planner timed
with everything on, then with one speed-up at a time put back to TorchRec's own call, on the same inputs, in
this process. Each run must give the same plan (its estimated step, to the last digit): speed never changes
answers.

    .venv/bin/python benchmarks/speedups.py [--tables 300 --ranks 64] [--big 1000x128] [--sweep 4]

- ``dataclass_copies`` off: Python's ``copy.deepcopy`` for shards, storage, perf and devices.
- ``shared_placements`` off: TorchRec's partitioner places every proposal's row-wise and data-parallel
  options from scratch.
- ``partition_helper`` off: no second process partitions proposals of a long search.
- ``shard_estimators`` off: TorchRec's perf estimator looks its config up as TorchRec does.
- ``enumeration_reuse`` off: each point of a ``--sweep``-point bandwidth sweep enumerates again (the on/off
  figures are the whole sweep's).
- the loop and the proposers (``planning_loop``, ``dp_proposer``, ``greedy_proposers``) are not separable
  from each other; with all three off the planner is TorchRec's own: ``make bench-plan-scale`` times it.

Prints ``speedups: tables=.. ranks=.. all_on_s=.. | <speed-up> off_s=.. buys=..x same_plan=yes ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _config(tables: int, ranks: int, extra: Tuple[str, ...] = ()) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import runner.cli  # noqa: F401  (schema and resolvers)

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=["experiment=plan_many_tables", "cluster=gpu_4x8",
                                            "sharding.proposer=dynamic_programming",
                                            f"model.generated_tables.count={tables}", f"cluster.nodes={ranks // 8}",
                                            *extra])


def _plan(cfg: Any, ranks: int, reuse: bool = False) -> Tuple[float, float]:
    """Seconds of one call of the runner's planner, and its plan's estimated step (ms)."""
    from runner.plan.cost.topology import dense_bytes
    from runner.plan.planner import PlanEstimates, build_planner, reusable_model
    from runner.plan.sharders import sharders_for
    from runner.plan.spec import plan_spec
    from runner.train.models import planning_model

    model = reusable_model(plan_spec(cfg), lambda: planning_model(cfg))
    estimates = PlanEstimates()
    t0 = time.perf_counter()
    planner = build_planner(plan_spec(cfg), ranks, 8, "cuda", estimates, dense_bytes(model), reuse=reuse)
    planner.plan(model, sharders_for(cfg.precision))
    seconds = time.perf_counter() - t0
    per_rank: Dict[int, float] = {}
    for option in estimates.best_plan:
        for shard in option.shards:
            per_rank[shard.rank] = per_rank.get(shard.rank, 0.0) + shard.perf.total
    return seconds, round(max(per_rank.values()), 6)


SPEEDUPS = ("dataclass_copies", "shared_placements", "partition_helper", "shard_estimators")  # what _off puts back


@contextlib.contextmanager
def _off(name: str) -> Iterator[None]:
    """The speed-up ``name`` put back to TorchRec's (or Python's) own call while open."""
    from runner.plan.torchrec_adapter import planning_loop
    from runner.plan.torchrec_adapter import runner_planner as planner

    saved: List[Tuple[Any, str, Any]] = []

    def patch(owner: Any, attr: str, value: Any) -> None:
        saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)

    if name == "dataclass_copies":
        patch(planning_loop, "quick_copies", contextlib.nullcontext)
    elif name == "shared_placements":
        class _Counts:
            reused = placed = 0

        patch(planning_loop, "shared_uniform_prefixes", lambda devices: contextlib.nullcontext(_Counts()))
    elif name == "partition_helper":
        patch(planning_loop, "HELPER_AFTER_S", float("inf"))
    elif name == "shard_estimators":
        from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator

        from runner.plan.torchrec_adapter.shard_estimators import storage_estimator

        # TorchRec's perf estimator as it comes (its config looked up per shard); the storage estimator the same
        patch(planner, "shard_estimators", lambda topology, constraints, pipeline: [
            EmbeddingPerfEstimator(topology=topology, constraints=constraints),
            storage_estimator(topology, constraints, pipeline)])
    try:
        yield
    finally:
        for owner, attr, value in reversed(saved):
            setattr(owner, attr, value)


def _clear_reuse() -> None:
    from runner.plan.torchrec_adapter import enumeration_reuse

    enumeration_reuse._OPTIONS.clear()


def one_scale(tables: int, ranks: int) -> str:
    cfg = _config(tables, ranks)
    _plan(cfg, ranks)  # warm: imports, the model on meta, the first enumeration's caches
    on_s, on_ms = _plan(cfg, ranks)
    parts = [f"speedups: tables={tables} ranks={ranks} all_on_s={on_s:.1f} est_step_ms={on_ms}"]
    for name in SPEEDUPS:
        with _off(name):
            off_s, off_ms = _plan(cfg, ranks)
        same = "yes" if off_ms == on_ms else "NO"
        parts.append(f"{name} off_s={off_s:.1f} buys={off_s / on_s:.2f}x same_plan={same}")
        print(f"[speedups] {parts[-1]}", flush=True)
    return " | ".join(parts)


def sweep(tables: int, ranks: int, points: int) -> str:
    bandwidths = [12.5 * 2 ** i for i in range(points)]  # where the dynamic-programming proposer finds a plan
    configs = [_config(tables, ranks, (f"cluster.cross_node_bandwidth={bw}",)) for bw in bandwidths]
    runs: Dict[bool, Tuple[float, List[float]]] = {}
    for reuse in (True, False):
        _clear_reuse()
        t0 = time.perf_counter()
        answers = [_plan(cfg, ranks, reuse=reuse)[1] for cfg in configs]
        runs[reuse] = (time.perf_counter() - t0, answers)
    on, off = runs[True], runs[False]
    return (f"speedups sweep: tables={tables} ranks={ranks} points={points} enumeration_reuse on_s={on[0]:.1f} "
            f"off_s={off[0]:.1f} buys={off[0] / on[0]:.2f}x same_plans={'yes' if on[1] == off[1] else 'NO'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=300)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--big", default="1000x128", help="a second scale, TABLESxRANKS ('' for none)")
    parser.add_argument("--sweep", type=int, default=4, help="points of the bandwidth sweep (0: none)")
    args = parser.parse_args()
    import logging
    import warnings

    logging.getLogger("torchrec").setLevel(logging.ERROR)  # the planner's notes, per planner built
    warnings.simplefilter("ignore", FutureWarning)
    lines: List[str] = [one_scale(args.tables, args.ranks)]
    if args.big:
        tables, ranks = (int(x) for x in args.big.split("x"))
        lines.append(one_scale(tables, ranks))
    if args.sweep:
        lines.append(sweep(args.tables, args.ranks, args.sweep))
    for line in lines:
        print(line)
    return 0 if all("NO" not in line for line in lines) else 1

if __name__ == "__main__":
    sys.exit(main())
