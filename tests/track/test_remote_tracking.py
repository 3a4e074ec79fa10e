"""Logging to a real ``mlflow server`` on 127.0.0.1, started and stopped by the test."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FAST, MlflowServer, metric_history, run_cli, runs

pytestmark = pytest.mark.slow


@pytest.fixture()
def mlflow_server(tmp_path: Path):
    server = MlflowServer(tmp_path)
    try:
        server.start()
        yield server.url, server.artifacts
    finally:
        server.stop()


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


def test_credentials_in_the_uri_work_and_are_never_written_down(mlflow_server, tmp_path: Path) -> None:
    """``MLFLOW_TRACKING_URI=http://user:password@host:port`` reaches the server; the password is in no
    output and no record: terminal, run folder, MLflow params, tags and Description."""
    url, _ = mlflow_server
    secret = "s3cret-Pa55"
    with_credentials = url.replace("http://", f"http://alice:{secret}@")
    run_dir = tmp_path / "run"
    proc = run_cli([*FAST, f"hydra.run.dir={run_dir}", "tracking.experiment=credentials"],
                   env_extra={"MLFLOW_TRACKING_URI": with_credentials})
    assert proc.returncode == 0, proc.stderr[-3000:].replace(secret, "***")
    assert secret not in proc.stdout + proc.stderr
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
    (run,) = runs(url, "credentials")
    assert run.info.status == "FINISHED"
    record = str(run.data.params) + str(run.data.tags)
    assert secret not in record and url.split("//")[1] in run.data.tags.get("mlflow.note.content", "") + str(
        (run_dir / "run.json").read_text())
