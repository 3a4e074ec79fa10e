"""Planning at the scale users live at, in one run: the runner's whole ``mode=plan`` command for 1000 tables on
16 x 8 GPUs, and for 300 tables on 8 x 8 GPUs against TorchRec's own planner.

    .venv/bin/python benchmarks/plan_scale.py [--big 1000] [--small 300] [--greedy]

- ``import floor``: ``python -c "import torchrec.distributed.planner, mlflow, hydra"``, what any planning
  command pays before it plans.
- ``runner``: ``python -m runner mode=plan experiment=plan_many_tables model.generated_tables.count=N
  cluster=gpu_4x8 cluster.nodes=K``, timed whole (start-up, planning, the plan folder, the MLflow run);
  its planner seconds read from its results; peak memory of the command (max RSS).
- ``raw``: TorchRec's own planner (its loop, enumerator, estimators and dynamic-programming proposer) on the
  same inputs, in this process (``runner.plan.planner.torchrec_planner``); its plan and per-rank estimates are
  compared with the runner's.
- ``--greedy``: the small case with ``sharding.proposer=greedy`` too, for its estimated step.

Ends with ``plan-scale: tables=1000 ranks=128 runner_s=.. plan=found|none proposer=.. est_step_ms=.. |
tables=300 ranks=64 runner_s=.. raw_s=.. raw=found|none identical=yes|no``.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BASE = ["experiment=plan_many_tables", "cluster=gpu_4x8"]


def overrides(tables: int, ranks: int) -> List[str]:
    return BASE + [f"model.generated_tables.count={tables}", f"cluster.nodes={ranks // 8}"]


def import_floor() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torchrec.distributed.planner, mlflow, hydra"], check=True, cwd=ROOT)
    return time.perf_counter() - t0


def runner_plan(tables: int, ranks: int, tmp: Path, extra: Tuple[str, ...] = ()) -> Dict[str, Any]:
    """The whole command; its seconds, results, plan and per-rank estimates, note and peak memory."""
    run_dir = tmp / f"run{tables}{len(list(tmp.glob('run*')))}"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "runner", "mode=plan", *overrides(tables, ranks), *extra,
                           f"hydra.run.dir={run_dir}", f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}",
                           "tracking.experiment=plan_scale"], cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"runner plan failed:\n{proc.stderr[-3000:]}")
    results = json.loads((run_dir / "results.json").read_text())
    found = results.get("plan_status") == "feasible"
    note = [line for line in proc.stdout.splitlines() if line.startswith("[runner] note:")]
    return {"seconds": seconds, "results": results, "found": found, "note": note[0] if note else "",
            "max_rss_gib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20,
            "plan": json.loads((run_dir / "plan" / "plan.json").read_text()) if found else None,
            "per_rank": json.loads((run_dir / "plan" / "estimates.json").read_text())["per_rank"] if found else None}


def raw_plan(tables: int, ranks: int) -> Tuple[float, Optional[Tuple[Any, Any]]]:
    """TorchRec's own planner on the runner's inputs: (seconds of the call, (plan dict, per-rank estimates) or
    None)."""
    from hydra import compose, initialize_config_dir

    import runner.cli  # noqa: F401  (schema and resolvers)
    from runner.config.tables import table_specs
    from runner.plan.analysis import per_rank_estimates
    from runner.plan.plan_file import plan_to_dict
    from runner.plan.planner import PlanEstimates, torchrec_planner
    from runner.plan.sharders import sharders_for
    from runner.plan.topology import dense_bytes
    from runner.train.models import planning_model

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides(tables, ranks))
    model = planning_model(cfg)
    estimates = PlanEstimates()
    t0 = time.perf_counter()
    try:
        plan = torchrec_planner(cfg, ranks, 8, "cuda", estimates, dense_bytes(model)).plan(
            model, sharders_for(cfg.precision))
    except Exception:  # noqa: BLE001 - no plan found
        return time.perf_counter() - t0, None
    seconds = time.perf_counter() - t0
    return seconds, (plan_to_dict(plan, table_specs(cfg.model)), per_rank_estimates(estimates.best_plan, ranks))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--big", type=int, default=1000, help="tables of the large case (on 128 GPUs)")
    ap.add_argument("--small", type=int, default=300, help="tables of the case compared with TorchRec (64 GPUs)")
    ap.add_argument("--greedy", action="store_true", help="also plan the small case with the greedy proposer")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        floor = import_floor()
        print(f"import floor: {floor:.1f} s", flush=True)
        big = runner_plan(args.big, 128, tmp)
        planner_s = big["results"].get("plan_seconds") or 0.0
        est = big["results"].get("est_step_ms")
        print(f"runner, {args.big} tables x 128 GPUs: {big['seconds']:.1f} s whole (planner {planner_s:.1f} s, "
              f"import floor + planner + 2 s = {floor + planner_s + 2:.1f} s), peak memory {big['max_rss_gib']:.2f} "
              f"GiB, {'plan found' if big['found'] else 'no plan'}"
              + (f", estimated step {est:.3f} ms" if est else "") + (f"\n  {big['note']}" if big["note"] else ""),
              flush=True)
        small = runner_plan(args.small, 64, tmp)
        print(f"runner, {args.small} tables x 64 GPUs: {small['seconds']:.1f} s whole (planner "
              f"{small['results'].get('plan_seconds') or 0:.1f} s)", flush=True)
        if args.greedy:
            greedy = runner_plan(args.small, 64, tmp, ("sharding.proposer=greedy",))
            print(f"runner, {args.small} tables x 64 GPUs, greedy: {greedy['seconds']:.1f} s, estimated step "
                  f"{greedy['results'].get('est_step_ms')} ms (dynamic programming: "
                  f"{small['results'].get('est_step_ms')} ms)", flush=True)
        raw_s, raw = raw_plan(args.small, 64)
        print(f"TorchRec's planner, {args.small} tables x 64 GPUs: {raw_s:.1f} s, "
              f"{'plan found' if raw else 'no plan'}", flush=True)
    identical = raw is not None and small["found"] and small["plan"] == json.loads(json.dumps(raw[0])) and \
        [dict(sorted(r.items())) for r in small["per_rank"]] == [dict(sorted(r.items())) for r in raw[1]]
    proposer = "dynamic_programming" + ("+fallback" if big["note"] else "")
    print(f"plan-scale: tables={args.big} ranks=128 runner_s={big['seconds']:.1f} "
          f"plan={'found' if big['found'] else 'none'} proposer={proposer} est_step_ms={est} | "
          f"tables={args.small} ranks=64 runner_s={small['seconds']:.1f} raw_s={raw_s:.1f} "
          f"raw={'found' if raw else 'none'} identical={'yes' if identical else 'no'}")


if __name__ == "__main__":
    main()
