"""Every training pipeline that runs on CPU (:mod:`runner.config.pipelines`), TorchRec's own classes, trains the
default model for a few steps on 2 gloo ranks in this test's process tree (``launch_in_process``), with a checkpoint
(evaluated and saved, the pipeline paused around it) mid-way, to ``sparse_dist``'s losses, one of them resumed from
``sparse_dist``'s mid-way checkpoint; and the refusals before launch, each one line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import cfg_for, launch_in_process

import runner.cli  # noqa: F401  (schema and resolvers)
from runner.config.errors import ConfigError
from runner.config.pipelines import PIPELINES
from runner.runtime.device import check_pipeline

STEPS = 6


def _train(tmp_path: Path, pipeline: str, *extra: str) -> dict:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = cfg_for(f"train.pipeline={pipeline}", f"train.steps={STEPS}", "train.log_every=1", "train.batch_size=64",
                  "train.checkpoint.every_steps=3", "data.eval_batches=1", "train.threads_per_worker=1",
                  f"tracking.uri={uri}", "tracking.experiment=pipelines",
                  "tracking.system_metrics=false", "cluster.cpu_affinity=none", *extra)
    t0 = time.perf_counter()
    launched, _, mlflow_run = launch_in_process(cfg, tmp_path / pipeline, uri, pipeline)
    assert mlflow_run.end("FINISHED")
    print(f"{pipeline}: {time.perf_counter() - t0:.1f} s, losses {launched[0]['losses']}")
    return launched[0]


def test_each_cpu_pipeline_trains_to_sparse_dists_losses(tmp_path: Path) -> None:
    cpu = [name for name, p in PIPELINES.items() if p.gpu_only is None]
    assert cpu[:2] == ["sparse_dist", "base"] and len(cpu) >= 3
    first = _train(tmp_path, "sparse_dist")
    reference = first["losses"]
    assert len(reference) == STEPS
    # base resumes from sparse_dist's mid-way checkpoint (its steps 4..6); the others train from the start
    resumed = f"train.resume={tmp_path / 'sparse_dist' / 'checkpoints' / 'step-00000003'}"
    for name in cpu[1:]:
        rank0 = _train(tmp_path, name, *([resumed] if name == "base" else []))
        expected = reference[3:] if name == "base" else reference
        assert rank0["losses"] == pytest.approx(expected, abs=1e-6), name
        # the same trained model: the same evaluation (after the pipeline's pause for the step-3 checkpoint, too)
        assert rank0["eval_auc"] == pytest.approx(first["eval_auc"], abs=1e-6), name


def test_refusals_name_key_value_and_what_is_allowed() -> None:
    with pytest.raises(ConfigError, match=r"train\.pipeline.*semi_sync.*sparse_dist or base with train\.grad_acc"):
        cfg_for("train.pipeline=semi_sync", "train.grad_accumulation_steps=2")
    with pytest.raises(ConfigError, match=r"train\.pipeline.*fused_sparse_dist.*fp16 loss scaling"):
        cfg_for("train.pipeline=fused_sparse_dist", "precision=fp16")
    cfg_for("train.pipeline=base", "train.grad_accumulation_steps=2")  # the split step stands in for it
    for name in ("prefetch_sparse_dist", "fused_sparse_dist", "semi_sync"):
        with pytest.raises(ConfigError, match=rf"train\.pipeline.*{name}.*runs on CPU workers \(sparse_dist, base"):
            check_pipeline(name, "cpu")
        check_pipeline(name, "cuda")
