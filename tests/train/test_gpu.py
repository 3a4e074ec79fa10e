"""On a CUDA host only (marked gpu; skipped elsewhere, saying so): one GPU worker trains with NCCL, bf16
where the GPU has it, the planner's HBM cap read from the device; and the GPU count is checked."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FAST, finished_run, metric_history, run_cli

from runner.config.device import cuda_present

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not cuda_present(), reason="needs a CUDA GPU (none on this host)")]


def test_one_gpu_worker_trains_on_cuda(store: str, tmp_path: Path) -> None:
    import torch

    precision = "precision=bf16" if torch.cuda.is_bf16_supported() else "precision=fp32"
    _, run = finished_run(store, "gpu1", tmp_path, [*FAST, "train.steps=60", "cluster.workers_per_node=1", precision])
    assert run.data.tags["runner.device"] == "cuda"
    losses = metric_history(store, run.info.run_id, "train/loss")
    assert losses[-1] < losses[0], losses
    assert run.data.metrics["measured/peak_mem_bytes"] > 0
    total = torch.cuda.get_device_properties(0).total_memory
    plan = (tmp_path / "plan" / "report.md").read_text()
    assert "cuda" in plan and total > 0


def test_more_workers_than_gpus_is_refused(tmp_path: Path) -> None:
    import torch

    proc = run_cli([*FAST, f"cluster.workers_per_node={torch.cuda.device_count() + 1}", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode != 0
    assert "cluster.workers_per_node" in proc.stderr and "need one GPU each" in proc.stderr, proc.stderr[-2000:]
