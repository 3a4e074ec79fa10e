"""Checkpoints: resume equals an uninterrupted run, resharding on load, atomic saves, faults."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from conftest import FAST, ROOT, metric_history, processes_tagged, run_cli, runs, stderr_lines

from runner.config.errors import CheckpointError
from runner.train.checkpoint import complete_checkpoints, resolve

pytestmark = pytest.mark.slow

SMALL = [*FAST, "train.log_every=5"]


def flat_state(ckpt: Path, tmp: Path) -> dict:
    """Every tensor of a DCP checkpoint, whole, by dotted key (no process group needed)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp / f"{ckpt.parent.parent.name}-{ckpt.name}.pt"
    dcp_to_torch_save(str(ckpt), str(out))
    state = torch.load(out, weights_only=False)

    def walk(x, prefix=""):
        if isinstance(x, dict):
            for k, v in x.items():
                yield from walk(v, f"{prefix}{k}.")
        else:
            yield prefix[:-1], x
    return dict(walk(state))


@pytest.fixture(scope="module")
def rowwise_run(store: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 row-wise steps on 2 workers, checkpoints at 10 and 20."""
    run_folder = tmp_path_factory.mktemp("rowwise_run")
    proc = run_cli([*SMALL, "train.steps=20", "sharding=rowwise", "train.checkpoint.every_steps=10",
                    f"tracking.uri={store}", "tracking.experiment=ckpt_source", f"hydra.run.dir={run_folder}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_folder


def test_checkpoints_written_with_meta_plan_and_best(rowwise_run: Path) -> None:
    found = complete_checkpoints(rowwise_run / "checkpoints")
    assert [p.name for p in found] == ["step-00000010", "step-00000020"]
    meta = json.loads((found[0] / "meta.json").read_text())
    assert meta["step"] == 10 and meta["world_size"] == 2 and meta["sharding_types"] == ["row_wise"]
    assert 0 < meta["metrics"]["eval/auc"] < 1
    assert json.loads((found[0] / "plan.json").read_text()) == json.loads(
        (rowwise_run / "plan" / "plan.json").read_text())
    best = json.loads((rowwise_run / "checkpoints" / "best.json").read_text())
    assert best["path"] in {str(p) for p in found} and best["metric"] == "eval/auc"


def test_resume_continues_with_the_same_losses(store: str, rowwise_run: Path, tmp_path: Path) -> None:
    proc = run_cli([*SMALL, "train.steps=20", "sharding=rowwise",
                    f"train.resume={rowwise_run / 'checkpoints' / 'step-00000010'}",
                    f"tracking.uri={store}", "tracking.experiment=ckpt_resume", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    full = json.loads((rowwise_run / "results.json").read_text())
    resumed = json.loads((tmp_path / "results.json").read_text())
    assert resumed["start_step"] == 10 and resumed["loss_steps"] == [15, 20]
    assert resumed["losses"] == pytest.approx(full["losses"][2:], rel=1e-5, abs=1e-6)
    (run,) = runs(store, "ckpt_resume")
    assert run.data.tags["runner.resumed_from"].endswith("step-00000010")


@pytest.mark.parametrize("target", [
    ["cluster.workers_per_node=1", "sharding=tablewise"],
    ["cluster=2node", "sharding=tablewise"],
], ids=["1-worker-tablewise", "4-worker-2node-tablewise"])
def test_checkpoint_reshards_into_another_world_and_sharding(store: str, rowwise_run: Path, tmp_path: Path,
                                                             target: list) -> None:
    source = rowwise_run / "checkpoints" / "step-00000010"
    # steps == the saved step: load, train nothing, save again in the new layout
    proc = run_cli([*SMALL, "train.steps=10", *target, f"train.resume={source}", f"tracking.uri={store}",
                    "tracking.experiment=ckpt_reshard", f"hydra.run.dir={tmp_path / 'job'}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    (saved,) = complete_checkpoints(tmp_path / "job" / "checkpoints")
    assert json.loads((saved / "meta.json").read_text())["sharding_types"] == ["table_wise"]
    before, after = flat_state(source, tmp_path), flat_state(saved, tmp_path)
    tables = [k for k in before if k.startswith("model.") and "embedding_bags" in k]
    assert len(tables) == 6
    for key in tables:
        assert torch.equal(before[key], after[key]), key
    momentum = [k for k in before if k.startswith("optim.") and "momentum" in k]
    assert momentum and all(torch.equal(before[k], after[k]) for k in momentum)


def test_optimizer_state_that_cannot_reshard_fails_unless_asked(store: str, rowwise_run: Path,
                                                                tmp_path: Path) -> None:
    source = rowwise_run / "checkpoints" / "step-00000010"
    args = [*SMALL, "train.steps=12", "sharding=dataparallel", f"train.resume={source}", f"tracking.uri={store}",
            "tracking.experiment=ckpt_dp"]
    refused = run_cli([*args, f"hydra.run.dir={tmp_path / 'a'}"])
    assert refused.returncode != 0
    err = [ln for ln in stderr_lines(refused.stderr) if ln.startswith("error:")]
    assert len(err) == 1 and "train.resume_optimizer=false" in err[0], refused.stderr[-2000:]
    allowed = run_cli([*args, "train.resume_optimizer=false", f"hydra.run.dir={tmp_path / 'b'}"])
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert "optimizer state starts fresh" in allowed.stdout
    (saved,) = complete_checkpoints(tmp_path / "b" / "checkpoints")
    assert json.loads((saved / "meta.json").read_text())["step"] == 12


def test_missing_or_corrupt_checkpoint_fails_in_one_line(store: str, tmp_path: Path) -> None:
    broken = tmp_path / "broken" / "step-00000005"
    broken.mkdir(parents=True)
    (broken / "meta.json").write_text('{"step": 5}')
    for path, words in ((tmp_path / "nowhere", "no such file"), (broken, "incomplete checkpoint")):
        proc = run_cli([*SMALL, f"train.resume={path}", f"tracking.uri={store}", "tracking.experiment=ckpt_bad",
                        f"hydra.run.dir={tmp_path / uuid.uuid4().hex}"])
        assert proc.returncode != 0
        err = [ln for ln in stderr_lines(proc.stderr) if ln.startswith("error:")]
        assert len(err) == 1 and str(path) in err[0] and words in err[0], proc.stderr[-2000:]
    assert all(r.info.status == "FAILED" for r in runs(store, "ckpt_bad"))


def test_interrupted_save_is_never_picked_up(rowwise_run: Path, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "checkpoints"
    shutil.copytree(rowwise_run / "checkpoints", root)
    partial = root / ".tmp-step-00000030"
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"half a file")
    (root / "step-00000040").mkdir()  # a folder without meta.json is not a checkpoint either
    assert resolve("latest", root).name == "step-00000020"
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        resolve(str(partial), root)


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _start(args: list, tag: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", RUNNER_TEST_TAG=tag)
    return subprocess.Popen([sys.executable, "-m", "runner", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _kill_rank1_when(args: list, tag: str, run_folder: Path, ready, what: str, finish_s: float) -> tuple:
    """Start a job, SIGKILL rank 1 once ``ready()``, and wait for the job: (return code, stderr)."""
    proc = _start(args, tag)
    try:
        _wait_for(lambda: ready() or proc.poll() is not None, 240, what)
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        os.kill(int((run_folder / "pids" / "rank1.pid").read_text()), signal.SIGKILL)
        _out, err = proc.communicate(timeout=finish_s)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err


def test_killed_worker_is_restarted_and_resumes(store: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    code, err = _kill_rank1_when(
        [*SMALL, "train.steps=60", "train.checkpoint.every_steps=10", "cluster.max_restarts=1", f"tracking.uri={store}",
         "tracking.experiment=ckpt_fault", f"hydra.run.dir={tmp_path}"], tag, tmp_path,
        lambda: (tmp_path / "checkpoints" / "step-00000010").exists(), "the first checkpoint", 300)
    assert code == 0, err[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["restarts"] == 1 and results["start_step"] >= 10 and results["loss_steps"][-1] == 60
    (run,) = runs(store, "ckpt_fault")
    assert run.info.status == "FINISHED" and run.data.tags["runner.restarts"] == "1"
    assert max(metric_history(store, run.info.run_id, "restarts")) == 1.0
    assert processes_tagged(tag) == []


def test_worker_killed_during_a_save_fails_the_run_and_leaves_only_complete_checkpoints(
        store: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    # a large table makes each save take a while; checkpoint every step to get many chances
    root = tmp_path / "checkpoints"
    code, err = _kill_rank1_when(
        [*SMALL, "train.steps=200", "train.checkpoint.every_steps=1", "train.checkpoint.keep_last=50",
         "model.tables=[{name:big,num_embeddings:1500000},{name:small,num_embeddings:1000}]",
         f"tracking.uri={store}", "tracking.experiment=ckpt_kill", f"hydra.run.dir={tmp_path}"], tag, tmp_path,
        lambda: bool(list(root.glob(".tmp-step-*/*.distcp")) and complete_checkpoints(root)), "a save in progress", 120)
    assert code != 0
    line = [ln for ln in stderr_lines(err) if ln.startswith("error:")]
    assert len(line) == 1 and "rank 1" in line[0] and "SIGKILL" in line[0], err[-2000:]
    latest = resolve("latest", root)
    assert (latest / ".metadata").is_file() and json.loads((latest / "meta.json").read_text())["step"] >= 1
    (run,) = runs(store, "ckpt_kill")
    assert run.info.status == "FAILED" and "SIGKILL" in run.data.tags["error"]
    assert processes_tagged(tag) == []
