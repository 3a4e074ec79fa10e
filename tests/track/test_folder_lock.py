"""A sweep folder has one owner at a time: a live holder refuses others in one line naming it; a holder that
died leaves a lock that is taken over, with a line that says so."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.runtime import folder_lock
from runner.runtime.folder_lock import FolderBusy, hold

HOLD = ("import sys, time; from pathlib import Path; from runner.runtime.folder_lock import hold; "
        "hold(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)")


def test_a_live_holder_refuses_and_a_dead_one_is_taken_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(folder_lock, "_HELD", {})
    other = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        with pytest.raises(FolderBusy) as refused:
            hold(tmp_path)
        assert f"the sweep folder {tmp_path} is in use by process {other.pid}" in str(refused.value)
        assert "\n" not in str(refused.value) and "python -m runner resume" in str(refused.value)
    finally:
        other.send_signal(signal.SIGKILL)  # dies holding it: the kernel releases the lock
        other.wait(10)
    deadline = time.time() + 10
    while True:
        try:
            note = hold(tmp_path)
            break
        except FolderBusy:
            assert time.time() < deadline
            time.sleep(0.1)
    assert note == f"[runner] the sweep folder's lock was held by process {other.pid}, which is gone: taken over"
    assert hold(tmp_path) is None  # this process holds it already



def test_a_holder_that_has_not_written_its_line_yet_is_still_named(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A new holder takes the lock, then writes its line: a refusal in between (the file still names the holder
    before it, which is gone) waits for the line and names the live holder, not \"another process\"."""
    monkeypatch.setattr(folder_lock, "_HELD", {})
    late = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); "
            "print('locked', flush=True); time.sleep(0.4); line = f'{os.getpid()} python -m runner x\\n'.encode(); "
            "os.pwrite(fd, line, 0); os.ftruncate(fd, len(line)); time.sleep(60)")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / folder_lock.LOCK_FILE).write_text(f"{gone.stdout.strip()} python -m runner -m old\n")
    other = subprocess.Popen([sys.executable, "-c", late, str(tmp_path / folder_lock.LOCK_FILE)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "locked"
        with pytest.raises(FolderBusy) as refused:
            hold(tmp_path)
        assert f"is in use by process {other.pid} (python -m runner x)" in str(refused.value), str(refused.value)
    finally:
        other.kill()
        other.wait(10)

@pytest.mark.slow
def test_a_second_job_on_a_live_jobs_run_folder_is_refused_before_it_touches_anything(tmp_path: Path) -> None:
    """A live job holds the run folder it was given (here a process holding it as the runner does, with the
    job's run.json): a second ``python -m runner hydra.run.dir=<it>`` exits 2 in one line naming the folder, the
    holder's pid and MLflow run, and leaves every file as it was; once the holder is gone the folder is free."""
    import json

    from conftest import ROOT

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"run_id": "0123abcd", "tracking_uri": "sqlite:///x.db"}))
    (run / "status.json").write_text("theirs")
    holder = ("import sys, time; from pathlib import Path; from runner.runtime.folder_lock import hold_run_folder; "
              "hold_run_folder(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)")
    other = subprocess.Popen([sys.executable, "-c", holder, str(run)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert other.stdout.readline().strip() == "held"
        before = {p.name: p.read_bytes() for p in run.iterdir()}
        proc = subprocess.run([sys.executable, "-m", "runner", "train.steps=5", f"hydra.run.dir={run}",
                               f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr[-2000:]
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(f"error: the run folder {run} is in use by process {other.pid} (")
        assert "MLflow run 0123abcd" in line and "another hydra.run.dir" in line
        assert {p.name: p.read_bytes() for p in run.iterdir()} == before
        assert not (tmp_path / "mlflow.db").exists()
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait(10)
    assert folder_lock.hold_run_folder(run) is None  # the holder is gone: taken over, silently


def test_a_job_steps_tasks_share_their_named_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tasks of one scheduler job step (srun ... python -m runner hydra.run.dir=X) share X by design (node k > 0
    keeps its files in node<k>/): a task is not refused while another task holds it."""
    from runner.cli import _hold_named_run_folder

    run = tmp_path / "run"
    run.mkdir()
    holder = ("import sys, time; from pathlib import Path; from runner.runtime.folder_lock import hold_run_folder; "
              "hold_run_folder(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)")
    other = subprocess.Popen([sys.executable, "-c", holder, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit):  # not a task: refused, exit 2
            _hold_named_run_folder([f"hydra.run.dir={run}"])
        for key, value in {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_NODEID": "1", "SLURM_NNODES": "2"}.items():
            monkeypatch.setenv(key, value)
        _hold_named_run_folder([f"hydra.run.dir={run}"])  # node 1's task of the same step: goes on
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait(10)
