"""The pipeline study: each training pipeline's measured samples/s against ``sparse_dist``'s, same model, same plan,
in one run (one sweep over ``train.pipeline``), with the import floor beside it.

    .venv/bin/python benchmarks/pipelines.py [--steps 200] [--batch 256] [runner overrides ...]

Every pipeline of ``runner/config/pipelines.py`` that runs on this machine's workers is a point of one
``python -m runner -m train.pipeline=...`` sweep (2 workers, the default DLRM, the sweep's basic launcher: one point
at a time); each point plans the same job, and the study checks that every point's plan is the first one's. Its
samples/s is the runner's (``results.json``: the steps after the first log window, over their wall time). The import
floor is ``python -c "import torchrec.distributed.planner, mlflow, hydra"`` timed: what any job pays before its
first step, beside which a point's start-up is read.

On CPU this is a smoke check: nothing overlaps there (the pipelines' side streams are CUDA's and gloo's collectives
block), so the pipelines should measure within noise of each other, and the GPU-only ones (``fused_sparse_dist``,
``semi_sync``, ``prefetch_sparse_dist``) are left out. On a GPU host (``--device cuda``) every pipeline runs and the
difference is the overlap.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runner.config.pipelines import PIPELINES  # noqa: E402


def import_floor_s() -> float:
    """Seconds ``python -c "import torchrec.distributed.planner, mlflow, hydra"`` takes here."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torchrec.distributed.planner, mlflow, hydra"], check=True)
    return time.perf_counter() - t0


def sweep(pipelines: list, steps: int, batch: int, device: str, extra: list, tmp: Path) -> float:
    """Run the study's sweep; its wall seconds. A failure ends the study in one line with its last output."""
    args = [sys.executable, "-m", "runner", "-m", f"train.pipeline={','.join(pipelines)}", f"train.steps={steps}",
            f"train.batch_size={batch}", "train.log_every=50", "train.checkpoint.enabled=false",
            f"cluster.device={device}", f"hydra.sweep.dir={tmp / 'sweep'}",
            f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}", "tracking.experiment=pipeline_study",
            "tracking.system_metrics=false", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
        raise SystemExit(f"error: the pipeline sweep exited {proc.returncode}:\n  " + "\n  ".join(tail))
    return time.perf_counter() - t0


def points(tmp: Path, pipelines: list) -> dict:
    """Each point's results and plan by pipeline (a sweep numbers its points in the order of the values)."""
    found = {}
    for folder in sorted((tmp / "sweep").iterdir(), key=lambda p: (len(p.name), p.name)):  # 0, 1, .., 10
        if not (folder / "results.json").exists():
            continue
        found[len(found)] = (json.loads((folder / "results.json").read_text()),
                             json.loads((folder / "plan" / "plan.json").read_text()))
    if len(found) != len(pipelines):
        raise SystemExit(f"error: {len(found)} of the sweep's {len(pipelines)} points left results in {tmp / 'sweep'}")
    return {name: found[i] for i, name in enumerate(pipelines)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("overrides", nargs="*", help="runner overrides for every point")
    a = ap.parse_args()
    pipelines = [n for n, p in PIPELINES.items() if a.device == "cuda" or p.gpu_only is None]
    floor = import_floor_s()
    with tempfile.TemporaryDirectory(prefix="pipeline-study-") as name:
        tmp = Path(name)
        wall = sweep(pipelines, a.steps, a.batch, a.device, a.overrides, tmp)
        by_pipeline = points(tmp, pipelines)
    plan = by_pipeline["sparse_dist"][1]
    moved = [n for n, (_, p) in by_pipeline.items() if p != plan]
    if moved:
        raise SystemExit(f"error: the plan of {', '.join(moved)} is not sparse_dist's: not the same job")
    base = by_pipeline["sparse_dist"][0]["samples_per_s"]
    print(f"pipeline study: 2 {a.device.upper()} workers, default DLRM, batch {a.batch}/rank, {a.steps} steps, one "
          f"plan for every point; one sweep, {wall:.0f} s; import floor {floor:.2f} s "
          "(python -c 'import torchrec.distributed.planner, mlflow, hydra')")
    print(f"{'pipeline':<22}{'samples/s':>12}{'vs sparse_dist':>16}{'final loss':>12}")
    for name, (results, _) in by_pipeline.items():
        rate = results["samples_per_s"]
        print(f"{name:<22}{rate:>12,.0f}{rate / base:>15.2f}x{results['final_loss']:>12.4f}")
    left = [n for n in PIPELINES if n not in by_pipeline]
    if a.device == "cpu":
        print("CPU: a smoke check, nothing overlaps here (CUDA streams only); GPU-only, left out: " + ", ".join(left))


if __name__ == "__main__":
    main()
