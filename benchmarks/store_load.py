"""Many jobs, one MLflow store: a big plan-only sweep over joblib and training jobs started at once.

    .venv/bin/python benchmarks/store_load.py [--points 100] [--n-jobs 2] [--trainers 4] [--stores sqlite,server]

- ``sweep``: ``python -m runner -m hydra/launcher=joblib hydra.launcher.n_jobs=N mode=plan ...`` over
  ``--points`` points (storage reserve x intra-node bandwidth), against a new SQLite file and against a real
  ``mlflow server`` on 127.0.0.1 (its own SQLite file). Checked: one parent run, FINISHED, whose
  ``sweep/points`` is the number of points and ``sweep/failed_points`` 0; one child per point, FINISHED, with
  the point's swept values as params, the plan status tag, and ``plan/seconds`` and ``plan/est_step_ms``
  (or, where no plan fits, the reason); no two children with the same job number.
- ``trainers``: ``--trainers`` training jobs (``train.steps=30``) started at the same moment on one new
  SQLite file: every run FINISHED with its params and a ``train/loss`` history.

Per case: ``<case> <store>: points=.. wall_s=.. s_per_point=.. runs=.. ok``; a case that loses or
misrecords anything prints what and the script exits 1. The last line: ``store-load: ok`` or ``store-load: FAILED``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tracking_rate import start_server  # noqa: E402  (one way to start a local mlflow server)

PLAN = ["mode=plan", "cluster.device=cuda", "cluster.hbm_cap_gib=0.05", "sharding.storage_reserve_policy=fixed",
        "sharding.compute_kernels=[fused]"]
TRAIN = ["train.steps=30", "train.log_every=10", "train.batch_size=128", "data.eval_batches=4"]


def grid(points: int) -> Tuple[List[str], List[str]]:
    """``points`` distinct (reserve, bandwidth) pairs: 4 bandwidths x ceil(points / 4) reserves, cut to size."""
    bandwidths = ["100", "200", "300", "600"][: max(1, min(4, points))]
    per = -(-points // len(bandwidths))
    reserves = [f"{0.01 + 0.6 * i / max(1, per - 1):.4f}" for i in range(per)]
    assert len(reserves) * len(bandwidths) >= points
    return reserves, bandwidths


def runner_env(uri: str) -> dict:
    return dict(os.environ, MLFLOW_TRACKING_URI=uri, PYTHONUNBUFFERED="1")


def experiment_runs(uri: str, experiment: str) -> Tuple[object, Optional[list]]:
    """The store's client and the experiment's runs (None when there is no such experiment)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client, None if exp is None else client.search_runs([exp.experiment_id], max_results=5000)


def check_sweep(uri: str, experiment: str, expected: int) -> List[str]:
    """What the store lacks or holds wrong for a sweep of ``expected`` points (empty: all there)."""
    _, all_runs = experiment_runs(uri, experiment)
    if all_runs is None:
        return [f"no experiment {experiment!r}"]
    parents = [r for r in all_runs if r.data.tags.get("runner.kind") == "sweep"]
    children = [r for r in all_runs if r.data.tags.get("runner.kind") == "job"]
    problems = []
    if len(parents) != 1:
        return [f"{len(parents)} parent runs"]
    (parent,) = parents
    if parent.info.status != "FINISHED":
        problems.append(f"parent {parent.info.status}")
    if parent.data.metrics.get("sweep/points") != expected or parent.data.metrics.get("sweep/failed_points") != 0:
        problems.append(f"parent counts {parent.data.metrics.get('sweep/points')} points, "
                        f"{parent.data.metrics.get('sweep/failed_points')} failed (expected {expected}, 0)")
    if len(children) != expected:
        problems.append(f"{len(children)} child runs for {expected} points")
    jobs = [r.data.tags.get("runner.job") for r in children]
    if len(set(jobs)) != len(jobs):
        problems.append("two children with one job number")
    for r in children:
        name = f"job {r.data.tags.get('runner.job')}"
        if r.info.status != "FINISHED":
            problems.append(f"{name}: {r.info.status}")
        if r.data.tags.get("mlflow.parentRunId") != parent.info.run_id:
            problems.append(f"{name}: not under the parent")
        if "sharding.storage_reserve_percent" not in r.data.params:
            problems.append(f"{name}: no sharding.storage_reserve_percent param")
        status = r.data.tags.get("runner.plan_status")
        if status not in ("feasible", "infeasible"):
            problems.append(f"{name}: plan status {status!r}")
        if status == "feasible" and not {"plan/seconds", "plan/est_step_ms"} <= set(r.data.metrics):
            problems.append(f"{name}: plan metrics missing ({sorted(r.data.metrics)})")
        if status == "infeasible" and not r.data.tags.get("runner.plan_reason"):
            problems.append(f"{name}: no plan and no reason")
    return problems


def check_trainers(uri: str, experiment: str, expected: int) -> List[str]:
    client, found = experiment_runs(uri, experiment)
    if found is None:
        return [f"no experiment {experiment!r}"]
    problems = [] if len(found) == expected else [f"{len(found)} runs for {expected} jobs"]
    for r in found:
        losses = client.get_metric_history(r.info.run_id, "train/loss")
        if r.info.status != "FINISHED" or len(losses) < 3 or "train.steps" not in r.data.params:
            problems.append(f"run {r.info.run_name}: {r.info.status}, {len(losses)} losses, "
                            f"{len(r.data.params)} params")
    return problems


def plan_sweep(uri: str, points: int, n_jobs: int, folder: Path, experiment: str,
               printed: Optional[List[str]] = None) -> Tuple[float, List[str]]:
    """The sweep against ``uri``: (wall seconds, problems); what it printed is appended to ``printed``."""
    reserves, bandwidths = grid(points)
    args = [sys.executable, "-m", "runner", "-m", "hydra/launcher=joblib", f"hydra.launcher.n_jobs={n_jobs}", *PLAN,
            f"sharding.storage_reserve_percent={','.join(reserves)}",
            f"cluster.intra_node_bandwidth={','.join(bandwidths)}", f"tracking.experiment={experiment}",
            f"hydra.sweep.dir={folder}"]
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=ROOT, env=runner_env(uri), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if printed is not None:
        printed.append(proc.stdout)
    expected = len(reserves) * len(bandwidths)
    problems = [] if proc.returncode == 0 else [f"exit {proc.returncode}: {proc.stderr.strip()[-600:]}"]
    return wall, problems + check_sweep(uri, experiment, expected)


def trainers(uri: str, count: int, folder: Path, experiment: str) -> Tuple[float, List[str]]:
    """``count`` training jobs started at once on ``uri``: (wall seconds, problems)."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "runner", *TRAIN, f"train.seed={i}",
                               f"tracking.experiment={experiment}", f"hydra.run.dir={folder / str(i)}"],
                              cwd=ROOT, env=runner_env(uri), text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for i in range(count)]
    outs = [p.communicate() for p in procs]
    wall = time.perf_counter() - t0
    problems = [f"job {i}: exit {p.returncode}: {err.strip()[-400:]}" for i, (p, (_, err))
                in enumerate(zip(procs, outs, strict=True)) if p.returncode != 0]
    return wall, problems + check_trainers(uri, experiment, count)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=100)
    ap.add_argument("--n-jobs", type=int, default=2, help="joblib processes of the sweep")
    ap.add_argument("--trainers", type=int, default=4, help="training jobs started at once (0: none)")
    ap.add_argument("--stores", default="sqlite,server")
    args = ap.parse_args()
    failed = False
    with tempfile.TemporaryDirectory(prefix="store-load-") as tmp:
        folder = Path(tmp)
        for store in args.stores.split(","):
            server = None
            if store == "server":
                server, uri = start_server(folder / "server")
            elif store == "sqlite":
                uri = f"sqlite:///{folder / 'sweep.db'}"
            else:
                raise SystemExit(f"--stores: {store!r} is not one of sqlite, server")
            try:
                wall, problems = plan_sweep(uri, args.points, args.n_jobs, folder / f"sweep-{store}", "load")
            finally:
                if server is not None:
                    server.terminate()
                    server.wait(30)
            expected = len(grid(args.points)[0]) * len(grid(args.points)[1])
            print(f"sweep {store}: points={expected} n_jobs={args.n_jobs} wall_s={wall:.1f} "
                  f"s_per_point={wall / expected:.2f} runs={expected + 1} " + ("ok" if not problems else "FAILED"),
                  flush=True)
            for p in problems[:20]:
                print(f"  {p}", flush=True)
            failed |= bool(problems)
        if args.trainers:
            wall, problems = trainers(f"sqlite:///{folder / 'train.db'}", args.trainers, folder / "train", "load")
            print(f"trainers sqlite: jobs={args.trainers} started together wall_s={wall:.1f} runs={args.trainers} "
                  + ("ok" if not problems else "FAILED"), flush=True)
            for p in problems[:20]:
                print(f"  {p}", flush=True)
            failed |= bool(problems)
    print(f"store-load: {'FAILED' if failed else 'ok'}", flush=True)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
