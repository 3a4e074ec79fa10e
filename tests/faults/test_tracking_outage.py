"""The tracking server dies mid-run: training goes on, nothing it would have logged is lost.

Against a real ``mlflow server`` killed with SIGKILL while a job trains and started again later (on the
same port and store): reports made meanwhile reach the run, with their original steps and times, either
when the driver sees the server back, or with ``python -m runner sync`` after the job ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FAST, ROOT, MlflowServer, runs
from test_faults import Job

pytestmark = [pytest.mark.slow, pytest.mark.faults]


def kept_points(run_dir: Path, key: str) -> dict:
    """step -> unix ms of ``key`` in rank 0's event log: what the store must hold."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return {e["step"]: e["time"] for e in events if e["kind"] == "metrics" and key in e["metrics"]}


def stored_points(url: str, run_id: str, key: str) -> dict:
    from mlflow.tracking import MlflowClient

    return {m.step: m.timestamp for m in MlflowClient(url).get_metric_history(run_id, key)}


def test_server_outage_mid_run_and_after_the_end(tmp_path: Path) -> None:
    server = MlflowServer(tmp_path / "server")
    server.start()
    try:
        # 1. the server dies while the job trains and is back before it ends: the driver delivers the backlog
        one = [*FAST, "train.log_every=5", "cluster.workers_per_node=1"]  # a core left for the server's restart
        live = Job(tmp_path / "live", server.url, "outage", [*one, "train.steps=100000"])
        live.wait_for("delivered.json")
        server.stop(signal.SIGKILL)
        time.sleep(4)
        restart_s = server.start()
        deadline = time.monotonic() + 120
        while f"{server.url} is back" not in live.out.read_text():
            assert live.proc.poll() is None and time.monotonic() < deadline, live.out.read_text()[-2000:]
            time.sleep(0.5)
        time.sleep(3)  # a few more reports after the outage
        live.proc.send_signal(signal.SIGTERM)
        assert live.finish() == 143
        out = live.out.read_text()
        assert out.count("unreachable (") == 1 and out.count(f"{server.url} is back") == 1, out[-3000:]
        assert "Retrying" not in out + live.err.read_text()
        (run,) = runs(server.url, "outage")
        assert run.info.status == "KILLED"
        if len(os.sched_getaffinity(0)) > 1:  # one worker takes every core: the prewarmed agent's torch (loaded
            assert run.data.tags["runner.agent_prewarmed"] == "false"  # for the default's two) is not used
        want = kept_points(live.run_dir, "train/loss")
        got = stored_points(server.url, run.info.run_id, "train/loss")
        assert got == want and len(want) > 10  # every point, at the step and time rank 0 measured it

        # 2. the server dies and stays away until the job ended: the ending is kept, sync delivers it
        late = Job(tmp_path / "late", server.url, "outage_end", [*one, "train.steps=400"])
        late.wait_for("delivered.json")
        server.stop(signal.SIGKILL)
        assert late.finish(120) == 0, late.err.read_text()[-2000:]  # training finished: exit 0
        out = late.out.read_text()
        assert "tracking pending" in out and f"python -m runner sync {late.run_dir}" in out, out[-2000:]
        server.start()
        (run,) = runs(server.url, "outage_end")
        before = len(stored_points(server.url, run.info.run_id, "train/loss"))
        assert run.info.status == "RUNNING"
        sync = subprocess.run([sys.executable, "-m", "runner", "sync", str(late.run_dir)], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert sync.returncode == 0, sync.stderr
        (run,) = runs(server.url, "outage_end")
        want = kept_points(late.run_dir, "train/loss")
        got = stored_points(server.url, run.info.run_id, "train/loss")
        assert run.info.status == "FINISHED" and got == want and len(want) == 80
        assert "eval/auc" in run.data.metrics
        print(f"outage: server back after {restart_s:.0f}s, {len(kept_points(live.run_dir, 'train/loss'))} "
              f"points all stored; after the end: {before} stored before sync, {len(got)} after")
    finally:
        server.stop()
