"""``mode=calibrate``'s last measurement: the configured job itself with every table tiny, trained by the runner's
own loop, so that what its step takes beyond every part measured alone (the loop, the pipeline, the model's
wrappers) can be read off (:func:`runner.plan.cost_fit.step_overhead`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, cast

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig


def step_samples(cfg: RunnerConfig, batch: int, rank: int, world: int, local: int, device: torch.device, steps: int
                 ) -> List[float]:
    """The configured job at a per-rank batch of ``batch`` with every table cut to 64 rows per rank, all
    table-wise, planned with TorchRec's constants (a job whose embeddings cost next to nothing, so that its step is
    the rest of the step), trained ``steps`` steps by the runner's own loop: its step time, ms (one value: the
    loop's timed window)."""
    from omegaconf import OmegaConf
    from torchrec.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel

    from runner.data.layout import job_data
    from runner.data.pipeline import batches_for
    from runner.plan.plan_spec import plan_spec
    from runner.plan.planner import make_plan
    from runner.track.reporter import SilentBar
    from runner.train.loop import LoopHooks, train
    from runner.train.models import autocast_forward, build_model
    from runner.train.optimizers import apply_sparse_optimizer, combined_optimizer

    rows = 64 * world
    tables = [{"name": t.name, "num_embeddings": min(int(t.num_embeddings), rows), "embedding_dim": t.embedding_dim}
              for t in cfg.model.tables]
    small = {"model": {"tables": tables, "generated_tables": {"min_rows": rows, "max_rows": rows}},
             "sharding": {"types": ["table_wise"], "constraints": {}, "plan": None}, "train": {
                 "batch_size": batch, "checkpoint": {"enabled": False}}, "cluster": {"calibration": "none"}}
    tiny = cast("RunnerConfig", OmegaConf.merge(cfg, small))
    OmegaConf.set_readonly(cast(Any, tiny), False)
    tiny.sharding.constraints = {}  # replaced, not merged: a table's own constraint would refuse table_wise
    model = build_model(tiny, device)
    autocast_forward(model, device.type, tiny.precision.autocast)
    apply_sparse_optimizer(model, tiny.optimizer)
    plan, _, _, sharders = make_plan(plan_spec(tiny), model, world, local, device.type, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(module=model, device=device, plan=plan, sharders=sharders,
                                   data_parallel_wrapper=DefaultDataParallelWrapper(static_graph=True))
    batches = batches_for(job_data(tiny), rank, world, False, 0, steps,
                          low_loops=tiny.cluster.gloo_loop_priority == "low")
    try:
        result = train(dmp, combined_optimizer(dmp, tiny.optimizer), batches, 0, steps, device, tiny.train,
                       tiny.optimizer, list(tiny.model.tasks), LoopHooks(lambda step, metrics: None, SilentBar()), None)
    finally:
        getattr(batches, "close", lambda: None)()
    return [result.step_time_ms]
