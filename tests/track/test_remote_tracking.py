"""Logging to a real ``mlflow server`` on 127.0.0.1, started and stopped by the test."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FAST, MlflowServer, metric_history, run_cli, runs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    """One server for the module's tests (each uses its own experiment)."""
    server = MlflowServer(tmp_path_factory.mktemp("server"))
    try:
        server.start()
        yield server.url, server.artifacts
    finally:
        server.stop()


def test_job_logs_to_remote_server_with_credentials_never_written_down(mlflow_server, tmp_path: Path) -> None:
    """A job logs through a real server; ``MLFLOW_TRACKING_URI=http://user:password@host:port`` reaches it and
    the password is in no output and no record: terminal, run folder, MLflow params, tags and Description."""
    url, artifacts = mlflow_server
    secret = "s3cret-Pa55"
    run_folder = tmp_path / "run"
    proc = run_cli([*FAST, f"hydra.run.dir={run_folder}", "tracking.experiment=remote"],
                   env_extra={"MLFLOW_TRACKING_URI": url.replace("http://", f"http://alice:{secret}@")})
    assert proc.returncode == 0, proc.stderr[-3000:].replace(secret, "***")
    (run,) = runs(url, "remote")
    assert run.info.status == "FINISHED"
    assert run.data.params["train.steps"] == "30"
    assert len(metric_history(url, run.info.run_id, "train/loss")) == 3
    assert "eval/auc" in run.data.metrics
    # artifacts went through the server into its artifact store
    mine = [p.name for p in artifacts.rglob("*") if run.info.run_id in p.parts]  # the server is the module's
    assert "plan.json" in mine and "resolved.yaml" in mine
    assert secret not in proc.stdout + proc.stderr + str(run.data.params) + str(run.data.tags)
    for f in run_folder.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
    assert url.split("//")[1] in (run_folder / "run.json").read_text()  # the URI is kept, without its password


def test_joblib_plan_sweep_against_a_server_records_every_point(mlflow_server, tmp_path: Path) -> None:
    """The load test's sweep (``benchmarks/store_load.py``, 100 points there) at a size the suite affords:
    two processes writing one parent's points to a real ``mlflow server`` at once; every point FINISHED,
    with its params, metrics or reason, and the parent's counts right."""
    import sys

    from conftest import ROOT

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from store_load import plan_sweep

    printed: list = []
    _, problems = plan_sweep(mlflow_server[0], 4, 2, tmp_path / "sweep", "load", printed)
    assert problems == []
    links_open_the_model_training_view(mlflow_server[0], "load", printed[0])


def links_open_the_model_training_view(url: str, experiment: str, stdout: str) -> None:
    """The links a sweep printed, opened in headless Chromium: a point's run page shows the run and its
    metrics, the compare view every point; the experiment with ``workflowType`` opens on its runs table (the
    sweep's parent, its points nested), without it on GenAI's overview: why every link carries it."""
    import re

    from conftest import ui_text

    links = re.findall(r"https?://\S+workflowType=machine_learning", stdout)
    runs_shown = re.findall(r"/runs/(\w+)\?", " ".join(links))
    assert len(links) == len(runs_shown) + 1 >= 3, stdout[-2000:]  # each point's run, then the compare view
    text = ui_text(links[0])
    assert f"Run {runs_shown[0]} - MLflow" in text and "plan/est_step_ms" in text, text[:500]
    text = ui_text(links[-1])
    assert text.startswith(" Compare Runs - MLflow") and f"Comparing {len(runs_shown)} Runs from 1 Experiment" in text
    exp = re.search(r"#/experiments/(\d+)/", links[0]).group(1)
    (parent,) = [r.info.run_name for r in runs(url, experiment) if r.data.tags.get("runner.kind") != "job"]
    training_view = ui_text(f"{url}/#/experiments/{exp}?workflowType=machine_learning")
    assert f"Runs - Experiment {exp}" in training_view and parent in training_view, training_view[:500]
    assert "Overview - Experiment" in ui_text(f"{url}/#/experiments/{exp}")



def test_a_run_opened_while_the_server_is_away_is_kept_and_created_by_sync(mlflow_server, tmp_path: Path) -> None:
    """A job whose server is away when its run opens (a sweep's point during an outage) goes on: ``run.json``
    keeps what the run is to be created with, its params and reports wait in the event log, its ending in
    ``delivered.json``; ``python -m runner sync`` creates the run once, under its parent, and delivers it all."""
    from omegaconf import OmegaConf

    from runner.config.schema import RunnerConfig
    from runner.launch.processes.ports import free_port
    from runner.runtime import run_files
    from runner.track.events import EventLog
    from runner.track.mlflow_run import MlflowRun
    from runner.track.store import start_run
    from runner.track.sync import kept_runs, open_kept, sync

    url = mlflow_server[0]
    parent = start_run(url, "kept", "sweep", None, {"runner.kind": "sweep"})
    cfg = OmegaConf.merge(OmegaConf.structured(RunnerConfig), {"tracking": {"experiment": "kept"}})
    away = f"http://127.0.0.1:{free_port()}"  # nothing listens there: the server is away
    sweep = tmp_path / "sweep"
    run_folder = sweep / "0"
    run_folder.mkdir(parents=True)
    run = MlflowRun(run_folder, away)
    assert run.open(cfg.tracking.experiment, {"train": {"steps": 7}}, "xbw=3", parent, {"runner.job": 0}) is None
    assert run.opened and not run.deliver()  # retried at most every few seconds: not yet
    log = EventLog(run_folder / run_files.EVENTS)
    log.metrics({"plan/est_step_ms": 1.5}, 0)
    log.close()
    assert run.end("FINISHED") is False  # tried once more, still away: kept
    assert kept_runs(sweep) == [run_folder]
    assert run_files.read_json(run_folder / run_files.DELIVERED)["final"] == {"status": "FINISHED", "error": None}

    info = run_files.read_json(run_folder / run_files.RUN_INFO)  # the server is back, at the address the job had
    run_files.write_json(run_folder / run_files.RUN_INFO, {**info, "tracking_uri": url})
    assert sync([str(sweep)]) == 0
    (run,) = [r for r in runs(url, "kept") if r.info.run_id != parent]
    assert run.info.status == "FINISHED" and run.data.params["train.steps"] == "7"
    assert run.data.metrics["plan/est_step_ms"] == 1.5
    assert run.data.tags["mlflow.parentRunId"] == parent and run.data.tags["mlflow.runName"] == "xbw=3"
    assert kept_runs(sweep) == [] and run_files.read_json(run_folder / run_files.RUN_INFO)["run_id"] == run.info.run_id
    # a creation that reached the store before its answer was lost is found again, not made twice
    assert open_kept(run_folder, url, info["pending"]) == run.info.run_id
    assert sync([str(sweep)]) == 0 and len(runs(url, "kept")) == 2


class _AnswerLost:
    """A proxy in front of the real server that passes every call on but, for the first ``drop`` run creations,
    closes the connection once the server has stored the run, without its answer: a server killed between the two."""

    def __init__(self, upstream: str, drop: int) -> None:
        import http.client
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlparse

        target, lost = urlparse(upstream), self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # noqa: ANN002
                pass

            def _pass_on(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                conn.request(self.command, self.path, body, {k: v for k, v in self.headers.items()
                                                             if k.lower() not in ("host", "connection")})
                answer = conn.getresponse()
                data = answer.read()
                conn.close()
                if self.path.endswith("/runs/create") and lost.dropped < lost.drop:
                    lost.dropped += 1
                    self.close_connection = True  # stored, never answered
                    return
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = _pass_on

        self.drop, self.dropped = drop, 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_run_whose_creation_answer_was_lost_is_made_once(mlflow_server, tmp_path: Path) -> None:
    """A server that stored a run but died before answering: the client's retry made a second run (left RUNNING,
    empty, beside the job's), or no try was answered and the job kept its run for later while the store held one
    already. Each job still has one run: the duplicate is deleted, the kept record finds the stored run."""
    from omegaconf import OmegaConf

    from runner.config.schema import RunnerConfig
    from runner.runtime import run_files
    from runner.track.mlflow_run import MlflowRun
    from runner.track.store import RECORD_TAG
    from runner.track.sync import sync

    url = mlflow_server[0]
    cfg = OmegaConf.merge(OmegaConf.structured(RunnerConfig), {"tracking": {"experiment": "lost"}})
    for drop, folder in ((1, tmp_path / "retried"), (2, tmp_path / "kept")):
        proxy = _AnswerLost(url, drop)
        folder.mkdir()
        run = MlflowRun(folder, proxy.url)
        run_id = run.open(cfg.tracking.experiment, {"train": {"steps": 7}}, folder.name, None, {"runner.job": 0})
        assert proxy.dropped == drop
        # drop 1: the retry was answered, the job has its run and the try's run is gone. Drop 2: no answer at all,
        # the run is kept, and its creation once the store answers finds the run the store made
        assert (run_id is None) == (drop == 2)
        record = run.pending["tags"][RECORD_TAG] if run.pending else None
        assert run.end("FINISHED") and sync([str(folder)]) == 0
        proxy.server.shutdown()
        mine = [r for r in runs(url, "lost") if r.data.tags.get("mlflow.runName") == folder.name]
        assert len(mine) == 1, [(r.info.run_id, r.info.status) for r in mine]
        info = run_files.read_json(folder / run_files.RUN_INFO)
        assert mine[0].info.run_id == info["run_id"] and mine[0].info.status == "FINISHED"
        assert mine[0].data.params["train.steps"] == "7" and (record is None or mine[0].data.tags[RECORD_TAG] == record)
