"""A plan-only sweep through the runner vs the same points as fresh TorchRec planner calls, in one run.

    .venv/bin/python benchmarks/plan_sweep.py [--jobs 2] [--bandwidths 0.5,1,3,6,12.5] [--reserves ...]

The study: ``experiment=plan_many_tables sharding.proposer=dynamic_programming`` (100 tables, 2 x 8 GPUs, the
dynamic-programming proposer pinned: what this benchmark measures is TorchRec's answer found faster, not the
preset's balanced proposer, which ``plan_quality.py`` measures), 5 cross-node bandwidths x 5 storage reserves.

- ``raw``: one process; the model built once; for each point a fresh ``EmbeddingShardingPlanner`` with the
  point's topology, reservation and constraints and TorchRec's own proposer, enumerator and estimators
  plans it (``runner.plan.planner.torchrec_planner``: TorchRec's own call, nothing reused). Timed: the
  planner calls only.
- ``runner``: ``python -m runner -m experiment=plan_many_tables ...`` with ``hydra/launcher=joblib`` and
  ``--jobs`` processes; timed: the whole command (imports, MLflow runs, every point's plan folder and
  artifacts, the sweep report).

Each point's plan (every table's sharding type, kernel, ranks and shards) and per-rank estimates from the
runner's run folder are compared with the raw call's; "no plan fits" counts as identical when both say so.
A point where TorchRec's proposer finds no plan and the runner's fallbacks find one (the run's note says
how) counts as ``beyond``, not compared. Ends with ``plan-sweep: points=N runner_s=.. raw_s=.. speedup=..
identical=k/(N - beyond) beyond=b``; exits 1 when a compared point is not identical.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PINNED = ["experiment=plan_many_tables", "sharding.proposer=dynamic_programming"]  # TorchRec's answer, faster


def raw_plans(points: list) -> tuple:
    """Fresh planner calls, one per point: (seconds of the calls, {point: (plan dict, per-rank estimates)})."""
    from hydra import compose, initialize_config_dir

    import runner.cli  # noqa: F401  (schema and resolvers)
    from runner.config.tables import table_specs
    from runner.plan.analysis import per_rank_estimates
    from runner.plan.cost.topology import dense_bytes
    from runner.plan.plan_file import plan_to_dict
    from runner.plan.planner import PlanEstimates, torchrec_planner
    from runner.plan.sharders import sharders_for
    from runner.plan.spec import plan_spec
    from runner.train.models import planning_model

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfgs = [compose("config", overrides=[*PINNED, f"cluster.cross_node_bandwidth={b}",
                                              f"sharding.storage_reserve_percent={r}"]) for b, r in points]
    model = planning_model(cfgs[0])
    sharders = sharders_for(cfgs[0].precision)
    out, total = {}, 0.0
    for (b, r), cfg in zip(points, cfgs, strict=True):
        estimates = PlanEstimates()
        t0 = time.perf_counter()
        try:
            planner = torchrec_planner(plan_spec(cfg), 16, 8, "cuda", estimates, dense_bytes(model))
            plan = planner.plan(model, sharders)
        except Exception:  # no plan fits
            plan = None
        total += time.perf_counter() - t0
        out[(str(b), str(r))] = None if plan is None else (
            plan_to_dict(plan, table_specs(cfg.model)), per_rank_estimates(estimates.best_plan, 16))
        print(f"  raw xbw={b} reserve={r}: {'infeasible' if plan is None else 'plan'}", flush=True)
    return total, out


def runner_sweep(points: list, jobs: int, tmp: Path) -> tuple:
    bws = ",".join(dict.fromkeys(str(b) for b, _ in points))
    reserves = ",".join(dict.fromkeys(str(r) for _, r in points))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "runner", "-m", *PINNED,
                           f"cluster.cross_node_bandwidth={bws}", f"sharding.storage_reserve_percent={reserves}",
                           "hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}", f"hydra.sweep.dir={tmp / 'sweep'}",
                           f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}", "tracking.experiment=plan_sweep"],
                          cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"runner sweep failed:\n{proc.stderr[-3000:]}")
    import yaml

    out = {}
    for d in sorted((tmp / "sweep").iterdir()):
        if not d.name.isdigit():
            continue
        cfg = yaml.safe_load((d / "resolved.yaml").read_text())
        key = (str(cfg["cluster"]["cross_node_bandwidth"]), str(cfg["sharding"]["storage_reserve_percent"]))
        results = json.loads((d / "results.json").read_text())
        out[key] = None if results.get("plan_status") == "infeasible" else (
            json.loads((d / "plan" / "plan.json").read_text()),
            json.loads((d / "plan" / "estimates.json").read_text())["per_rank"])
    return seconds, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="joblib processes for the runner's sweep")
    ap.add_argument("--bandwidths", default="0.5,1,3,6,12.5", help="cluster.cross_node_bandwidth values, GiB/s")
    ap.add_argument("--reserves", default="0.05,0.15,0.3,0.45,0.6", help="sharding.storage_reserve_percent values")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    points = [(float(b), float(r)) for b in args.bandwidths.split(",") for r in args.reserves.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        runner_s, ran = runner_sweep(points, args.jobs, Path(tmp))
        print(f"runner sweep: {runner_s:.1f} s for {len(points)} points ({args.jobs} processes)", flush=True)
        raw_s, raw = raw_plans(points)
    print(f"raw planner calls: {raw_s:.1f} s for {len(points)} points")
    same = beyond = 0
    for key, want in raw.items():
        got = ran.get((str(float(key[0])), str(float(key[1]))))
        norm = None if got is None else (got[0], [dict(sorted(r.items())) for r in got[1]])
        ref = None if want is None else (json.loads(json.dumps(want[0])), [dict(sorted(r.items())) for r in want[1]])
        if want is None and got is not None:
            beyond += 1  # TorchRec's proposer found none; the runner's fallbacks did (the run says how)
        else:
            same += norm == ref
    print(f"plan-sweep: points={len(points)} runner_s={runner_s:.1f} raw_s={raw_s:.1f} "
          f"speedup={raw_s / runner_s:.2f} identical={same}/{len(points) - beyond} beyond={beyond}")
    if same != len(points) - beyond:
        sys.exit("plan-sweep: the runner's dynamic-programming plans are not TorchRec's at every compared point")


if __name__ == "__main__":
    main()
