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
from conftest import FAST, ROOT, MlflowServer, runs, to_the_background
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
    """Two jobs against one server, which dies while both train: one (``live``) goes on until the server is
    back and delivers its backlog; the other (``late``) ends while the server is away, keeps its ending, and
    ``python -m runner sync`` delivers it once the server is back."""
    server = MlflowServer(tmp_path / "server")
    server.start()
    try:
        one = [*FAST, "train.log_every=5", "cluster.workers_per_node=1"]  # a core left for the server's restart
        live = Job(tmp_path / "live", server.url, "outage", [*one, "train.steps=100000"])
        late_steps = 600  # enough that it cannot end (and deliver its ending) before the kill below
        late = Job(tmp_path / "late", server.url, "outage_end", [*one, f"train.steps={late_steps}"])
        live.wait_for("delivered.json")
        late.wait_for("delivered.json")
        server.stop(signal.SIGKILL)
        to_the_background(int((live.run_dir / "pids" / "rank0.pid").read_text()))  # it trains until the server is back
        # 1. the server stays away until ``late`` ended: its ending is kept, with one sync command to deliver it
        assert late.finish(120) == 0, late.err.read_text()[-2000:]  # training finished: exit 0
        out = late.out.read_text()
        assert "tracking pending" in out and f"python -m runner sync {late.run_dir}" in out, out[-2000:]
        # 2. the server is back while ``live`` trains: its driver delivers the backlog
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

        (run,) = runs(server.url, "outage_end")
        before = len(stored_points(server.url, run.info.run_id, "train/loss"))
        assert run.info.status == "RUNNING"
        sync = subprocess.run([sys.executable, "-m", "runner", "sync", str(late.run_dir)], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert sync.returncode == 0, sync.stderr
        (run,) = runs(server.url, "outage_end")
        want = kept_points(late.run_dir, "train/loss")
        got = stored_points(server.url, run.info.run_id, "train/loss")
        assert run.info.status == "FINISHED" and got == want and len(want) == late_steps // 5
        assert "eval/auc" in run.data.metrics
        print(f"outage: server back after {restart_s:.0f}s, {len(kept_points(live.run_dir, 'train/loss'))} "
              f"points all stored; after the end: {before} stored before sync, {len(got)} after")
    finally:
        server.stop()


def test_a_sweep_started_while_its_store_is_down_keeps_its_parent(tmp_path: Path) -> None:
    """Issue 47, item 5: a plan-only sweep whose server is down as it starts says so once (no Hydra warning), writes
    its report from the points, ends with one sync command for the sweep; after the server is up, that sync creates
    the parent with every point as its child, exactly once (a second sync changes nothing)."""
    from mlflow.tracking import MlflowClient

    server = MlflowServer(tmp_path / "server")  # its port, before it runs
    sweep = tmp_path / "sweep"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([sys.executable, "-m", "runner", "-m", "mode=plan", "cluster.cross_node_bandwidth=3,12",
                           f"tracking.uri={server.url}", "tracking.experiment=down_at_start",
                           f"hydra.sweep.dir={sweep}"], cwd=ROOT, env=env, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "Warning" not in out + proc.stderr and "raised TrackingError" not in out + proc.stderr
    assert out.count("unreachable (") == 1 and f"python -m runner sync {sweep}/" not in out, out[-3000:]
    assert out.strip().splitlines()[-1].endswith(f"deliver them with: python -m runner sync {sweep}"), out[-1000:]
    assert (sweep / "report" / "report.md").exists() and (sweep / "report" / "points.csv").exists()
    server.start()
    try:
        synced = subprocess.run([sys.executable, "-m", "runner", "sync", str(sweep)], cwd=ROOT, env=env,
                                text=True, capture_output=True, timeout=300)
        assert synced.returncode == 0, synced.stderr[-2000:]
        assert "3 of 3 runs complete" in synced.stdout, synced.stdout
        from runner.track.sync import sync

        assert sync([str(sweep)]) == 0  # again: nothing left, nothing made twice
        client = MlflowClient(server.url)
        found = runs(server.url, "down_at_start")
        parents = [r for r in found if r.data.tags.get("runner.kind") == "sweep"]
        assert len(found) == 3 and len(parents) == 1, [r.info.run_name for r in found]
        parent = parents[0]
        children = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert sorted(r.info.run_name for r in children) == ["xbw=12.0", "xbw=3.0"]
        assert parent.info.status == "FINISHED" and parent.data.metrics["sweep/points"] == 2
        assert "report" in [a.path for a in client.list_artifacts(parent.info.run_id)]
        assert json.loads((sweep / "sweep.json").read_text())["parent_run_id"] == parent.info.run_id
    finally:
        server.stop()
