"""Runner vs a plain TorchRec loop, measured in one run on this machine.

    .venv/bin/python benchmarks/compare.py [--steps 300] [--batch 256] [--repeats 5] [runner overrides ...]

All three train the same DLRM with the same table-wise plan, batch, world size (2 CPU workers, gloo) and
optimizers:

- ``plain``: TorchRec's canonical loop (``plain_torchrec.py``) under ``torchrun``, as users write it;
- ``plain_bound``: the same loop with each rank bound to its own cores, as the runner binds its workers
  by default (``cluster.cpu_affinity=auto``): shows how much of the difference is core binding;
- ``runner``: ``python -m runner`` with its defaults (plus any overrides given);
- ``runner_unfused``: the same with torch's default implementation of the dense optimizer
  (``optimizer.dense_fused=false``), which the plain loop uses: how much of the difference the fused kernel is;
- ``runner_parquet``: the same job reading ``--parquet-rows`` rows of Parquet (``mode=write_data``'s copy of
  the synthetic source, written once): the Parquet line, its throughput over the synthetic job's.

samples/s has one definition for all three, the runner's (its summary, ``train/samples_per_s`` over the
run, ``results.json``): samples of every rank per step x the steps after the first log window
(``train.log_every``, 50: the pipeline's one-off tracing), over the wall time of those steps, logging
included (checkpoint pauses excluded; the benchmark takes none). The plain loop times the same steps.
Start-up is from launching the command to the end of the first training step. Alternating repeats;
medians reported; JSON written to ``--out``.

``--device cuda [--gpus N]`` (``make bench ARGS="--device cuda"``): the plain loop and the runner only, on N GPUs
of this machine (NCCL, one GPU per rank: ``cluster.device=cuda cluster.workers_per_node=N``), same model, batch
and table-wise plan; the runner's per-rank measured step, embedding forward and the plan's estimates are printed
beside each other (its ``measured.json``).
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
SERIES = ("plain", "plain_bound", "runner", "runner_unfused")
UNFUSED = ("optimizer.dense_fused=false",)  # the runner with torch's default dense optimizer, as the plain loop


def _run(args: list) -> None:
    """Run one measured command; a failure ends the benchmark in one line with the command's last output."""
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise SystemExit(f"error: {' '.join(args[:4])} ... exited {proc.returncode}:\n  " + "\n  ".join(tail))


def run_plain(steps: int, batch: int, tmp: Path, bind: bool, warmup: int, device: str = "cpu",
              ranks: int = 2) -> dict:
    out = tmp / "plain.json"
    start = time.time()
    # torch's launcher as a module: a venv that uses an image's torch (gpu_bundle install) has no torchrun script
    _run([str(PY), "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
          str(ROOT / "benchmarks" / "plain_torchrec.py"), "--steps", str(steps), "--batch", str(batch),
          "--warmup", str(warmup), "--out", str(out), "--device", device, *(["--bind-cores"] if bind else [])])
    r = json.loads(out.read_text())
    return {"samples_per_s": r["samples_per_s"], "startup_s": r["first_step_unix"] - start,
            "sharding_types": r["sharding_types"]}


def run_runner(steps: int, batch: int, tmp: Path, extra: tuple = ()) -> dict:
    run_folder = tmp / "runner"
    start = time.time()
    _run([str(PY), "-m", "runner", "sharding=tablewise", f"train.steps={steps}", f"train.batch_size={batch}",
          "train.checkpoint.enabled=false", f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}",
          "tracking.experiment=benchmark", f"hydra.run.dir={run_folder}", *extra])
    r = json.loads((run_folder / "results.json").read_text())
    plan = json.loads((run_folder / "plan" / "plan.json").read_text())
    measured = json.loads((run_folder / "measured.json").read_text()) if (run_folder / "measured.json").exists() else {}
    return {"samples_per_s": r["samples_per_s"], "startup_s": r["first_step_unix"] - start,
            "startup_phases_s": r.get("startup_s", {}), "per_rank": measured.get("per_rank", []),
            "sharding_types": {t: p["sharding_type"] for m in plan.values() for t, p in m.items()}}


def write_parquet(folder: Path, rows: int) -> Path:
    """The synthetic source as Parquet (``mode=write_data``), for the Parquet line."""
    _run([str(PY), "-m", "runner", "mode=write_data", "data=parquet", f"data.path={folder}",
          f"data.write_rows={rows}", "data.write_files=2", f"tracking.uri=sqlite:///{folder.parent / 'mlflow.db'}",
          "tracking.experiment=benchmark_data", f"hydra.run.dir={folder.parent / 'write_data'}"])
    return folder


def parquet_overrides(folder: Path) -> tuple:
    return ("data=parquet", f"data.path={folder / 'train'}", f"data.eval_path={folder / 'eval'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=256, help="per worker")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "benchmark.json")
    ap.add_argument("--parquet-rows", type=int, default=400_000,
                    help="rows written for the Parquet line (0: no Parquet line)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: the plain loop and the runner on --gpus GPUs of this machine")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs (ranks) in --device cuda")
    ap.add_argument("overrides", nargs="*",
                    help="extra Hydra overrides for the runner, e.g. cluster.cpu_affinity=none")
    args = ap.parse_args()
    if args.device == "cuda":
        return cuda_main(args)
    rows: dict = {name: [] for name in SERIES}
    log_every = [o.split("=", 1)[1] for o in args.overrides if o.startswith("train.log_every=")]
    warmup = int(log_every[-1]) if log_every else 50  # the runner's first log window, untimed by both
    series = SERIES + (("runner_parquet",) if args.parquet_rows else ())
    rows["runner_parquet"] = []
    with tempfile.TemporaryDirectory() as d:
        data = write_parquet(Path(d) / "clicks", args.parquet_rows) if args.parquet_rows else None
        for i in range(args.repeats):
            for name in series[i % len(series):] + series[:i % len(series)]:  # each first in turn
                tmp = Path(d) / f"{name}{i}"
                tmp.mkdir()
                if name.startswith("runner"):
                    extra = (*args.overrides, *(parquet_overrides(data) if name == "runner_parquet" else ()),
                             *(UNFUSED if name == "runner_unfused" else ()))
                    rows[name].append(run_runner(args.steps, args.batch, tmp, extra))
                else:
                    rows[name].append(run_plain(args.steps, args.batch, tmp, name == "plain_bound", warmup))
                print(f"[{i + 1}/{args.repeats}] {name:12s} {rows[name][-1]['samples_per_s']:9.0f} samples/s  "
                      f"start-up {rows[name][-1]['startup_s']:5.1f} s", flush=True)
    plans_equal = all(r["sharding_types"] == rows["plain"][0]["sharding_types"] for n in series for r in rows[n])
    med = {n: {k: statistics.median(r[k] for r in rows[n]) for k in ("samples_per_s", "startup_s")} for n in rows
           if rows[n]}
    pairs_faster = sum(r["samples_per_s"] > p["samples_per_s"] for r, p in zip(rows["runner"], rows["plain"],
                                                                               strict=True))
    summary = {
        "steps": args.steps, "batch_per_worker": args.batch, "world_size": 2, "repeats": args.repeats,
        "runner_overrides": args.overrides, "same_plan": plans_equal, "median": med, "runs": rows,
        "throughput_ratio_runner_over_plain": med["runner"]["samples_per_s"] / med["plain"]["samples_per_s"],
        "throughput_ratio_runner_over_plain_bound":
            med["runner"]["samples_per_s"] / med["plain_bound"]["samples_per_s"],
        "throughput_ratio_runner_unfused_over_plain_bound":
            med["runner_unfused"]["samples_per_s"] / med["plain_bound"]["samples_per_s"],
        "startup_ratio_runner_over_plain": med["runner"]["startup_s"] / med["plain"]["startup_s"],
        "repeats_runner_faster_than_plain": pairs_faster,
    }
    if data is not None:
        summary["throughput_ratio_parquet_over_synthetic"] = (med["runner_parquet"]["samples_per_s"]
                                                              / med["runner"]["samples_per_s"])
    phases = rows["runner"][0].get("startup_phases_s") or {}
    if phases:
        summary["runner_startup_phases_s"] = {
            k: statistics.median(r["startup_phases_s"][k] for r in rows["runner"]) for k in phases}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2))
    print(f"\nsame plan: {plans_equal}")
    print(f"{'':15s}{'samples/s':>10s}{'start-up s':>12s}   (min..max samples/s)")
    for n in series:
        lo, hi = min(r["samples_per_s"] for r in rows[n]), max(r["samples_per_s"] for r in rows[n])
        print(f"{n:15s}{med[n]['samples_per_s']:10.0f}{med[n]['startup_s']:12.1f}   ({lo:.0f}..{hi:.0f})")
    if phases:
        print("runner start-up, s after `python -m runner` began (medians): " +
              ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in summary["runner_startup_phases_s"].items()))
    print(f"runner / plain: throughput x{summary['throughput_ratio_runner_over_plain']:.3f} "
          f"(faster in {pairs_faster} of {args.repeats} repeats), "
          f"start-up x{summary['startup_ratio_runner_over_plain']:.2f}; "
          f"runner / plain_bound: throughput x{summary['throughput_ratio_runner_over_plain_bound']:.3f} "
          f"(with torch's default dense optimizer: x{summary['throughput_ratio_runner_unfused_over_plain_bound']:.3f})"
          f"  (written to {args.out})")
    if data is not None:
        print(f"parquet: runner on {args.parquet_rows} Parquet rows / the same job on synthetic data: throughput "
              f"x{summary['throughput_ratio_parquet_over_synthetic']:.3f} (data.num_workers: the option's)")


def cuda_main(args: argparse.Namespace) -> None:
    """The plain loop and the runner on GPUs, alternating; the ratio and the runner's per-rank figures."""
    rows: dict = {"plain": [], "runner": []}
    extra = ("cluster.device=cuda", f"cluster.workers_per_node={args.gpus}", "cluster.nodes=1", *args.overrides)
    log_every = [o.split("=", 1)[1] for o in args.overrides if o.startswith("train.log_every=")]
    warmup = int(log_every[-1]) if log_every else 50
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.repeats):
            for name in (("plain", "runner") if i % 2 == 0 else ("runner", "plain")):
                tmp = Path(d) / f"{name}{i}"
                tmp.mkdir()
                rows[name].append(run_runner(args.steps, args.batch, tmp, extra) if name == "runner" else
                                  run_plain(args.steps, args.batch, tmp, False, warmup, "cuda", args.gpus))
                print(f"[{i + 1}/{args.repeats}] {name:7s} {rows[name][-1]['samples_per_s']:11.0f} samples/s  "
                      f"start-up {rows[name][-1]['startup_s']:5.1f} s", flush=True)
    med = {n: {k: statistics.median(r[k] for r in rows[n]) for k in ("samples_per_s", "startup_s")} for n in rows}
    ratio = med["runner"]["samples_per_s"] / med["plain"]["samples_per_s"]
    same = all(r["sharding_types"] == rows["plain"][0]["sharding_types"] for n in rows for r in rows[n])
    summary = {"device": "cuda", "gpus": args.gpus, "steps": args.steps, "batch_per_rank": args.batch,
               "same_plan": same, "median": med, "runs": rows, "throughput_ratio_runner_over_plain": ratio}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2))
    print(f"\nsame plan: {same}; GPUs: {args.gpus}")
    for n in rows:
        print(f"{n:8s}{med[n]['samples_per_s']:12.0f} samples/s  start-up {med[n]['startup_s']:5.1f} s")
    last = rows["runner"][-1]["per_rank"]
    for r, x in enumerate(last):
        print(f"runner rank {r}: step {x['step_ms']:.3f} ms, embedding forward "
              f"{x.get('embedding_fwd_ms') or float('nan'):.3f} ms (the plan's estimates: the run's measured.json)")
    print(f"runner / plain on CUDA: throughput x{ratio:.3f}, start-up "
          f"x{med['runner']['startup_s'] / med['plain']['startup_s']:.2f}  (written to {args.out})")


if __name__ == "__main__":
    main()
