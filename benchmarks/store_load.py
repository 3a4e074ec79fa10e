"""Many jobs, one MLflow store: a big plan-only sweep over joblib and training jobs started at once.

    .venv/bin/python benchmarks/store_load.py [--points 100] [--n-jobs 2] [--trainers 4] [--stores sqlite,server]
                                              [--outage] [--down-s 20]

- ``sweep``: ``python -m runner -m hydra/launcher=joblib hydra.launcher.n_jobs=N mode=plan ...`` over
  ``--points`` points (storage reserve x intra-node bandwidth), against a new SQLite file and against a real
  ``mlflow server`` on 127.0.0.1 (its own SQLite file). Checked: one parent run, FINISHED, whose
  ``sweep/points`` is the number of points and ``sweep/failed_points`` 0; one child per point, FINISHED, with
  the point's swept values as params, the plan status tag, and ``plan/seconds`` and ``plan/est_step_ms``
  (or, where no plan fits, the reason); no two children with the same job number.
- ``outage`` (``--outage``): the same sweep against a server that is killed (SIGKILL) once ``--points`` / 4
  points have ended, and started again ``--down-s`` seconds later on the same port and store. Checked: the
  sweep exits 0; every point is FINISHED in the store at its end or named in its "tracking pending" line
  (and none is both); after ``python -m runner sync <sweep folder>`` the store holds what the ``sweep`` case
  checks (each point once). Printed: how many runs were complete at the sweep's end, how many it named, the
  sync's seconds.
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


def outage(points: int, n_jobs: int, folder: Path, down_s: float) -> List[str]:
    """The plan sweep with its server killed a quarter of the way and back ``down_s`` later; what went wrong."""
    import re
    import signal

    server, uri = start_server(folder / "server")
    port = int(uri.rsplit(":", 1)[1])
    reserves, bandwidths = grid(points)
    expected = len(reserves) * len(bandwidths)
    sweep_folder = folder / "sweep-outage"
    args = [sys.executable, "-m", "runner", "-m", "hydra/launcher=joblib", f"hydra.launcher.n_jobs={n_jobs}", *PLAN,
            f"sharding.storage_reserve_percent={','.join(reserves)}",
            f"cluster.intra_node_bandwidth={','.join(bandwidths)}", "tracking.experiment=outage",
            f"hydra.sweep.dir={sweep_folder}"]
    t0 = time.perf_counter()
    printed = (folder / "outage.out").open("w+")  # a file, not a pipe: a sweep prints more than a pipe holds
    proc = subprocess.Popen(args, cwd=ROOT, env=runner_env(uri), stdout=printed, stderr=subprocess.STDOUT, text=True)
    while len(list(sweep_folder.glob("*/status.json"))) < expected // 4 and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(server.pid, signal.SIGKILL)
    server.wait()
    killed = time.perf_counter() - t0
    done_then = len(list(sweep_folder.glob("*/status.json")))
    time.sleep(down_s)
    server, _ = start_server(folder / "server", port)
    back = time.perf_counter() - t0
    try:
        proc.wait()
        wall = time.perf_counter() - t0
        printed.seek(0)
        out = printed.read()
        problems = [] if proc.returncode == 0 else [f"sweep exit {proc.returncode}: {out.strip()[-600:]}"]
        _, found = experiment_runs(uri, "outage")
        complete = {int(r.data.tags["runner.job"]) for r in found or [] if r.data.tags.get("runner.kind") == "job"
                    and r.info.status == "FINISHED"}
        named = re.search(r"tracking pending: .* point\(s\) \(jobs ([0-9, ]+|none)\)", out)
        listed = {int(j) for j in named.group(1).split(", ")} if named and named.group(1) != "none" else set()
        if complete | listed != set(range(expected)) or complete & listed:
            problems.append(f"complete at the end {len(complete)}, named for sync {len(listed)}: "
                            f"missing {sorted(set(range(expected)) - complete - listed)[:10]}, "
                            f"both {sorted(complete & listed)[:10]}")
        s0 = time.perf_counter()
        sync = subprocess.run([sys.executable, "-m", "runner", "sync", str(sweep_folder)], cwd=ROOT,
                              env=runner_env(uri), capture_output=True, text=True)
        sync_s = time.perf_counter() - s0
        if sync.returncode != 0:
            problems.append(f"sync exit {sync.returncode}: {sync.stderr.strip()[-600:]}")
        after = check_sweep(uri, "outage", expected)
        problems += after
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    print(f"outage server: points={expected} n_jobs={n_jobs} killed_at_s={killed:.1f} (after {done_then} points) "
          f"back_at_s={back:.1f} wall_s={wall:.1f} complete_at_end={len(complete)} named_for_sync={len(listed)} "
          f"sync_s={sync_s:.1f} after_sync={'every run once' if not after else f'{len(after)} problems'} "
          + ("ok" if not problems else "FAILED"), flush=True)
    return problems


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
    ap.add_argument("--outage", action="store_true", help="also the sweep with its server killed and restarted")
    ap.add_argument("--down-s", type=float, default=20.0, help="seconds the server stays away (--outage)")
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
        if args.outage:
            problems = outage(args.points, args.n_jobs, folder, args.down_s)
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
