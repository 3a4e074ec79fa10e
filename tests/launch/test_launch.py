"""Launching: under an external torchrun, and stopping a running job with SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import FAST, ROOT, finished_run, metric_history, processes_tagged, run_cli, runs, stderr_lines

pytestmark = pytest.mark.slow


def torchrun_command(overrides: list, tmp_path: Path, config: str = "") -> list:
    """Resolve a config with the runner (or take ``config``, a resolved config's text): the command that runs
    its workers under a plain torchrun."""
    if not config:
        printed = run_cli([*FAST, *overrides, "--cfg", "job", "--resolve"])
        assert printed.returncode == 0, printed.stderr
        config = printed.stdout
    tmp_path.mkdir(parents=True, exist_ok=True)
    job = tmp_path / "job.yaml"
    job.write_text(config)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
            "runner.launch.torchrun", str(job)]


def torchrun_job(overrides: list, tmp_path: Path, config: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(torchrun_command(overrides, tmp_path, config), cwd=ROOT, text=True, capture_output=True,
                          timeout=300)


def gloo_loop_nices(run_folder: Path) -> list:
    """The nice of each rank's gloo event-loop threads (ranks' pids from the run folder)."""
    found = []
    for pid_file in sorted((run_folder / "pids").glob("rank*.pid")):
        task = Path("/proc") / pid_file.read_text().strip() / "task"
        found += [os.getpriority(os.PRIO_PROCESS, int(t.name)) for t in task.iterdir()
                  if (t / "comm").read_text().startswith("gloo_tcp_loop")]
    return found


def _artifacts(store: str, run_id: str, path: str = "") -> set:
    from mlflow import MlflowClient

    found = set()
    for a in MlflowClient(store).list_artifacts(run_id, path or None):
        found |= _artifacts(store, run_id, a.path) if a.is_dir else {a.path}
    return found


# what only the driver's path has: Hydra's folder, its overrides and choices, its agents and their start-up
DRIVER_ONLY_ARTIFACTS = (".hydra/",)
DRIVER_ONLY_TAGS = ("runner.overrides", "runner.choice.", "runner.agent_prewarmed", "runner.run_dir", "runner.attempt",
                    "runner.config_hash", "runner.kind", "mlflow.note.content", "runner.launcher")


def test_the_driver_and_a_plain_torchrun_end_a_job_alike(store: str, tmp_path: Path) -> None:
    """The same resolved config run by the runner's driver and by a plain torchrun: the same status, tags and
    artifacts (the plan's chart among them: drawn by rank 0's process once the ranks have ended, no driver),
    apart from what only the driver's path has; both print the summary line."""
    from omegaconf import OmegaConf

    _, driven = finished_run(store, "torchrun_driver", tmp_path / "driver", FAST)
    config = OmegaConf.load(tmp_path / "driver" / "resolved.yaml")
    config.tracking.experiment = "torchrun"
    proc = torchrun_job([], tmp_path / "torchrun", OmegaConf.to_yaml(config))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[runner] done:" in proc.stdout
    (run,) = runs(store, "torchrun")
    assert run.info.status == driven.info.status == "FINISHED"
    assert run.data.tags["runner.world_size"] == "2" and run.data.tags["runner.launcher"] == "torchrun"
    assert len(metric_history(store, run.info.run_id, "train/loss")) == 3
    assert (tmp_path / "torchrun" / "plan" / "plan.json").exists()
    mine = {k for k in run.data.tags if not k.startswith(DRIVER_ONLY_TAGS)}
    theirs = {k for k in driven.data.tags if not k.startswith(DRIVER_ONLY_TAGS)}
    assert mine == theirs, (mine ^ theirs)
    assert set(run.data.metrics) == set(driven.data.metrics), set(run.data.metrics) ^ set(driven.data.metrics)
    arts, driver_arts = _artifacts(store, run.info.run_id), _artifacts(store, driven.info.run_id)
    assert "plan/plan.png" in arts and "plan/plan.json" in arts, arts
    assert arts == {a for a in driver_arts if not a.startswith(DRIVER_ONLY_ARTIFACTS)}, arts ^ driver_arts


def test_sigterm_stops_every_worker_and_marks_run_killed(store: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    env = dict(os.environ, PYTHONUNBUFFERED="1", RUNNER_TEST_TAG=tag)
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", *FAST, "train.steps=100000", f"tracking.uri={store}",
         "tracking.experiment=sigterm", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "plan" / "plan.json").exists():  # workers are training
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(1.0)
        assert gloo_loop_nices(tmp_path) == [19, 19]  # cluster.gloo_loop_priority=low, in each training rank
        stopped_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        took = time.monotonic() - stopped_at
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert took < 15, took
    deadline = time.monotonic() + 5
    while processes_tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_tagged(tag) == []
    (run,) = runs(store, "sigterm")
    assert run.info.status == "KILLED"


def test_sigterm_under_external_torchrun_writes_every_report_and_ends_killed(store: str, tmp_path: Path) -> None:
    """torchrun stops its workers with SIGTERM: rank 0 (whose process owns the run, delivering its event log
    from a thread) writes every report it made, with the time it measured it, then ends the run KILLED."""
    from mlflow.tracking import MlflowClient

    cmd = torchrun_command(["train.steps=100000", f"tracking.uri={store}", "tracking.experiment=torchrun_term"],
                           tmp_path)
    proc = subprocess.Popen(cmd, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "plan" / "plan.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        time.sleep(3.0)  # a few hundred steps: reports queued and written meanwhile
        stopped_at = time.time()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    (run,) = runs(store, "torchrun_term")
    # KILLED when rank 0 takes its SIGTERM first; when rank 1's exit breaks rank 0's collective before that,
    # rank 0 ends the run FAILED with that error: either way the run is ended and no report is lost
    assert run.info.status in ("KILLED", "FAILED"), (run.info.status, err[-3000:])
    if run.info.status == "KILLED":
        assert run.data.tags["error"] == "stopped by SIGTERM" and "[runner] rank 0 stopped by SIGTERM" in err
    hist = sorted(MlflowClient(store).get_metric_history(run.info.run_id, "train/loss"), key=lambda m: m.step)
    steps = [m.step for m in hist]
    assert len(steps) >= 3 and steps == list(range(10, steps[-1] + 1, 10)), steps  # none missing
    stamps = [m.timestamp for m in hist]
    assert all(a < b for a, b in zip(stamps, stamps[1:], strict=False)) and stamps[-1] <= stopped_at * 1000 + 1000


def test_the_same_failure_has_one_outcome_through_the_driver_and_a_plain_torchrun(store: str, tmp_path: Path) -> None:
    """A job whose plan cannot fit (1 MiB of memory per worker: planning fails inside the workers, after the run
    was created), run by the runner's driver and by a plain torchrun: one error line naming the rank, no
    traceback, no process left; each path writes its one outcome, the same line in ``status.json`` and as the
    MLflow run's reason, and the two paths' lines are the same (the failing rank named as the driver names it)."""
    import json
    import re

    tag = uuid.uuid4().hex
    fails = ["cluster.ddr_cap_gib=0.001", f"tracking.uri={store}"]
    driven = run_cli([*FAST, *fails, "tracking.experiment=fail_driver", f"hydra.run.dir={tmp_path / 'driver'}"],
                     tag=tag)
    assert driven.returncode == 1
    err = [ln for ln in stderr_lines(driven.stderr) if ln.startswith("error:")]
    assert len(err) == 1 and "Traceback" not in driven.stderr, driven.stderr[-2000:]
    assert processes_tagged(tag) == []
    proc = torchrun_job([*fails, "tracking.experiment=torchrun_fail"], tmp_path / "torchrun")
    assert proc.returncode != 0
    lines = []
    for experiment, folder in (("fail_driver", "driver"), ("torchrun_fail", "torchrun")):
        (run,) = runs(store, experiment)
        status = json.loads((tmp_path / folder / "status.json").read_text())
        assert run.info.status == status["status"] == "FAILED"
        assert run.data.tags["error"] == status["error"], (run.data.tags["error"], status["error"])
        lines.append(status["error"])
    assert err[0] == f"error: {lines[0]}"
    assert lines[0].startswith("job failed: rank ") and "no sharding plan fits" in lines[0] and "t0" in lines[0]
    # either rank may record its refusal first: the rank named aside, the lines are the same
    assert re.sub(r"rank \d", "rank R", lines[0]) == re.sub(r"rank \d", "rank R", lines[1]), lines


def test_one_driver_per_host_gives_one_mlflow_run(store: str, tmp_path: Path) -> None:
    """A 2-host job as a cluster runs it: one `python -m runner cluster.node_rank=K` per host (here two
    drivers on this host, each with its own run folder). Only the host where rank 0 lands logs the run."""
    from runner.launch.processes.ports import free_port

    port, tag = free_port(), uuid.uuid4().hex
    env = dict(os.environ, PYTHONUNBUFFERED="1", RUNNER_TEST_TAG=tag)
    env.pop("MLFLOW_TRACKING_URI", None)
    drivers = [subprocess.Popen(
        [sys.executable, "-m", "runner", *FAST, "cluster=2node", f"cluster.node_rank={k}",
         f"cluster.master_port={port}", f"tracking.uri={store}", "tracking.experiment=hosts",
         f"hydra.run.dir={tmp_path / f'host{k}'}"], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE) for k in (0, 1)]
    outs = [d.communicate(timeout=300) for d in drivers]
    assert [d.returncode for d in drivers] == [0, 0], [o[1][-2000:] for o in outs]
    (run,) = runs(store, "hosts")
    assert run.info.status == "FINISHED" and run.data.tags["runner.world_size"] == "4"
    assert len(metric_history(store, run.info.run_id, "train/loss")) == 3
    hosting = [k for k in (0, 1) if (tmp_path / f"host{k}" / "pids" / "rank0.pid").exists()]
    assert len(hosting) == 1
    other = 1 - hosting[0]
    assert run.info.run_id in outs[hosting[0]][0] and "[runner] done:" in outs[hosting[0]][0]
    assert "rank 0 ran on another host" in outs[other][0] and "MLflow run" not in outs[other][0].replace(
        "logged the MLflow run", "")
    assert not processes_tagged(tag)


def test_plan_only_joblib_sweep_runs_contiguous_batches_per_process() -> None:
    from runner.cli import precheck  # (the entry registers the schema and resolvers)

    def launcher_overrides(args: list) -> list:
        error, added = precheck(args)
        assert error is None, error
        return [a for a in added if a.startswith("hydra.launcher.")]  # (a grid sweep also names its sweeper)

    sweep = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "mode=plan",
             "cluster.cross_node_bandwidth=1,3,6", "sharding.storage_reserve_percent=0.1,0.2,0.3"]
    assert launcher_overrides(sweep) == ["hydra.launcher.batch_size=5"]  # 9 points, 2 processes
    assert launcher_overrides([*sweep, "hydra.launcher.batch_size=1"]) == []  # the user's choice stands
    assert launcher_overrides([a for a in sweep if a != "mode=plan"]) == []  # training points: joblib's own
    assert launcher_overrides([a for a in sweep if a != "-m"]) == []
