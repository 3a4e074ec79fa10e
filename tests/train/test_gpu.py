"""On a CUDA host only (marked gpu; skipped elsewhere, saying so). One GPU: a worker trains with NCCL, bf16
where the GPU has it in hardware, the planner's HBM cap read from the device's free memory and logged, a
refusal for too many workers. Two GPUs or more: NCCL with 2 ranks and a DCP checkpoint resumed, fp16 with
loss scaling, a UVM-caching table. The suite's other tests run with the host's GPUs hidden (conftest).

Nothing here initialises CUDA in the test process: the GPUs are described by NVML (``host_gpus``), every
CUDA call happens in the runner's own workers."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FAST, HOST_CUDA, finished_run, metric_history, run_cli

from runner.config.precisions import in_hardware
from runner.runtime.device import GIB, host_gpus, job_gpus, visible_gpus

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.skipif(not HOST_CUDA, reason="needs a CUDA GPU "
                                                                    "(none on this host)")]


def _gpus() -> list:
    """The GPUs the tests may use (NVML's view of ``CUDA_VISIBLE_DEVICES``)."""
    visible = visible_gpus(count=len(host_gpus()))
    return job_gpus(host_gpus(), visible, len(visible))


def two_gpus() -> None:
    if len(_gpus()) < 2:
        pytest.skip("needs two GPUs (this host has one)")


def test_one_gpu_worker_trains_on_cuda(store: str, tmp_path: Path) -> None:
    bf16 = in_hardware("bfloat16", _gpus()[0][1])
    _, run = finished_run(store, "gpu1", tmp_path, [*FAST, "train.steps=60", "cluster.workers_per_node=1",
                                                    "precision=bf16" if bf16 else "precision=fp32"])
    assert run.data.tags["runner.device"] == "cuda"
    losses = metric_history(store, run.info.run_id, "train/loss")
    assert losses[-1] < losses[0], losses
    peak, cap = run.data.metrics["measured/peak_mem_bytes"], run.data.metrics["plan/hbm_cap_gib"]
    assert 0 < peak and 0 < cap * GIB <= 200 * GIB  # the device's free memory, not a default
    assert "cuda" in (tmp_path / "plan" / "report.md").read_text()


def test_an_hbm_cap_above_the_device_is_refused(tmp_path: Path) -> None:
    proc = run_cli([*FAST, "cluster.workers_per_node=1", "cluster.hbm_cap_gib=100000", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode != 0 and "cluster.hbm_cap_gib=100000" in proc.stderr, proc.stderr[-2000:]
    assert "least free memory" in proc.stderr


def test_more_workers_than_gpus_is_refused(tmp_path: Path) -> None:
    proc = run_cli([*FAST, f"cluster.workers_per_node={len(_gpus()) + 1}", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode != 0
    assert "cluster.workers_per_node" in proc.stderr and "need one GPU each" in proc.stderr, proc.stderr[-2000:]


def test_two_nccl_ranks_checkpoint_and_resume(store: str, tmp_path: Path) -> None:
    two_gpus()
    ckpt = tmp_path / "ckpt"
    args = [*FAST, "cluster.workers_per_node=2", "sharding=rowwise", f"train.checkpoint.dir={ckpt}",
            "train.checkpoint.every_steps=20"]
    _, run = finished_run(store, "gpu_nccl", tmp_path / "a", args)
    assert run.data.tags["runner.device"] == "cuda" and run.data.tags["runner.world_size"] == "2"
    _, resumed = finished_run(store, "gpu_nccl_resume", tmp_path / "b",
                              [*args, "train.steps=40", "train.resume=latest", "train.checkpoint.enabled=false"])
    assert resumed.data.tags["runner.resumed_from"].startswith(str(ckpt))


def test_fp16_with_loss_scaling_and_accumulation_trains(store: str, tmp_path: Path) -> None:
    two_gpus()
    _, run = finished_run(store, "gpu_fp16", tmp_path, [*FAST, "train.steps=60", "cluster.workers_per_node=2",
                                                        "precision=fp16", "train.grad_accumulation_steps=2"])
    losses = metric_history(store, run.info.run_id, "train/loss")
    assert losses[-1] < losses[0], losses


def test_a_uvm_caching_table_trains_and_its_plan_pins(store: str, tmp_path: Path) -> None:
    two_gpus()
    args = [*FAST, "cluster.workers_per_node=2", "sharding.compute_kernels=[fused_uvm_caching]"]
    _, run = finished_run(store, "gpu_uvm", tmp_path / "a", args)
    plan = (tmp_path / "a" / "plan" / "plan.json").read_text()
    assert "fused_uvm_caching" in plan
    _, pinned = finished_run(store, "gpu_uvm_pinned", tmp_path / "b",
                             [*args, f"sharding.plan={tmp_path / 'a' / 'plan' / 'plan.json'}"])
    assert (tmp_path / "b" / "plan" / "plan.json").read_text() == plan
