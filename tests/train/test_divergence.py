"""A loss that diverges stops the job (issue 47, item 1): two gloo ranks in this test's process tree, trained with a
learning rate no model survives, end at the first window that holds a NaN step, every rank with the same one line
naming the step and what to try; with ``train.stop_on_nonfinite=false`` the same job trains to its end."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import pytest
from conftest import cfg_for, elastic_in_process
from omegaconf import OmegaConf
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

import runner.cli  # noqa: F401  (schema and resolvers)
from runner.launch.processes.supervisor import root_cause
from runner.runtime import run_files

DIVERGING = ("train.steps=30", "train.log_every=5", "train.batch_size=64", "optimizer.dense_lr=1e12",
             "optimizer.sparse_lr=1e12", "data.eval_batches=1", "train.threads_per_worker=1",
             "tracking.system_metrics=false", "cluster.cpu_affinity=none")


def _launch(run_folder: Path, *overrides: str) -> Dict[int, Any]:
    cfg = cfg_for(*DIVERGING, f"tracking.uri=sqlite:///{run_folder.parent / 'mlflow.db'}", *overrides)
    run_folder.mkdir()
    OmegaConf.save(cfg, run_folder / run_files.RESOLVED, resolve=True)
    return elastic_in_process(run_folder, "diverging")


def test_a_diverging_loss_stops_the_job_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ChildFailedError):
        _launch(tmp_path / "stopped")
    line = str(root_cause(tmp_path / "stopped"))
    assert "training error: the training loss became NaN at step " in line, line
    step = int(line.split("at step ")[1].split()[0])
    assert 1 <= step <= 5, line  # the first window holds it: the job ends there, not at step 30
    assert "optimizer.dense_lr" in line and "train.stop_on_nonfinite=false" in line and "\n" not in line
    assert "unexpected" not in line and "Traceback" not in line


def test_the_check_can_be_turned_off(tmp_path: Path) -> None:
    results = _launch(tmp_path / "on", "train.stop_on_nonfinite=false", "train.steps=15")
    losses = results[0]["losses"]
    assert len(losses) == 3 and losses[-1] != losses[-1]  # trained to the end: a NaN final loss, as asked
