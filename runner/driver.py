"""The driver: one job = one MLflow run, one run folder, one launch of this host's agents."""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path
from typing import Any, Dict

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from runner import STARTED, checkpoint, tracking
from runner.affinity import agent_threads
from runner.launch import discard_warm, free_port, launch, took_warm
from runner.reporting import DRIVER, EVENTS, RESULTS, RUN_INFO, summary_line
from runner.schema import SPARSE_OPTIMIZERS_CPU
from runner.validation import ConfigError


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


def pre_launch_checks(cfg: Any, run_dir: Path) -> None:
    """What can be refused before any worker starts (torch is imported only when it must be asked)."""
    checkpoint.resolve(cfg.train.resume, checkpoint.checkpoint_root(cfg, run_dir))
    if cfg.data.name != "synthetic":
        from runner.datasets import check_data

        check_data(cfg)
    needs_cuda_answer = (cfg.cluster.device == "cuda" or cfg.precision.tf32
                         or cfg.optimizer.sparse not in SPARSE_OPTIMIZERS_CPU)
    if not needs_cuda_answer:
        return
    from runner.optimizers import check_device_support

    check_device(cfg.cluster.device)
    cuda = cfg.cluster.device != "cpu" and cuda_present()
    if cfg.precision.tf32 and not cuda:
        raise ConfigError("precision.tf32", True, "false on CPU workers (TF32 is a CUDA matmul mode)")
    check_device_support(cfg.optimizer, "cuda" if cuda else "cpu")


_JOBS = itertools.count()


def _mark_start() -> None:
    """Workers measure start-up from ``RUNNER_START_UNIX``: the command's start for its first job,
    this job's start for later jobs of a sweep."""
    os.environ["RUNNER_START_UNIX"] = str(STARTED if next(_JOBS) == 0 else time.time())


def write_data(cfg: Any) -> Dict[str, Any]:
    """``mode=write_data``: the synthetic source for this model, as Parquet under ``data.path``."""
    from runner.datasets import write_parquet

    if not cfg.data.path:
        raise ConfigError("data.path", None, "a folder to write to (mode=write_data)")
    out = Path(cfg.data.path).expanduser().resolve()
    t0 = time.perf_counter()
    files = write_parquet(cfg, out, cfg.data.write_rows, cfg.data.write_files, cfg.data.write_eval_rows)
    size = sum(f.stat().st_size for f in files)
    print(f"[runner] wrote {cfg.data.write_rows} training rows to {out / 'train'} ({cfg.data.write_files} files) and "
          f"{cfg.data.write_eval_rows} held-out rows to {out / 'eval'}: {size / 2**20:.1f} MiB in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    print(f"[runner] train on it: python -m runner data=parquet data.path={out / 'train'} "
          f"data.eval_path={out / 'eval'}" + (f" model={cfg.model.name}" if cfg.model.name != "dlrm" else ""),
          flush=True)
    return {"files": [str(f) for f in files]}


def run_job(cfg: DictConfig) -> Dict[str, Any]:
    """Write the resolved config, launch, open the MLflow run while the workers start, close it."""
    if cfg.mode != "train":
        discard_warm()  # no workers: free the core the prewarmed agent would hold
    if cfg.mode == "write_data":
        return write_data(cfg)
    _mark_start()
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    container = tracking.resolved_container(cfg)
    (run_dir / "resolved.yaml").write_text(OmegaConf.to_yaml(container))
    multirun = hc.mode == RunMode.MULTIRUN
    uri = tracking.tracking_uri(cfg)
    port = cfg.cluster.master_port or free_port()
    (run_dir / DRIVER).write_text(json.dumps({"port": port}))
    opened: Dict[str, Any] = {}

    # On a real multi-host job (cluster.node_rank set) every host runs a driver, and c10d rendezvous puts
    # rank 0 on any of them: only the driver that finds rank 0 on its host opens and writes the run.
    multi_host = cfg.cluster.node_rank is not None

    def rank0_here() -> bool:
        return (run_dir / "pids" / "rank0.pid").exists()

    def pump() -> None:
        """Write rank 0's new MLflow events (metrics, tags, plan artifacts) to the run."""
        if multi_host and "run_id" not in opened and rank0_here():
            open_run()
        if "pump" in opened:
            opened["pump"]()

    def open_run() -> None:
        """Create the run, log the config, publish ``run.json`` for rank 0 (atomically)."""
        choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra")}
        run_id = tracking.start_run(
            uri, cfg.tracking.experiment, run_name(cfg, choices, hc.job.num if multirun else None),
            tracking.parent_run_id(hc.sweep.dir) if multirun else None,
            {"runner.kind": "job", "runner.overrides": " ".join(hc.overrides.task) or "(none)",
             "runner.agent_prewarmed": str(took_warm()).lower(),
             "runner.run_dir": str(run_dir), **{f"runner.choice.{k}": v for k, v in choices.items()}},
        )
        opened["run_id"] = run_id
        opened["pump"] = tracking.EventPump(run_dir / EVENTS, uri, run_id)
        tracking.log_params(uri, run_id, tracking.flatten(container))
        tracking.log_artifacts(uri, run_id, [run_dir / "resolved.yaml", run_dir / ".hydra"])
        tmp = run_dir / (RUN_INFO + ".tmp")
        tmp.write_text(json.dumps({"tracking_uri": uri, "run_id": run_id, "port": port}))
        tmp.rename(run_dir / RUN_INFO)
        print(f"[runner] MLflow run {run_id} | run folder {run_dir}", flush=True)

    try:
        if cfg.mode == "plan":
            from runner.plan_mode import plan_only

            open_run()
            results = plan_only(cfg, run_dir)
        else:
            pre_launch_checks(cfg, run_dir)
            try:
                launch(cfg.cluster, run_dir, port, while_starting=None if multi_host else open_run, pump=pump,
                       threads=agent_threads(cfg))
            finally:
                pump()  # what rank 0 reported before the end (or before a failure)
            if multi_host and "run_id" not in opened:
                print(f"[runner] node {cfg.cluster.node_rank} finished; rank 0 ran on another host, whose driver "
                      "logged the MLflow run", flush=True)
                return {}
            results = json.loads((run_dir / RESULTS).read_text())
        pump()
        results.update(run_id=opened["run_id"], tracking_uri=uri)
    except KeyboardInterrupt:
        if "run_id" in opened:
            tracking.end_run(uri, opened["run_id"], "KILLED", "stopped by a signal (Ctrl-C or SIGTERM)")
        raise
    except BaseException as exc:
        if "run_id" not in opened and (not multi_host or rank0_here() or cfg.cluster.node_rank == 0):
            open_run()  # a refused job is still on record, as FAILED (on a multi-host job: by node 0)
        tracking.end_run(uri, opened["run_id"], "FAILED", str(exc))
        raise
    tracking.end_run(uri, opened["run_id"], "FINISHED")
    print(summary_line(results), flush=True)
    return results
