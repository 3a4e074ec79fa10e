"""``make bench-optuna``: the idle time of asynchronous Optuna trials against Hydra's batches, on a study whose
trials are of uneven length.

    make bench-optuna [ARGS="--trials 8 --jobs 2"]

One plan-only study (``experiment=plan_many_tables`` on 128 x 8 GPUs; each trial plans 10 or 5,384 generated tables,
drawn by a seeded random sampler: the same trials both times, one of each in every pair; no answer reused between
trials, ``sweep.reuse=false``), run twice through joblib's processes with ``--jobs`` trials at once:
``hydra.sweeper.batch=false`` (the runner's default: a new trial as soon as any ends) and ``batch=true`` (Hydra's
way: each batch waits for its slowest). For each it prints the trials' span, their busy time (their MLflow runs'
start to end), and the idle time of the slots: jobs x span - busy, as a share of jobs x span; the import floor
beside them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_scale import import_floor  # noqa: E402


def study(batch: bool, trials: int, jobs: int, folder: Path) -> Dict[str, float]:
    """One study's wall time, busy time and idle share."""
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{folder / 'mlflow.db'}"
    name = "batch" if batch else "async"
    args = ["-m", "experiment=plan_many_tables", "cluster=gpu_4x8", "cluster.nodes=128",
            "model.generated_tables.count=choice(10,5384)", "sweep.reuse=false", "hydra/sweeper=optuna",
            "hydra/sweeper/sampler=random",
            "hydra.sweeper.sampler.seed=10", f"hydra.sweeper.n_trials={trials}", f"hydra.sweeper.n_jobs={jobs}",
            f"hydra.sweeper.batch={str(batch).lower()}", "hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}",
            f"tracking.uri={store}", f"tracking.experiment={name}", f"hydra.sweep.dir={folder / name}"]
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "runner", *args], cwd=ROOT, text=True, capture_output=True,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    if proc.returncode != 0:
        raise SystemExit(f"the {name} study failed:\n{proc.stderr[-3000:]}")
    client = MlflowClient(store)
    (experiment,) = [e for e in client.search_experiments() if e.name == name]
    jobs_runs = [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("runner.kind") == "job"]
    first = min(r.info.start_time for r in jobs_runs)
    last = max(r.info.end_time for r in jobs_runs)
    busy = sum(r.info.end_time - r.info.start_time for r in jobs_runs) / 1000
    wall = (last - first) / 1000
    tables = sorted(int(r.data.params["model.generated_tables.count"]) for r in jobs_runs)
    return {"command_s": time.monotonic() - start, "wall_s": wall, "busy_s": busy,
            "idle": max(0.0, jobs * wall - busy) / (jobs * wall), "slow": float(tables.count(5384))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    floor = import_floor()
    print(f"import floor: {floor:.1f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-optuna-") as tmp:
        for batch in (False, True):
            r = study(batch, args.trials, args.jobs, Path(tmp))
            print(f"{'batch (Hydra)' if batch else 'asynchronous'}: {args.trials} trials ({r['slow']:.0f} of 5,384 "
                  f"tables), {args.jobs} at once: trials' span {r['wall_s']:.1f} s (command {r['command_s']:.1f} s), "
                  f"busy {r['busy_s']:.1f} s, slots idle {100 * r['idle']:.0f}% (floor {floor:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
