"""``make gpu-check``: one command that checks a GPU box end to end, and a report to send us.

    make gpu-check                       # builds the CUDA environment first (make gpu-env), then this
    .venv/bin/python benchmarks/gpu_check.py [--out outputs/gpu-check] [--skip-tests] [--cpu] [--only a,b]

1. What it found: every GPU (name, compute capability, bf16 in hardware, memory), the CUDA build of torch,
   FBGEMM, TorchRec and NCCL versions, and which GPUs the runner sees.
2. The suite's GPU tests (``pytest -m gpu``: one GPU; with two or more NCCL with 2 ranks, a DCP checkpoint and
   resume, fp16, a UVM-caching table).
3. Runner commands over the CUDA path, each with its outcome and figures (samples/s, the measured peak memory
   against the plan's estimate, the HBM cap the planner was given):
   training on one GPU; an HBM cap above the device's, refused; bf16 with a checkpoint, then resume (fp32 on a
   GPU without bf16); fp16 with gradient accumulation; a UVM-caching table, then its pinned plan; Parquet
   data; a refusal for too few GPUs.

Writes ``<out>/report.md`` (and each step's output under ``<out>/<step>/``) and prints its table; exit 1 when a
step did not end as expected. Meant to finish within 15 minutes on one H100 after the install.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHORT = ["train.steps=200", "train.log_every=50", "data.eval_batches=8"]


def found() -> Tuple[List[str], str]:
    """Lines describing the box: GPUs (through NVML: nothing initialised here), the driver's CUDA, versions;
    and why the runner cannot train on its GPUs ('' when it can: :func:`cuda_verdict`, as a job decides)."""
    from runner.config.precisions import in_hardware
    from runner.runtime.device import GIB, cuda_text, cuda_verdict, driver_cuda_version, host_gpus, visible_gpus

    lines = []
    gpus = host_gpus()
    try:
        import pynvml

        pynvml.nvmlInit()
        memory = [pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total / GIB
                  for i in range(len(gpus))]
        driver, driver_cuda = pynvml.nvmlSystemGetDriverVersion(), driver_cuda_version(pynvml)
        pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001
        memory, driver, driver_cuda = [float("nan")] * len(gpus), "unknown", None
    lines.append(f"- NVIDIA driver {driver} (runs CUDA {cuda_text(driver_cuda) if driver_cuda else 'unknown'}); "
                 f"{len(gpus)} GPU(s) listed")
    for i, ((name, cap, uuid), mem) in enumerate(zip(gpus, memory, strict=True)):
        lines.append(f"  - {i}: {name}, compute capability {cap[0]}.{cap[1]}, bf16 in hardware: "
                     f"{'yes' if in_hardware('bfloat16', cap) else 'no (torch would emulate it)'}, "
                     f"{mem:.1f} GiB, {uuid}")
    import fbgemm_gpu
    import torch
    import torchrec

    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.version.cuda else "none"
    lines.append(f"- torch {torch.__version__} (CUDA {torch.version.cuda or 'none: a CPU build'}), NCCL {nccl}, "
                 f"fbgemm_gpu {fbgemm_gpu.__version__}, torchrec {torchrec.__version__}")
    lines.append(f"- visible to the runner: {', '.join(visible_gpus(count=len(gpus))) or 'none'} "
                 f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    usable, note = cuda_verdict()
    return lines, "" if usable else (note.replace("[runner] note: ", "") or "no GPU is listed or visible")


class Step:
    """One runner command, its expected outcome and the figures read from its run folder."""

    def __init__(self, name: str, args: List[str], expect_ok: bool = True, says: str = "",
                 after: Optional[Callable[[Path], Dict[str, str]]] = None) -> None:
        self.name, self.args, self.expect_ok, self.says, self.after = name, args, expect_ok, says, after


def figures(run_folder: Path) -> Dict[str, str]:
    """samples/s, measured peak memory against the plan's estimate, the planner's HBM cap."""
    results = json.loads((run_folder / "results.json").read_text()) if (run_folder / "results.json").exists() else {}
    measured = json.loads((run_folder / "measured.json").read_text()) if (run_folder / "measured.json").exists() else {}
    out = {}
    if results.get("samples_per_s"):
        out["samples/s"] = f"{results['samples_per_s']:.0f}"
    if measured.get("measured/peak_mem_bytes"):
        out["peak GiB"] = f"{measured['measured/peak_mem_bytes'] / 2**30:.2f}"
    if measured.get("ratio/mem_measured_over_estimated"):
        out["peak / plan's estimate"] = f"{measured['ratio/mem_measured_over_estimated']:.2f}"
    if measured.get("error/mem") is not None:  # what the busiest rank holds above its baseline against its estimate
        out["held over baseline: error"] = f"{measured['error/mem']:+.0%}"
    if results.get("hbm_cap_bytes"):
        out["HBM cap GiB"] = f"{results['hbm_cap_bytes'] / 2**30:.2f}"
    return out


def run_step(step: Step, out: Path, uri: str) -> Dict[str, str]:
    run_folder = out / step.name
    args = [sys.executable, "-m", "runner", *step.args, f"hydra.run.dir={run_folder}", f"tracking.uri={uri}",
            "tracking.experiment=gpu-check"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
        code, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired:
        code, text = -1, "timed out after 600 s"
    run_folder.mkdir(parents=True, exist_ok=True)
    (run_folder / "output.txt").write_text(text)
    ok = (code == 0) == step.expect_ok and (not step.says or step.says in text)
    row = {"step": step.name, "outcome": "ok" if ok else "FAILED", "exit": str(code),
           "seconds": f"{time.perf_counter() - t0:.0f}"}
    row.update(figures(run_folder))
    if step.after is not None and ok:
        row.update(step.after(run_folder))
    if not ok:
        lines = [line for line in text.splitlines() if line.strip()]
        row["detail"] = (lines[-1] if lines else "no output")[:300]
    return row


GPU_ONLY = ("hbm_cap_above_device", "uvm_caching", "uvm_caching_pinned", "too_few_gpus")


def on_cpu(gpu_steps: List[Step]) -> List[Step]:
    """The steps that also run on CPU, on CPU: a check of this script's own steps, outcomes and figures where
    there is no GPU (``--cpu``)."""
    return [Step(s.name, [*s.args, "cluster.device=cpu"], s.expect_ok, s.says, s.after) for s in gpu_steps
            if s.name not in GPU_ONLY]


def steps(gpus: int, bf16: bool, out: Path) -> List[Step]:
    one = ["cluster.workers_per_node=1"]
    ckpt, data = out / "checkpoints", out / "parquet"
    precision = "precision=bf16" if bf16 else "precision=fp32"
    uvm_plan = out / "uvm_caching" / "plan" / "plan.json"
    return [
        Step("one_gpu", [*one, *SHORT]),
        Step("calibrate", [*one, "mode=calibrate", f"cluster.calibration_dir={out / 'calibrations'}",
                           "calibrate.max_spread=0.99"], says="calibration done"),
        Step("calibrated", [*one, *SHORT, f"cluster.calibration_dir={out / 'calibrations'}"], says="embeddings rated"),
        Step("dcn_calibrated", [*one, *SHORT, "model=dcn", f"cluster.calibration_dir={out / 'calibrations'}"],
             says="embeddings rated"),  # its dense part timed on the GPU before planning (its cross net's own device)
        Step("hbm_cap_above_device", [*one, *SHORT, "cluster.hbm_cap_gib=100000"], expect_ok=False,
             says="cluster.hbm_cap_gib=100000"),
        Step("bf16_checkpoint" if bf16 else "fp32_checkpoint",
             [*one, *SHORT, precision, f"train.checkpoint.dir={ckpt}", "train.checkpoint.every_steps=100"]),
        Step("resume", [*one, "train.steps=300", "train.log_every=50", "data.eval_batches=8", precision,
                        f"train.checkpoint.dir={ckpt}", "train.resume=latest", "train.checkpoint.enabled=false"],
             says="resumed from"),
        Step("fp16_accumulation", [*one, *SHORT, "precision=fp16", "train.grad_accumulation_steps=2"]),
        Step("uvm_caching", [*one, *SHORT, "sharding.compute_kernels=[fused_uvm_caching]"]),
        Step("uvm_caching_pinned", [*one, *SHORT, "sharding.compute_kernels=[fused_uvm_caching]",
                                    f"sharding.plan={uvm_plan}"]),
        Step("write_parquet", ["mode=write_data", f"data.path={data}"]),
        Step("parquet", [*one, *SHORT, "data=parquet", f"data.path={data / 'train'}",
                         f"data.eval_path={data / 'eval'}"]),
        Step("too_few_gpus", [*SHORT, f"cluster.workers_per_node={gpus + 1}"], expect_ok=False,
             says="need one GPU each"),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "outputs" / "gpu-check"))
    ap.add_argument("--skip-tests", action="store_true", help="leave out the suite's GPU tests")
    ap.add_argument("--only", default="", help="comma-separated step names to run (default: every step)")
    ap.add_argument("--cpu", action="store_true", help="no GPU: run the steps that also run on CPU, on CPU (a "
                    "check of this script itself; no GPU tests)")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    from runner.config.precisions import in_hardware
    from runner.runtime.device import host_gpus

    box, why = found()
    print("\n".join(box), flush=True)
    report = ["# gpu-check", "", "## What was found", "", *box, ""]
    if why and not args.cpu:
        report += [f"No GPU the runner can use ({why}): nothing else was run."]
        (out / "report.md").write_text("\n".join(report) + "\n")
        print(f"gpu-check: no usable GPU: {why}; report: {out / 'report.md'}", flush=True)
        raise SystemExit(1)
    failed = False
    if not args.skip_tests and not args.cpu:
        tests = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-q", "-m", "gpu",
                                "tests/train/test_gpu.py"], cwd=ROOT, capture_output=True, text=True)
        (out / "gpu-tests.txt").write_text(tests.stdout + tests.stderr)
        summary = (tests.stdout.strip().splitlines() or ["no output"])[-1]
        report += ["## GPU tests (pytest -m gpu)", "", f"exit {tests.returncode}: {summary}", ""]
        print(f"gpu tests: exit {tests.returncode}: {summary}", flush=True)
        failed |= tests.returncode != 0
    gpus = host_gpus()
    rows = []
    uri = f"sqlite:///{out / 'mlflow.db'}"
    planned = steps(len(gpus), bool(gpus) and in_hardware("bfloat16", gpus[0][1]), out)
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - {s.name for s in planned})
        if unknown:
            raise SystemExit(f"gpu-check: --only: no step {', '.join(unknown)}; the steps: "
                             f"{', '.join(s.name for s in planned)}")
        planned = [s for s in planned if s.name in wanted]
    for step in on_cpu(planned) if args.cpu else planned:
        row = run_step(step, out, uri)
        rows.append(row)
        failed |= row["outcome"] != "ok"
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    keys = ["step", "outcome", "exit", "seconds", "samples/s", "peak GiB", "peak / plan's estimate",
            "held over baseline: error", "HBM cap GiB",
            "detail"]
    report += ["## Runner commands", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    report += ["| " + " | ".join(r.get(k, "") for k in keys) + " |" for r in rows]
    report += ["", f"Total: {time.perf_counter() - t0:.0f} s. Send us this file and {out}/*/output.txt."]
    (out / "report.md").write_text("\n".join(report) + "\n")
    print(f"gpu-check: {'FAILED' if failed else 'ok'} in {time.perf_counter() - t0:.0f} s; report: "
          f"{out / 'report.md'}", flush=True)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
