"""How good the balanced proposer's plans are, and how fast, at the scales users plan: two real sweeps of
the runner, each point's plan against TorchRec's proposers and the lower bound, in one run.

    .venv/bin/python benchmarks/plan_quality.py [--greedy all|none|N] [--small 300] [--big 1000]

- Grids (``experiment=plan_many_tables cluster=gpu_4x8``, ``sharding.proposer=balanced``): 300 tables on
  8 x 8 GPUs, cross-node bandwidth 3, 6, 12.5, 25, 50 GiB/s x storage reserve 0.05, 0.15, 0.3 (15 points);
  1000 tables on 16 x 8 GPUs, 3, 12.5, 50 x 0.05, 0.15, 0.3 (9 points). Each grid is one
  ``python -m runner -m ...`` sweep, timed whole (``runner_s``).
- Per point: the balanced plan's estimated step (TorchRec's rating: the busiest rank's summed shard perf),
  TorchRec's dynamic-programming plan's (the run's ``plan/torchrec_dynamic_programming_ms``: TorchRec's own
  answer, found faster, as ``sharding.proposer=dynamic_programming`` gives it; where the balanced planner did
  not use it as a start, above 100,000 shards, found in this process the same way), TorchRec's greedy
  proposers' (300 tables only: ``sharding.proposer=greedy`` in this process, TorchRec's plan found faster,
  about 6 s a point), and the lower bound (``plan/lower_bound_ms``).
- ``worse``: points where the balanced plan rates worse than TorchRec's DP or greedy plan.
- ``violations``: pairs of points (A, B) where B's plan, valid at A, rates better at A than A's own plan
  (each point's options enumerated again here, with TorchRec's enumerator). More bandwidth or less reserve
  giving a slower plan is one of them.
- Single commands: the 12.5 GiB/s, 0.15 point of each grid as one ``python -m runner mode=plan`` command.

Ends with ``plan-quality: tables=300 ranks=64 points=15 worse=.. median_gap=..% max_gap=..% violations=..
runner_s=.. | tables=1000 ranks=128 points=9 ...``; exits 1 when a balanced plan rates worse than TorchRec's or
two points disagree.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BASE = ["experiment=plan_many_tables", "cluster=gpu_4x8", "sharding.proposer=balanced"]
GRIDS = {"small": ([3, 6, 12.5, 25, 50], [0.05, 0.15, 0.3]), "big": ([3, 12.5, 50], [0.05, 0.15, 0.3])}


def overrides(tables: int, ranks: int) -> List[str]:
    return BASE + [f"model.generated_tables.count={tables}", f"cluster.nodes={ranks // 8}"]


def run(args: List[str], tmp: Path) -> Tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "runner", *args, f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}",
                           "tracking.experiment=plan_quality", "sweep.reuse=false"], cwd=ROOT, capture_output=True,
                          text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"runner failed ({' '.join(args)}):\n{proc.stderr[-3000:]}")
    return seconds, proc


def sweep(tables: int, ranks: int, grid: Tuple[List[float], List[float]], tmp: Path) -> Tuple[float, List[Dict]]:
    """The grid as one runner sweep: its seconds and, per point, its values, results and plan."""
    folder = tmp / f"sweep{tables}"
    bandwidths, reserves = grid
    seconds, _ = run(["-m", "mode=plan", *overrides(tables, ranks),
                      "cluster.cross_node_bandwidth=" + ",".join(map(str, bandwidths)),
                      "sharding.storage_reserve_percent=" + ",".join(map(str, reserves)),
                      f"hydra.sweep.dir={folder}"], tmp)
    points = []
    for job in sorted((d for d in folder.iterdir() if d.name.isdigit()), key=lambda d: int(d.name)):
        results = json.loads((job / "results.json").read_text())
        chosen = [o.split("=", 1)[1] for o in (job / ".hydra" / "overrides.yaml").read_text().split("\n- ")
                  if o.startswith(("cluster.cross_node_bandwidth", "sharding.storage_reserve_percent"))]
        plan = json.loads((job / "plan" / "plan.json").read_text())
        points.append({"bandwidth": float(chosen[0]), "reserve": float(chosen[1]), "results": results,
                       "plan": {f"{m}.{t}": (p["sharding_type"], p["compute_kernel"], tuple(p["ranks"]))
                                for m, tabs in plan.items() for t, p in tabs.items()}})  # ranks: in shard order
    return seconds, points


def compose(tables: int, ranks: int, bandwidth: float, reserve: float) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import runner.cli  # noqa: F401  (schema and resolvers)

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose("config", overrides=overrides(tables, ranks) + [
            f"cluster.cross_node_bandwidth={bandwidth}", f"sharding.storage_reserve_percent={reserve}"])


def problem_at(cfg: Any, ranks: int) -> Tuple[Any, Any]:
    """The point's options (TorchRec's enumerator, reused across points of one bandwidth) as the balanced
    search's problem."""
    from runner.plan.cost.topology import dense_bytes
    from runner.plan.planner import build_planner, reusable_model
    from runner.plan.sharders import sharders_for
    from runner.plan.spec import plan_spec
    from runner.plan.torchrec_adapter.balanced.proposer import problem_of
    from runner.train.models import planning_model

    model = reusable_model(plan_spec(cfg), lambda: planning_model(cfg))
    planner = build_planner(plan_spec(cfg), ranks, 8, "cuda", None, dense_bytes(model), reuse=True)
    sharders = sharders_for(cfg.precision)
    reserved = planner._storage_reservation.reserve(topology=planner._topology, batch_size=planner._batch_size,
                                                    module=model, sharders=sharders, constraints=planner._constraints)
    return problem_of(planner._enumerator.enumerate(module=model, sharders=sharders), reserved)


def torchrec_rating(cfg: Any, ranks: int, proposer: str = "greedy") -> Optional[float]:
    """TorchRec's plan for ``proposer`` on the runner's inputs (``sharding.proposer=greedy`` or
    ``dynamic_programming``: TorchRec's plan, found faster; ``tests/plan/test_greedy.py``, ``test_search.py``):
    its rating."""
    from runner.plan.cost.topology import dense_bytes
    from runner.plan.planner import PlanEstimates, build_planner, reusable_model
    from runner.plan.sharders import sharders_for
    from runner.plan.spec import plan_spec
    from runner.train.models import planning_model

    cfg.sharding.proposer = proposer
    model = reusable_model(plan_spec(cfg), lambda: planning_model(cfg))
    estimates = PlanEstimates()
    try:
        build_planner(plan_spec(cfg), ranks, 8, "cuda", estimates, dense_bytes(model), reuse=True).plan(
            model, sharders_for(cfg.precision))
    except Exception:  # noqa: BLE001 - TorchRec found no plan
        return None
    totals = [0.0] * ranks
    for option in estimates.best_plan:
        for shard in option.shards:
            totals[shard.rank] += shard.perf.total
    return max(totals)


def dp_rating(cfg: Any, ranks: int) -> Optional[float]:
    """TorchRec's dynamic-programming plan's rating as the balanced planner rates it when it is a start (its plan,
    and where it finds none, its plan without the options no GPU can hold): the balanced planner run with it named
    in ``sharding.balanced_compare`` and a search of no length; None where TorchRec's proposer finds no plan."""
    from runner.plan.planner import make_plan, reusable_model
    from runner.plan.spec import plan_spec
    from runner.train.models import planning_model

    cfg.sharding.balanced_compare = ["dynamic_programming"]
    cfg.sharding.balanced_work = 1
    facts: Dict[str, Any] = {}
    spec = plan_spec(cfg)
    make_plan(spec, reusable_model(spec, lambda: planning_model(cfg)), ranks, 8, "cuda", reuse=True, facts=facts)
    return facts.get("compared", {}).get("plan/torchrec_dynamic_programming_ms")


def violations(tables: int, ranks: int, points: List[Dict]) -> Tuple[int, int]:
    """(pairs where another point's plan, valid here, rates better here; of them, pairs with more bandwidth
    and no more reserve giving a slower plan)."""
    from runner.plan.torchrec_adapter.balanced.problem import rating, valid
    from runner.plan.torchrec_adapter.balanced.proposer import solution_of

    count = monotone = 0
    for p in points:
        problem, options = problem_at(compose(tables, ranks, p["bandwidth"], p["reserve"]), ranks)
        mine = rating(problem, solution_of(options, p["plan"]))
        for q in points:
            other = solution_of(options, q["plan"])
            if q is p or other is None or valid(problem, other) is not None:
                continue
            if rating(problem, other) < mine * (1 - 1e-9):
                count += 1
                print(f"  violation: at {p['bandwidth']:g} GiB/s, reserve {p['reserve']:g} ({mine:.4f} ms) the plan of "
                      f"{q['bandwidth']:g}, {q['reserve']:g} rates {rating(problem, other):.4f} ms", flush=True)
        monotone += sum(1 for q in points if q["bandwidth"] >= p["bandwidth"] and q["reserve"] <= p["reserve"]
                        and q["results"]["est_step_ms"] > p["results"]["est_step_ms"] * (1 + 1e-9))
    return count, monotone


def grid_report(name: str, tables: int, ranks: int, grid: Tuple[List[float], List[float]], tmp: Path,
                greedy_points: int) -> str:
    seconds, points = sweep(tables, ranks, grid, tmp)
    print(f"\n{tables} tables x {ranks} GPUs: the sweep of {len(points)} points took {seconds:.1f} s", flush=True)
    print(f"{'GiB/s':>6} {'reserve':>7} {'balanced':>9} {'DP':>9} {'greedy':>9} {'bound':>9} {'gap':>7}", flush=True)
    worse, gaps = 0, []
    for i, p in enumerate(points):
        r = p["results"]
        est, bound = r["est_step_ms"], r["lower_bound_ms"]
        dp = r.get("compared_ms", {}).get("plan/torchrec_dynamic_programming_ms")
        if dp is None:  # not a start at this size (the balanced planner skipped it): TorchRec's plan found here
            dp = dp_rating(compose(tables, ranks, p["bandwidth"], p["reserve"]), ranks)
        greedy = torchrec_rating(compose(tables, ranks, p["bandwidth"], p["reserve"]), ranks) \
            if i < greedy_points else None
        worse += any(x is not None and est > x * (1 + 1e-9) for x in (dp, greedy))
        gaps.append(est / bound - 1)
        show = [f"{x:9.3f}" if x is not None else f"{'-':>9}" for x in (est, dp, greedy, bound)]
        print(f"{p['bandwidth']:6g} {p['reserve']:7g} {' '.join(show)} {gaps[-1]:7.2%}", flush=True)
    bad, monotone = violations(tables, ranks, points)
    one_s, _ = run(["mode=plan", *overrides(tables, ranks), "cluster.cross_node_bandwidth=12.5",
                    "sharding.storage_reserve_percent=0.15", f"hydra.run.dir={tmp / f'single{tables}'}"], tmp)
    print(f"violations: {bad} (of them more bandwidth or less reserve slower: {monotone}); one point as one "
          f"command: {one_s:.1f} s", flush=True)
    return (f"tables={tables} ranks={ranks} points={len(points)} worse={worse} "
            f"median_gap={statistics.median(gaps):.2%} max_gap={max(gaps):.2%} violations={bad} "
            f"runner_s={seconds:.1f} single_s={one_s:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=300, help="tables of the 64-GPU grid")
    ap.add_argument("--big", type=int, default=1000, help="tables of the 128-GPU grid")
    ap.add_argument("--greedy", default="all", help="points of the small grid planned with TorchRec's greedy "
                                                    "proposers too (all, none or a number; about 6 s each)")
    ap.add_argument("--grids", default="small,big", help="which grids to run: small, big or both")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    greedy = {"all": 10**6, "none": 0}.get(args.greedy) if args.greedy in ("all", "none") else int(args.greedy)
    parts = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        if "small" in args.grids:
            parts.append(grid_report("small", args.small, 64, GRIDS["small"], tmp, greedy))
        if "big" in args.grids:
            parts.append(grid_report("big", args.big, 128, GRIDS["big"], tmp, 0))
    print("plan-quality: " + " | ".join(parts))
    bad = [part for part in parts if " worse=0 " not in part or " violations=0 " not in part]
    if bad:
        sys.exit("plan-quality: the balanced plan rated worse than TorchRec's, or points disagree: " + " | ".join(bad))


if __name__ == "__main__":
    main()
