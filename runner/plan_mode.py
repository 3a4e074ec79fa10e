"""``mode=plan``: plan and report in the driver's process, with no workers and no process group.

Plans for clusters that are not here (e.g. 16 GPUs from a CPU-only laptop): the model is built on the
meta device and TorchRec's planner sees the topology the cluster config describes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict

import torch

from runner.reporting import RESULTS, Reporter


def planned_device_type(cluster_device: str) -> str:
    if cluster_device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cluster_device


def plan_only(cfg: Any, run_dir: Path) -> Dict[str, Any]:
    """Plan ``cfg``'s model for ``cfg.cluster``; write and log the report; return the results."""
    from runner.model import build_model
    from runner.optimizers import apply_sparse_optimizer
    from runner.planning import make_plan

    logging.getLogger("torchrec").setLevel(logging.WARNING)  # the planner's INFO lines, per proposal
    world = cfg.cluster.nodes * cfg.cluster.workers_per_node
    local = cfg.cluster.workers_per_node
    device_type = planned_device_type(cfg.cluster.device)
    model = build_model(cfg, torch.device("meta"))
    apply_sparse_optimizer(model, cfg.optimizer)
    plan, best_plan, seconds, _ = make_plan(cfg, model, world, local, device_type)
    reporter = Reporter(cfg, run_dir, rank=0)
    reporter.plan(plan, best_plan, seconds, world, local, device_type)
    reporter.plan_chart()
    reporter.flush()
    m = reporter.plan_metrics
    results = {
        "mode": "plan", "run_id": reporter.run_id, "tracking_uri": reporter.uri, "world_size": world,
        "plan_seconds": seconds, "est_step_ms": m.get("plan/est_step_ms"),
        "max_mem_bytes": m.get("plan/max_mem_bytes"),
        "sharding_types": {k[len("plan/tables_"):]: int(v) for k, v in m.items() if k.startswith("plan/tables_")},
    }
    (run_dir / RESULTS).write_text(json.dumps(results, indent=2))
    return results
