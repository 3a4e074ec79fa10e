"""The driver: one job = one MLflow run, one run folder, one launch of this host's agents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from runner import checkpoint, tracking
from runner.launch import free_port, launch
from runner.plan_mode import plan_only
from runner.reporting import RESULTS, RUN_INFO, summary_line
from runner.schema import ConfigError


def run_name(cfg: Any, choices: Dict[str, Any], job_num: Any) -> str:
    if cfg.tracking.run_name:
        return cfg.tracking.run_name
    name = f"{choices.get('model', cfg.model.name)}-{choices.get('sharding', cfg.sharding.name)}-" \
           f"{choices.get('cluster', cfg.cluster.name)}"
    return name if job_num is None else f"{name}-{job_num}"


def cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()


def check_device(device: str) -> None:
    """Training on CUDA needs CUDA here; planning for it does not (``mode=plan``)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("cluster.device", device,
                          "auto or cpu on a machine without CUDA (mode=plan plans for GPU clusters anywhere)")


def run_job(cfg: DictConfig) -> Dict[str, Any]:
    """Write the resolved config, open the MLflow run, launch, and close the run with its status."""
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    container = tracking.resolved_container(cfg)
    (run_dir / "resolved.yaml").write_text(OmegaConf.to_yaml(container))

    multirun = hc.mode == RunMode.MULTIRUN
    uri = tracking.tracking_uri(cfg)
    parent = tracking.parent_run_id(hc.sweep.dir) if multirun else None
    overrides = " ".join(hc.overrides.task)
    choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra")}
    port = cfg.cluster.master_port or free_port()
    run_id = tracking.start_run(
        uri, cfg.tracking.experiment, run_name(cfg, choices, hc.job.num if multirun else None), parent,
        {"runner.kind": "job", "runner.overrides": overrides or "(none)", "runner.run_dir": str(run_dir),
         **{f"runner.choice.{k}": v for k, v in choices.items()}},
    )
    (run_dir / RUN_INFO).write_text(json.dumps({"tracking_uri": uri, "run_id": run_id, "port": port}))
    print(f"[runner] MLflow run {run_id} | run folder {run_dir}", flush=True)
    try:
        tracking.log_params(uri, run_id, tracking.flatten(container))
        tracking.log_artifacts(uri, run_id, [run_dir / "resolved.yaml", run_dir / ".hydra"])
        if cfg.mode == "plan":
            results = plan_only(cfg, run_dir)
        else:
            from runner.optimizers import check_device_support

            check_device(cfg.cluster.device)
            if cfg.precision.tf32 and not cuda_present():
                raise ConfigError("precision.tf32", True, "false on CPU workers (TF32 is a CUDA matmul mode)")
            check_device_support(cfg.optimizer, "cuda" if cfg.cluster.device != "cpu" and cuda_present() else "cpu")
            checkpoint.resolve(cfg.train.resume, checkpoint.checkpoint_root(cfg, run_dir))  # fail before launch
            launch(cfg.cluster, run_dir, port)
            results = json.loads((run_dir / RESULTS).read_text())
    except KeyboardInterrupt:
        tracking.end_run(uri, run_id, "KILLED", "stopped by a signal (Ctrl-C or SIGTERM)")
        raise
    except BaseException as exc:
        tracking.end_run(uri, run_id, "FAILED", str(exc))
        raise
    tracking.end_run(uri, run_id, "FINISHED")
    print(summary_line(results), flush=True)
    return results
