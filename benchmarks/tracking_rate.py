"""Metrics per second from rank 0 to the MLflow store: the runner's two tracking paths vs plain MLflow calls.

    .venv/bin/python benchmarks/tracking_rate.py [--steps 2000] [--metrics 5] [--stores sqlite,http]

Rank 0 reports ``--metrics`` values every log step (``train/loss`` and the like), ``--steps`` reports.

- ``driver``: the path of every ``python -m runner`` job. Rank 0 appends each report to the run folder's
  event log (timed: what a training step pays), then the driver's pump writes the log to the store (timed:
  until everything is in the store, which is the most the path can sustain).
- ``torchrun``: the path of rank 0 under an external torchrun (its process owns the run): the same event
  log, delivered by a thread of the same process every 2 s (timed: what a step pays, then until the run
  ended with everything in the store).
- ``mlflow-sync`` / ``mlflow-async``: what a hand-written script does, ``mlflow.log_metrics(..., step=s)``
  once per report, synchronous or with ``synchronous=False`` and a flush at the end.

Stores: ``sqlite`` (a fresh SQLite file, MLflow's default) and ``http`` (a real ``mlflow server`` on
127.0.0.1 over its own SQLite file). Every case reads the histories back and checks that each of the
``steps x metrics`` points arrived with its step and its rank-0 timestamp (``lost`` counts the others).
Per case: ``<store> <path>: values/s=<rate> rank0_us_per_report=<us> lost=<n>``; the last line
``tracking-rate: <path>=<values/s> ...`` per store gives the runner's paths as ratios to ``mlflow-async``.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KEYS = ["train/loss", "train/samples_per_s", "train/lr_dense", "train/lr_sparse", "train/grad_norm",
        "train/auc", "train/ne", "train/step_ms"]


def reports(steps: int, metrics: int) -> List[Tuple[int, Dict[str, float]]]:
    keys = KEYS[:metrics] + [f"train/extra_{i}" for i in range(metrics - len(KEYS))]
    return [(s, {k: 1.0 / (s + 1) + j for j, k in enumerate(keys)}) for s in range(steps)]


def new_run(uri: str, name: str) -> str:
    from mlflow import MlflowClient

    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("tracking_rate")
    exp_id = exp.experiment_id if exp else c.create_experiment("tracking_rate")
    return c.create_run(exp_id, run_name=name).info.run_id


def lost(uri: str, run_id: str, data: List[Tuple[int, Dict[str, float]]], stamps: Dict[int, int]) -> int:
    """Points missing from the store, or stored with another value, or (when known) another timestamp."""
    from mlflow import MlflowClient

    c = MlflowClient(uri)
    missing = 0
    for key in data[0][1]:
        got = {m.step: m for m in c.get_metric_history(run_id, key)}
        for step, values in data:
            m = got.get(step)
            if m is None or abs(m.value - values[key]) > 1e-9 or (step in stamps and m.timestamp != stamps[step]):
                missing += 1
    return missing


def driver_path(uri: str, data: list, folder: Path) -> Tuple[float, float, int]:
    from runner.track.events import EventLog, EventPump

    run_id = new_run(uri, "driver")
    log = EventLog(folder / "events.jsonl")
    t0 = time.perf_counter()
    for step, values in data:
        log.metrics(values, step)
    rank0 = time.perf_counter() - t0
    log.close()
    stamps = {}
    import json

    for line in (folder / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        stamps[event["step"]] = event["time"]
    pump = EventPump(folder / "events.jsonl", uri, run_id, say=lambda s: None)
    t1 = time.perf_counter()
    assert pump(), "the store refused the backlog"
    deliver = time.perf_counter() - t1
    return rank0 + deliver, rank0, lost(uri, run_id, data, stamps)


def torchrun_path(uri: str, data: list, folder: Path) -> Tuple[float, float, int]:
    from runner.track.events import EventLog, EventPump
    from runner.track.mlflow_run import MlflowRun

    run_id = new_run(uri, "torchrun")
    run = MlflowRun(folder, uri)  # as rank 0's process runs it: the pump in a thread every 2 s while it reports
    run.run_id, run.pump = run_id, EventPump(folder / "events.jsonl", uri, run_id, say=lambda s: None)
    run.deliver_every(2.0)
    log = EventLog(folder / "events.jsonl")
    t0 = time.perf_counter()
    for step, values in data:
        log.metrics(values, step)
    rank0 = time.perf_counter() - t0
    log.close()
    assert run.end("FINISHED"), "the store refused the backlog"
    return time.perf_counter() - t0, rank0, lost(uri, run_id, data, {})


def mlflow_path(synchronous: bool) -> Callable:
    def run(uri: str, data: list, folder: Path) -> Tuple[float, float, int]:
        import mlflow

        os.environ.pop("MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS", None)  # MLflow's default (the runner sets it)
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment("tracking_rate")
        with mlflow.start_run(run_name=f"mlflow-{'sync' if synchronous else 'async'}") as run:
            t0 = time.perf_counter()
            for step, values in data:
                mlflow.log_metrics(values, step=step, synchronous=synchronous)
            rank0 = time.perf_counter() - t0
            if not synchronous:
                mlflow.flush_async_logging()
            total = time.perf_counter() - t0
        return total, rank0, lost(uri, run.info.run_id, data, {})
    return run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(folder: Path, port: Optional[int] = None) -> Tuple[subprocess.Popen, str]:
    """A real ``mlflow server`` on 127.0.0.1 (``port``, else a free one) with its store in ``folder``."""
    port = port or free_port()
    proc = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1", "--backend-store-uri",
                             f"sqlite:///{folder}/server.db", "--default-artifact-root", str(folder / "art")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise SystemExit("mlflow server did not start within 60 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--metrics", type=int, default=5)
    ap.add_argument("--stores", default="sqlite,http")
    args = ap.parse_args()
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    data = reports(args.steps, args.metrics)
    values = args.steps * args.metrics
    cases = {"driver": driver_path, "torchrun": torchrun_path, "mlflow-sync": mlflow_path(True),
             "mlflow-async": mlflow_path(False)}
    summary = []
    for store in args.stores.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            server = None
            if store == "http":
                server, uri = start_server(Path(tmp))
            else:
                uri = f"sqlite:///{tmp}/mlflow.db"
            try:
                rates = {}
                for name, case in cases.items():
                    folder = Path(tmp, name)
                    folder.mkdir()
                    total, rank0, missing = case(uri, data, folder)
                    rates[name] = values / total
                    print(f"{store} {name}: values/s={rates[name]:.0f} "
                          f"rank0_us_per_report={rank0 / args.steps * 1e6:.1f} lost={missing}", flush=True)
            finally:
                if server is not None:
                    server.terminate()
                    server.wait(30)
            summary.append(f"{store}: " + " ".join(
                f"{k}={rates[k]:.0f} ({rates[k] / rates['mlflow-async']:.2f}x)" for k in cases))
    print("tracking-rate: steps=%d metrics=%d | %s" % (args.steps, args.metrics, " | ".join(summary)))


if __name__ == "__main__":
    main()
