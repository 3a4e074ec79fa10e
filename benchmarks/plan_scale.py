"""Planning at every scale users have, in one run: the runner's whole ``mode=plan`` command (the preset's
balanced proposer) at the largest public instance (5,384 tables on 1,024 GPUs), at TorchRec's own largest
enumerator benchmark (6,400 tables on 2,048 GPUs) and at 1,000 tables on 128 GPUs; and, at 300 tables on 64
GPUs, the runner's dynamic-programming plan against TorchRec's own planner.

    .venv/bin/python benchmarks/plan_scale.py [--sizes 5384x1024,6400x2048,1000x128] [--small 300] [--greedy]
        [--sweep] [--beyond] [--beyond-timeout 600]

- ``import floor``: ``python -c "import torchrec.distributed.planner, mlflow, hydra"``, what any planning
  command pays before it plans; beside it, what a plan-only job imports (its mode's ``warm_imports``, the runner's CLI
  and Hydra), timed the same way, and each size's whole command as a multiple of the floor.
- each size: ``python -m runner mode=plan experiment=plan_many_tables model.generated_tables.count=N
  cluster=gpu_4x8 cluster.nodes=K``, timed whole (start-up, planning, the plan folder, the MLflow run); its
  peak memory (the command's own max RSS, from ``wait4``), its gap to the lower bound, whether it found a plan.
- ``raw``: TorchRec's own planner (its loop, enumerator, estimators and dynamic-programming proposer) on the
  300-table inputs, in this process (``runner.plan.planner.torchrec_planner``); its plan and per-rank
  estimates are compared with ``sharding.proposer=dynamic_programming``'s.
- ``--greedy``: the small case with ``sharding.proposer=greedy`` too, for its estimated step.
- ``--sweep``: the 9-point study at 5,384 x 1,024 (cross-node 6, 12.5, 25 GiB/s x reserve 0.1, 0.15, 0.3) as one
  ``-m`` sweep, timed whole, with every point's gap and the consistency check of ``plan_quality.py``.
- ``--beyond``: beyond the largest public instance, 20,000 generated tables on 8,192 GPUs (1,024 nodes of 8), the
  whole command with its progress lines, stopped after ``--beyond-timeout`` seconds (then reported unanswered).

Ends with ``plan-scale: tables=5384 ranks=1024 s=.. peak_gib=.. gap=..% plan=found | tables=6400 ranks=2048
... | tables=1000 ranks=128 ...``, after a line on the 300-table comparison (``dp-identity: ...``); exits 1
when the dynamic-programming plan differs from TorchRec's, a size finds no plan, or (``--sweep``) a point of
the study is unanswered or beaten at its own values by another point's plan.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
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


def job_imports() -> float:
    """Seconds to import what a plan-only job imports (its CLI, Hydra, its mode's ``warm_imports``), in a fresh
    process."""
    from runner.config.modes import MODES

    imports = MODES["plan"].warm_imports

    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import runner.cli, hydra, " + ", ".join(imports)], check=True, cwd=ROOT)
    return time.perf_counter() - t0


def runner_plan(tables: int, ranks: int, tmp: Path, extra: Tuple[str, ...] = (), timeout: Optional[float] = None,
                echo: bool = False) -> Dict[str, Any]:
    """The whole command; its seconds, results, plan and per-rank estimates, note and peak memory (``timeout``:
    stopped after that many seconds and reported unanswered; ``echo``: its progress lines printed as they come)."""
    run_folder = tmp / f"run{tables}{len(list(tmp.glob('run*')))}"
    t0 = time.perf_counter()
    with open(tmp / "out.txt", "w") as out, open(tmp / "err.txt", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "runner", "mode=plan", *overrides(tables, ranks), *extra,
                                 f"hydra.run.dir={run_folder}", f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}",
                                 "tracking.experiment=plan_scale"], cwd=ROOT, stdout=out, stderr=err, text=True)
        status, usage, shown = _wait(proc, timeout, tmp / "out.txt" if echo else None)
    seconds = time.perf_counter() - t0
    stdout, stderr = (tmp / "out.txt").read_text(), (tmp / "err.txt").read_text()
    if status is None:
        return {"seconds": seconds, "results": {}, "found": False, "note": "", "peak_gib": usage.ru_maxrss / 2**20,
                "plan": None, "per_rank": None, "timed_out": True}
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"runner plan failed:\n{stderr[-3000:]}")
    results = json.loads((run_folder / "results.json").read_text())
    found = results.get("plan_status") == "feasible"
    note = [line for line in stdout.splitlines() if line.startswith("[runner] note:")]
    return {"seconds": seconds, "results": results, "found": found, "note": note[0] if note else "",
            "peak_gib": usage.ru_maxrss / 2**20,
            "plan": json.loads((run_folder / "plan" / "plan.json").read_text()) if found else None,
            "per_rank": json.loads((run_folder / "plan" / "estimates.json").read_text())["per_rank"] if found else None}


def _wait(proc: subprocess.Popen, timeout: Optional[float], echo: Optional[Path]) -> Tuple[Optional[int], Any, int]:
    """The command's wait status (None where ``timeout`` stopped it) and resource use; ``echo``'s new lines printed
    every few seconds meanwhile."""
    import signal

    start, shown, said = time.perf_counter(), 0, 0.0
    while True:  # polled every 20 ms (the seconds are the caller's, taken when this returns), echoed every second
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if echo is not None and (pid or time.perf_counter() - said >= 1.0):
            said = time.perf_counter()
            lines = echo.read_text().splitlines()
            for line in lines[shown:]:
                print(f"  {line[:200]}", flush=True)
            shown = len(lines)
        if pid:
            return status, usage, shown
        if timeout is not None and time.perf_counter() - start > timeout:
            proc.send_signal(signal.SIGTERM)
            _, _, usage = os.wait4(proc.pid, 0)
            return None, usage, shown
        time.sleep(0.02)


def raw_plan(tables: int, ranks: int) -> Tuple[float, Optional[Tuple[Any, Any]]]:
    """TorchRec's own planner on the runner's inputs: (seconds of the call, (plan dict, per-rank estimates) or
    None)."""
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
        cfg = compose("config", overrides=overrides(tables, ranks) + ["sharding.proposer=dynamic_programming"])
    model = planning_model(cfg)
    estimates = PlanEstimates()
    t0 = time.perf_counter()
    try:
        plan = torchrec_planner(plan_spec(cfg), ranks, 8, "cuda", estimates, dense_bytes(model)).plan(
            model, sharders_for(cfg.precision))
    except Exception:  # noqa: BLE001 - no plan found
        return time.perf_counter() - t0, None
    seconds = time.perf_counter() - t0
    return seconds, (plan_to_dict(plan, table_specs(cfg.model)), per_rank_estimates(estimates.best_plan, ranks))


def study(tmp: Path, tables: int = 5384, ranks: int = 1024) -> Tuple[str, bool]:
    """The 9-point study (cross-node 6, 12.5, 25 GiB/s x reserve 0.1, 0.15, 0.3) as one ``-m`` sweep, timed whole;
    every point's gap, and the points whose plan another point's plan beats there (``plan_quality``'s check).
    Returns the summary's part and whether every point was answered with no violation."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import plan_quality

    seconds, points = plan_quality.sweep(tables, ranks, ([6, 12.5, 25], [0.1, 0.15, 0.3]), tmp)
    gaps = [p["results"]["est_step_ms"] / p["results"]["lower_bound_ms"] - 1 for p in points
            if p["results"].get("lower_bound_ms")]
    print(f"sweep, {tables} tables x {ranks} GPUs, {len(points)} points: {seconds:.1f} s whole, gaps "
          + ", ".join(f"{g:.2%}" for g in gaps), flush=True)
    bad, _ = plan_quality.violations(tables, ranks, points)
    ok = len(gaps) == len(points) == 9 and not bad
    return (f"sweep tables={tables} ranks={ranks} points={len(points)} s={seconds:.1f} answered={len(gaps)} "
            f"max_gap={max(gaps, default=float('nan')):.2%} violations={bad}"), ok


def beyond(tmp: Path, timeout: float, tables: int = 20000, ranks: int = 8192) -> str:
    """20,000 tables on 8,192 GPUs, the whole command, its progress shown; the summary's part."""
    print(f"runner, {tables} tables x {ranks} GPUs (stopped after {timeout:.0f} s):", flush=True)
    point = runner_plan(tables, ranks, tmp, timeout=timeout, echo=True)
    r = point["results"]
    if point.get("timed_out") or not point["found"]:
        print(f"runner, {tables} tables x {ranks} GPUs: no plan within {point['seconds']:.0f} s, peak memory "
              f"{point['peak_gib']:.2f} GiB", flush=True)
        return f"tables={tables} ranks={ranks} s={point['seconds']:.0f} peak_gib={point['peak_gib']:.2f} plan=none"
    gap = r.get("gap_to_bound")
    print(f"runner, {tables} tables x {ranks} GPUs: {point['seconds']:.1f} s whole, peak memory "
          f"{point['peak_gib']:.2f} GiB, estimated step {r['est_step_ms']:.3f} ms, gap "
          + ("n/a" if gap is None else f"{100 * gap:.2f}%"), flush=True)
    return (f"tables={tables} ranks={ranks} s={point['seconds']:.1f} peak_gib={point['peak_gib']:.2f} "
            f"gap={'n/a' if gap is None else f'{100 * gap:.2f}'}% plan=found")


def _size(text: str) -> Tuple[int, int]:
    tables, ranks = text.lower().split("x")
    return int(tables), int(ranks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="5384x1024,6400x2048,1000x128",
                    help="TABLESxGPUS, comma-separated: the balanced preset's whole command at each")
    ap.add_argument("--small", type=int, default=300, help="tables of the case compared with TorchRec (64 GPUs)")
    ap.add_argument("--greedy", action="store_true", help="also plan the small case with the greedy proposer")
    ap.add_argument("--sweep", action="store_true", help="also the 9-point study at 5,384 x 1,024 as one sweep")
    ap.add_argument("--beyond", action="store_true", help="also 20,000 tables on 8,192 GPUs")
    ap.add_argument("--beyond-timeout", type=float, default=600.0, help="seconds the --beyond command may take")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    parts = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        floor = import_floor()
        imports = job_imports()
        print(f"import floor: {floor:.1f} s; a plan-only job's imports: {imports:.1f} s", flush=True)
        for tables, ranks in map(_size, args.sizes.split(",")):
            point = runner_plan(tables, ranks, tmp)
            r = point["results"]
            gap = r.get("gap_to_bound")
            gap_text = "n/a" if gap is None else f"{100 * gap:.2f}"
            print(f"runner, {tables} tables x {ranks} GPUs: {point['seconds']:.1f} s whole "
                  f"({point['seconds'] / floor:.1f}x the import floor; planner "
                  f"{r.get('plan_seconds') or 0:.1f} s), peak memory {point['peak_gib']:.2f} GiB, "
                  + (f"estimated step {r['est_step_ms']:.3f} ms, lower bound {r['lower_bound_ms']:.3f} ms, gap "
                     f"{gap_text}%" if point["found"] else "no plan")
                  + (f"\n  {point['note']}" if point["note"] else ""), flush=True)
            parts.append(f"tables={tables} ranks={ranks} s={point['seconds']:.1f} "
                         f"x_floor={point['seconds'] / floor:.1f} peak_gib={point['peak_gib']:.2f} gap={gap_text}% "
                         f"plan={'found' if point['found'] else 'none'}")
        dp = ("sharding.proposer=dynamic_programming",)
        small = runner_plan(args.small, 64, tmp, dp)
        print(f"runner, {args.small} tables x 64 GPUs, dynamic_programming: {small['seconds']:.1f} s whole (planner "
              f"{small['results'].get('plan_seconds') or 0:.1f} s)", flush=True)
        if args.greedy:
            greedy = runner_plan(args.small, 64, tmp, ("sharding.proposer=greedy",))
            print(f"runner, {args.small} tables x 64 GPUs, greedy: {greedy['seconds']:.1f} s, estimated step "
                  f"{greedy['results'].get('est_step_ms')} ms (dynamic programming: "
                  f"{small['results'].get('est_step_ms')} ms)", flush=True)
        raw_s, raw = raw_plan(args.small, 64)
        print(f"TorchRec's planner, {args.small} tables x 64 GPUs: {raw_s:.1f} s, "
              f"{'plan found' if raw else 'no plan'}", flush=True)
        swept = True
        if args.sweep:
            part, swept = study(tmp)
            parts.append(part)
        if args.beyond:
            parts.append(beyond(tmp, args.beyond_timeout))
    parts.append(f"floor={floor:.1f}")
    identical = raw is not None and small["found"] and small["plan"] == json.loads(json.dumps(raw[0])) and \
        [dict(sorted(r.items())) for r in small["per_rank"]] == [dict(sorted(r.items())) for r in raw[1]]
    print(f"dp-identity: tables={args.small} ranks=64 runner_s={small['seconds']:.1f} raw_s={raw_s:.1f} "
          f"raw={'found' if raw else 'none'} identical={'yes' if identical else 'no'}")
    print("plan-scale: " + " | ".join(parts))
    if not identical or any("plan=none" in part for part in parts) or not swept:
        sys.exit("plan-scale: " + ("the dynamic-programming plan is not TorchRec's" if not identical
                                   else "the sweep left a point unanswered or inconsistent" if not swept
                                   else "a size found no plan"))


if __name__ == "__main__":
    main()
