"""Logging to a real ``mlflow server`` on 127.0.0.1, started and stopped by the test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import FAST, metric_history, run_cli, runs

from runner.launch.ports import free_port

pytestmark = pytest.mark.slow


@pytest.fixture()
def mlflow_server(tmp_path: Path):
    port = free_port()
    mlflow_bin = Path(sys.executable).parent / "mlflow"
    proc = subprocess.Popen(
        [str(mlflow_bin), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "artifacts")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, "mlflow server exited"
            assert time.monotonic() < deadline, "mlflow server did not come up"
            time.sleep(0.5)
        yield url, tmp_path / "artifacts"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def test_job_logs_to_remote_server(mlflow_server, tmp_path: Path) -> None:
    url, artifacts = mlflow_server
    proc = run_cli([*FAST, f"hydra.run.dir={tmp_path / 'run'}", "tracking.experiment=remote"],
                   env_extra={"MLFLOW_TRACKING_URI": url})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = runs(url, "remote")
    assert run.info.status == "FINISHED"
    assert run.data.params["train.steps"] == "30"
    assert len(metric_history(url, run.info.run_id, "train/loss")) == 3
    assert "eval/auc" in run.data.metrics
    # artifacts went through the server into its artifact store
    assert list(artifacts.rglob("plan.json")) and list(artifacts.rglob("resolved.yaml"))
