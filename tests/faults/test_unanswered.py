"""A rank that stops answering is named (issue 47, item 6): two gloo ranks in this test's process tree, rank 1
frozen with SIGSTOP while it trains; rank 0's collective times out after ``cluster.pg_timeout_s`` and the job's
root cause names rank 1 and its node, not the rank that waited, with no library source path."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import cfg_for, elastic_in_process
from omegaconf import OmegaConf
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

import runner.cli  # noqa: F401  (schema and resolvers)
from runner.launch.processes.supervisor import root_cause
from runner.runtime import run_files

pytestmark = [pytest.mark.slow, pytest.mark.faults]


def _freeze_rank1(run_folder: Path, stopped: list) -> None:
    """SIGSTOP rank 1 once both ranks train; SIGCONT it once rank 0 has recorded its timeout (so that the
    agent's SIGTERM then ends it at once)."""
    pid_file, deadline = run_folder / run_files.PIDS / "rank1.pid", time.monotonic() + 120
    ready = [pid_file, run_folder / run_files.PIDS / "rank1.beat", run_folder / run_files.EVENTS]  # training has begun
    while not all(p.exists() for p in ready) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # into the training steps
    pid = int(pid_file.read_text())
    os.kill(pid, signal.SIGSTOP)
    stopped.append(time.monotonic())
    while not (run_folder / run_files.ERRORS / "rank0.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(pid, signal.SIGCONT)


def test_a_rank_that_stops_answering_is_named(tmp_path: Path) -> None:
    run_folder = tmp_path / "run"
    run_folder.mkdir()
    cfg = cfg_for("train.steps=100000", "train.batch_size=64", "cluster.pg_timeout_s=6", "train.threads_per_worker=1",
                  f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", "tracking.system_metrics=false",
                  "cluster.cpu_affinity=none")
    OmegaConf.save(cfg, run_folder / run_files.RESOLVED, resolve=True)
    stopped: list = []
    freezer = threading.Thread(target=_freeze_rank1, args=(run_folder, stopped), daemon=True)
    freezer.start()
    with pytest.raises(ChildFailedError):
        elastic_in_process(run_folder, "frozen")
    assert stopped, "rank 1 was never stopped"
    line = str(root_cause(run_folder))
    assert line.startswith("rank 1 on node 0 did not answer within cluster.pg_timeout_s=6 s"), line
    assert "rank 0 waited for it" in line and "/" not in line and "unexpected" not in line, line
