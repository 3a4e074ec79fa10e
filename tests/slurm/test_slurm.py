"""The runner on a real Slurm: two emulated nodes on this machine (``tests/slurm/cluster.sh``, which these
tests start when it is not up, as root; they skip, saying why, only where Slurm cannot be had).

Jobs are small (30 steps, one worker per node where the world size does not matter) so that the whole
file stays within a few minutes on 2 cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import List

import pytest
from conftest import FAST, ROOT, finished_run, metric_history, processes_tagged, run_cli, runs, to_the_background

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
CLUSTER = ROOT / "tests" / "slurm" / "cluster.sh"
ONE_WORKER = ["cluster=2node", "cluster.workers_per_node=1"]


@pytest.fixture(scope="session", autouse=True)
def slurm() -> None:
    """A running 2-node Slurm: the one already up, else started here (and stopped at the end)."""
    if subprocess.run(["bash", str(CLUSTER), "status"], capture_output=True).returncode == 0:
        yield
        return
    if os.geteuid() != 0:
        pytest.skip("no Slurm is up and starting one needs root (make slurm-up)")
    up = subprocess.run(["bash", str(CLUSTER), "up"], capture_output=True, text=True, timeout=900)
    if up.returncode != 0:
        pytest.skip(f"Slurm could not be started here: {(up.stderr or up.stdout).strip()[-400:]}")
    yield
    subprocess.run(["bash", str(CLUSTER), "down"], capture_output=True, timeout=120)


def job_state(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    m = re.search(r"JobState=(\w+)", out)
    return m.group(1) if m else "?"


def node_state(node: str) -> str:
    out = subprocess.run(["scontrol", "show", "node", node], capture_output=True, text=True).stdout
    m = re.search(r"State=(\S+)", out)
    return m.group(1) if m else "?"


def job_processes(job_id: str, node: str) -> List[int]:
    """Live processes of Slurm job ``job_id``'s tasks on ``node`` (their environment says so)."""
    want = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURMD_NODENAME={node}".encode()}
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and want <= set((d / "environ").read_bytes().split(b"\0")) \
                    and "\nState:\tZ" not in (d / "status").read_text():
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def slurm_sweep(store: str, experiment: str, sweep_folder: Path, args: List[str], tag: str,
                timeout: float = 300) -> subprocess.CompletedProcess:
    return run_cli(["-m", "hydra/launcher=slurm", *args, f"tracking.uri={store}", f"tracking.experiment={experiment}",
                    f"hydra.sweep.dir={sweep_folder}"], timeout=timeout, tag=tag)


def start_sweep(store: str, experiment: str, sweep_folder: Path, args: List[str], tag: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", RUNNER_TEST_TAG=tag)
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.Popen([sys.executable, "-m", "runner", "-m", "hydra/launcher=slurm", *args,
                             f"tracking.uri={store}", f"tracking.experiment={experiment}",
                             f"hydra.sweep.dir={sweep_folder}"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def until(check, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def wait_for(path: Path, within: float = 120) -> None:
    until(path.exists, within, f"{path} did not appear within {within} s")


def no_process_left(tag: str, within: float = 20) -> None:
    deadline = time.monotonic() + within
    while processes_tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_tagged(tag)


def test_sweep_submits_one_two_node_job_per_point(store: str, tmp_path: Path) -> None:
    """Two points, two Slurm jobs of 2 nodes x 2 workers; node 0's task opens each run; the losses are those of
    the same job run by the local launcher."""
    tag = uuid.uuid4().hex
    proc = slurm_sweep(store, "slurm-sweep", tmp_path / "sweep", ["cluster=2node", "sharding=rowwise,tablewise",
                                                                  *FAST], tag)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    all_runs = runs(store, "slurm-sweep")
    (parent,) = [r for r in all_runs if r.data.tags.get("runner.kind") == "sweep"]
    children = sorted((r for r in all_runs if r.data.tags.get("runner.kind") == "job"),
                      key=lambda r: int(r.data.tags["runner.job"]))
    assert len(children) == 2 and all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in children)
    ids = [r.data.tags["runner.slurm_job_id"] for r in children]
    assert len(set(ids)) == 2 and all(job_state(i) == "COMPLETED" for i in ids), ids
    assert parent.data.tags["runner.scheduler"] == "slurm" and parent.data.tags["runner.slurm_job_ids"] == ",".join(ids)
    for r, kind in zip(children, ("row_wise", "table_wise"), strict=True):
        t = r.data.tags
        assert r.info.status == "FINISHED" and t["runner.scheduler"] == "slurm" and t["runner.slurm_nodes"] == "n1,n2"
        assert t["runner.world_size"] == "4" and t["runner.nodes"] == "2" and kind in t["runner.sharding_types"]
        assert r.data.params["cluster.node_rank"] == "0" and r.data.params["cluster.master_addr"] == "127.0.0.1"
    point = tmp_path / "sweep" / "0"
    assert (point / "run.json").exists() and not (point / "node1" / "run.json").exists()  # node 0 opened it
    assert (point / "node1" / "status.json").exists()
    assert "[runner] point 0 (Slurm job" in proc.stdout and "FINISHED: done:" in proc.stdout
    _, local = finished_run(store, "slurm-local", tmp_path / "local", ["cluster=2node", "sharding=rowwise", *FAST])
    slurm_loss = metric_history(store, children[0].info.run_id, "train/loss")
    assert slurm_loss == pytest.approx(metric_history(store, local.info.run_id, "train/loss"), rel=1e-5)
    no_process_left(tag)


def test_worker_killed_on_node_1_fails_the_slurm_job(store: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    sweep = tmp_path / "sweep"
    proc = start_sweep(store, "slurm-fail", sweep, [*ONE_WORKER, "train.steps=5000", "train.log_every=10"], tag)
    pid_file = sweep / "0" / "node1" / "pids" / "rank1.pid"
    wait_for(sweep / "0" / "events.jsonl")
    wait_for(pid_file)
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    (run,) = [r for r in runs(store, "slurm-fail") if r.data.tags.get("runner.kind") == "job"]
    assert run.info.status == "FAILED"
    assert "rank 1 on node 1 failed: killed by SIGKILL" in run.data.tags["error"]
    assert job_state(run.data.tags["runner.slurm_job_id"]) == "FAILED"
    assert "rank 1 on node 1 failed: killed by SIGKILL" in out
    no_process_left(tag)


def test_scancel_ends_the_run_killed(store: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    sweep = tmp_path / "sweep"
    proc = start_sweep(store, "slurm-cancel", sweep, [*ONE_WORKER, "train.steps=5000", "train.log_every=10"], tag)
    wait_for(sweep / "0" / "node1" / "pids" / "rank1.pid")
    wait_for(sweep / "0" / "events.jsonl")
    (job_id,) = [d.name for d in (sweep / ".submitit").iterdir() if d.is_dir()]
    subprocess.run(["scancel", job_id], check=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    (run,) = [r for r in runs(store, "slurm-cancel") if r.data.tags.get("runner.kind") == "job"]
    assert run.info.status == "KILLED" and "was cancelled" in run.data.tags["error"]
    assert job_state(job_id) == "CANCELLED"
    no_process_left(tag)


def test_restart_inside_the_allocation_then_the_time_limit(store: str, tmp_path: Path) -> None:
    """A worker killed with cluster.max_restarts=1 is restarted in the same job; the job then runs into its
    time limit and the run ends FAILED saying so. Slurm sends its early signal (SIGUSR2) up to a minute before
    it is due, so the job starts with a limit far enough away and is given a short one once it has restarted:
    the signal then cannot come before the runner is listening for it."""
    tag = uuid.uuid4().hex
    sweep = tmp_path / "sweep"
    proc = start_sweep(store, "slurm-limit", sweep, [*ONE_WORKER, "cluster.max_restarts=1", "train.steps=100000",
                                                     "train.log_every=50", "hydra.launcher.timeout_min=5",
                                                     "hydra.launcher.signal_delay_s=30"], tag)
    pid_file = sweep / "0" / "node1" / "pids" / "rank1.pid"
    wait_for(sweep / "0" / "events.jsonl")
    wait_for(pid_file)
    killed = pid_file.read_text()
    os.kill(int(killed), signal.SIGKILL)
    until(lambda: pid_file.exists() and pid_file.read_text() not in ("", killed), 120, "rank 1 was not restarted")
    job = json.loads((sweep / "scheduler.json").read_text())["job_ids"][0]
    ran = re.search(r"RunTime=(?:(\d+)-)?(\d+):(\d+):(\d+)", subprocess.run(
        ["scontrol", "show", "job", job], capture_output=True, text=True).stdout)
    assert ran, f"no RunTime for job {job}"
    seconds = ((int(ran[1] or 0) * 24 + int(ran[2])) * 60 + int(ran[3])) * 60 + int(ran[4])
    minutes = -(-(seconds + 30) // 60)  # the first whole minute at least 30 s away
    subprocess.run(["scontrol", "update", f"jobid={job}", f"TimeLimit={minutes}"], check=True)
    for ranks in sweep.glob("0/node*/pids/rank*.pid"):  # from here the job trains only to reach its limit
        to_the_background(int(ranks.read_text()))
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, out[-2000:] + err[-2000:]
    (run,) = [r for r in runs(store, "slurm-limit") if r.data.tags.get("runner.kind") == "job"]
    assert run.info.status == "FAILED", run.data.tags.get("error")
    assert f"reached its time limit of 00:{minutes:02d}:00" in run.data.tags["error"], run.data.tags["error"]
    assert run.data.tags["runner.restarts"] == "1"
    assert job_state(run.data.tags["runner.slurm_job_id"]) == "TIMEOUT"
    log = next((sweep / ".submitit").rglob("*_0_log.out")).read_text()
    assert "time limit is near (SIGUSR2)" in log
    no_process_left(tag)


def test_a_job_that_lost_a_node_runs_again_as_its_next_attempt(store: str, tmp_path: Path) -> None:
    """Node n2 is lost while a 2-node point trains (``scontrol update state=down``): Slurm requeues the job, and
    with sweep.retries=1 the requeued job is the point's attempt 2, with its own MLflow run; attempt 1's run
    is FAILED, saying a node was lost; the earlier files are kept in previous/1."""
    tag = uuid.uuid4().hex
    sweep = tmp_path / "sweep"
    proc = start_sweep(store, "slurm-lost", sweep, [*ONE_WORKER, "train.steps=300", "train.log_every=10",
                                                    "train.checkpoint.enabled=false", "sweep.retries=1"], tag)
    try:
        wait_for(sweep / "0" / "events.jsonl")
        job = json.loads((sweep / "scheduler.json").read_text())["job_ids"][0]
        subprocess.run(["scontrol", "update", "nodename=n2", "state=down", "reason=lost-by-a-test"], check=True)
        downed = time.monotonic()
        until(lambda: job_state(job) == "PENDING", 60, "the job was not requeued")
        # One machine emulates both nodes, so attempt 1 still runs on the "lost" n2: end it there as a lost node
        # would, before n2 returns (else Slurm's clean-up of the job on the returning n2 can kill attempt 2's task)
        for pid in job_processes(job, "n2"):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        until(lambda: not job_processes(job, "n2"), 60, "attempt 1 did not end on n2")
        # Slurm holds a requeued job for a while (BeginTime, about 2 minutes): let it start now
        subprocess.run(["scontrol", "update", "nodename=n2", "state=resume"], capture_output=True)
        # and only once n2 is back and done cleaning up attempt 1 (on a loaded machine its clean-up came after
        # attempt 2 had started there, and ended it)
        until(lambda: node_state("n2").split("+")[0] == "IDLE" and not any(
            flag in node_state("n2") for flag in ("COMPLETING", "NOT_RESPONDING", "DOWN", "DRAIN")), 60,
            "n2 did not come back idle")
        # n2's slurmd ends the lost job's processes with SIGTERM, then SIGKILL after KillWait (10 s, cluster.sh) to
        # every process of that job id; the requeued attempt has the same id, so it starts only after that (n2 may be
        # back at once, ReturnToService=2: that SIGKILL then ended attempt 2's task on n2)
        time.sleep(max(0.0, 10 + 2 - (time.monotonic() - downed)))
        subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=True)
        out, err = proc.communicate(timeout=240)
    finally:
        subprocess.run(["scontrol", "update", "nodename=n2", "state=resume"], capture_output=True)
        proc.kill()
    assert proc.returncode == 0, out[-2000:] + err[-2000:]
    attempts = sorted((r for r in runs(store, "slurm-lost") if r.data.tags.get("runner.kind") == "job"),
                      key=lambda r: r.data.tags["runner.attempt"])
    assert [(r.data.tags["runner.attempt"], r.info.status) for r in attempts] == [("1", "FAILED"), ("2", "FINISHED")]
    assert f"Slurm requeued job {job} after it lost a node" in attempts[0].data.tags["error"]
    assert (sweep / "0" / "previous" / "1" / "events.jsonl").exists()
    (parent,) = [r for r in runs(store, "slurm-lost") if r.data.tags.get("runner.kind") != "job"]
    assert parent.info.status == "FINISHED"
    no_process_left(tag)


def test_hand_written_sbatch_script(store: str, tmp_path: Path) -> None:
    """experiments/train.sbatch (the README's): srun's tasks share one run folder; node 0 logs the one run."""
    tag = uuid.uuid4().hex
    env = dict(os.environ, RUNNER_TEST_TAG=tag)
    env.pop("MLFLOW_TRACKING_URI", None)
    job = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/slurm-%j.out", "experiments/train.sbatch",
                          *ONE_WORKER[1:], *FAST, f"tracking.uri={store}", "tracking.experiment=slurm-sbatch"],
                         cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout.strip()
    deadline = time.monotonic() + 180
    while job_state(job) in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
        assert time.monotonic() < deadline
        time.sleep(1)
    log = (tmp_path / f"slurm-{job}.out").read_text()
    assert job_state(job) == "COMPLETED", log[-2000:]
    (run,) = runs(store, "slurm-sbatch")
    assert run.info.status == "FINISHED" and run.data.tags["runner.slurm_job_id"] == job
    assert run.data.tags["runner.world_size"] == "2"
    run_folder = Path(run.data.tags["runner.run_dir"])
    assert run_folder == ROOT / "outputs" / "runs" / "slurm" / f"{job}.0"
    assert (run_folder / "node1" / "status.json").exists()
    assert "node 1 finished; node 0's task logged the MLflow run" in log
    no_process_left(tag)


@pytest.mark.parametrize("args, expected", [
    (["hydra.launcher.partition=nope"], "hydra.launcher.partition='nope' is not a partition of this Slurm"),
    (["hydra.launcher.partition=remote"], "are other hosts: run an mlflow server they reach"),
    (["cluster.nodes=0"], "cluster.nodes=0 is not allowed"),
    (["cluster=local,2node", "cluster.nodes=3"], "cluster.nodes=3 but the Slurm partition (default) has 2 node(s)"),
])
def test_refused_before_anything_is_submitted(store: str, tmp_path: Path, args: List[str], expected: str) -> None:
    """The partition ``remote``'s node is another host: a SQLite store on this disk would not be reached."""
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    proc = slurm_sweep(store, "slurm-refused", tmp_path / "sweep", [*args, *FAST], uuid.uuid4().hex, timeout=60)
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "sweep").exists()
    assert subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout == before
