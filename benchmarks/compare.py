"""Runner vs a plain TorchRec loop, measured in one run on this machine.

    .venv/bin/python benchmarks/compare.py [--steps 300] [--batch 256] [--repeats 3]

Both train the same DLRM with the same table-wise plan, batch, world size (2 CPU workers, gloo) and
optimizers. Throughput counts the steps after the first 20 (one-off pipeline tracing), wall clock,
everything included (the runner's logging too). Start-up is from launching the command to the end of
the first training step: ``python -m runner`` (Hydra, MLflow run, elastic agent) against ``torchrun``
of the plain loop. Alternating repeats; medians reported; JSON written to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = Path(sys.executable)


def run_plain(steps: int, batch: int, tmp: Path) -> dict:
    out = tmp / "plain.json"
    start = time.time()
    subprocess.run([str(PY.parent / "torchrun"), "--standalone", "--nproc_per_node=2",
                    str(ROOT / "benchmarks" / "plain_torchrec.py"), "--steps", str(steps), "--batch", str(batch),
                    "--warmup", "20", "--out", str(out)], check=True, capture_output=True, cwd=ROOT)
    r = json.loads(out.read_text())
    return {"samples_per_s": r["samples_per_s"], "startup_s": r["first_step_unix"] - start,
            "sharding_types": r["sharding_types"]}


def run_runner(steps: int, batch: int, tmp: Path) -> dict:
    run_dir = tmp / "runner"
    start = time.time()
    subprocess.run([str(PY), "-m", "runner", "sharding=tablewise", f"train.steps={steps}",
                    f"train.batch_size={batch}", "train.checkpoint.enabled=false",
                    f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}", "tracking.experiment=benchmark",
                    f"hydra.run.dir={run_dir}"], check=True, capture_output=True, cwd=ROOT)
    r = json.loads((run_dir / "results.json").read_text())
    plan = json.loads((run_dir / "plan" / "plan.json").read_text())
    return {"samples_per_s": r["samples_per_s"], "startup_s": r["first_step_unix"] - start,
            "startup_phases_s": r.get("startup_s", {}),
            "sharding_types": {t: p["sharding_type"] for m in plan.values() for t, p in m.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256, help="per worker")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "benchmark.json")
    args = ap.parse_args()
    rows = {"plain": [], "runner": []}
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.repeats):
            for name, fn in (("plain", run_plain), ("runner", run_runner)):
                tmp = Path(d) / f"{name}{i}"
                tmp.mkdir()
                rows[name].append(fn(args.steps, args.batch, tmp))
                print(f"[{i + 1}/{args.repeats}] {name:6s} {rows[name][-1]['samples_per_s']:9.0f} samples/s  "
                      f"start-up {rows[name][-1]['startup_s']:5.1f} s", flush=True)
    plans_equal = all(r["sharding_types"] == rows["plain"][0]["sharding_types"] for r in rows["plain"] + rows["runner"])
    med = {n: {k: statistics.median(r[k] for r in rows[n]) for k in ("samples_per_s", "startup_s")} for n in rows}
    summary = {
        "steps": args.steps, "batch_per_worker": args.batch, "world_size": 2, "repeats": args.repeats,
        "same_plan": plans_equal, "median": med, "runs": rows,
        "throughput_ratio_runner_over_plain": med["runner"]["samples_per_s"] / med["plain"]["samples_per_s"],
        "startup_ratio_runner_over_plain": med["runner"]["startup_s"] / med["plain"]["startup_s"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2))
    print(f"\nsame plan: {plans_equal}")
    print(f"{'':8s}{'samples/s':>12s}{'start-up s':>12s}")
    for n in ("plain", "runner"):
        print(f"{n:8s}{med[n]['samples_per_s']:12.0f}{med[n]['startup_s']:12.1f}")
    phases = rows["runner"][0].get("startup_phases_s") or {}
    if phases:
        med_phases = {k: statistics.median(r["startup_phases_s"][k] for r in rows["runner"]) for k in phases}
        summary["runner_startup_phases_s"] = med_phases
        args.out.write_text(json.dumps(summary, indent=2))
        print("runner start-up, s after `python -m runner` began (medians): " +
              ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in med_phases.items()))
    print(f"runner / plain: throughput x{summary['throughput_ratio_runner_over_plain']:.3f}, "
          f"start-up x{summary['startup_ratio_runner_over_plain']:.2f}  (written to {args.out})")


if __name__ == "__main__":
    main()
