"""One rank's part of a job, once its process group exists: model -> plan -> DMP -> optimizers ->
(resume) -> train -> measure -> evaluate -> checkpoint -> results.

TorchRec's own wiring, as in its examples: the model is built with its tables on the meta device, the
planner (:mod:`runner.plan`) shards them, ``DistributedModelParallel`` materialises this rank's shards,
the tables' optimizer is fused into backward and the dense optimizer is combined with it.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import torch
import torch.distributed as dist
from torchrec.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel

from runner.config.schema import samples_per_step
from runner.data.layout import job_data
from runner.data.pipeline import batches_for
from runner.data.values import hashed_ids
from runner.plan import make_plan, plan_spec, write_plan_report
from runner.runtime import run_files
from runner.track.trial import TrialPruning
from runner.train import checkpoint
from runner.train.calibrate import job_dense_ms, speed_probe
from runner.train.evaluate import (
    dense_state_bytes,
    embedding_forward_ms,
    evaluate,
    gather_measurements,
    held_bytes,
    memory_now_bytes,
)
from runner.train.loop import LoopHooks, train
from runner.train.models import autocast_forward, build_model
from runner.train.optimizers import apply_sparse_optimizer, combined_optimizer
from runner.train.split_step import loss_scale_for

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig
    from runner.plan import PlanFacts
    from runner.track.reporter import Reporter
    from runner.train.rank_env import RankEnv


class Trainer:
    """This rank's model, plan and optimizers, and the steps that train, evaluate and save them."""

    def __init__(self, cfg: RunnerConfig, run_folder: Path, env: RankEnv, device: torch.device, reporter: Reporter,
                 marks: Dict[str, float], hbm_cap: Optional[int] = None, ddr_cap_gib: Optional[float] = None) -> None:
        self.cfg, self.run_folder, self.env, self.device, self.hbm_cap = cfg, run_folder, env, device, hbm_cap
        self.ddr_cap_gib = ddr_cap_gib if ddr_cap_gib is not None else cfg.cluster.ddr_cap_gib  # the job's place's
        self.reporter, self.marks = reporter, marks
        self.inputs = job_data(cfg)
        self.dmp, self.optimizer, self.sharding_types = self._build()
        self.checkpointer = checkpoint.Checkpointer(cfg.train.checkpoint, run_folder, env.rank)
        self.loss_scale = loss_scale_for(cfg.precision)
        self.pruning, self.stop = TrialPruning(cfg.tracking.objective, cfg.mode, env.rank, self.device), False

    def _dense_ms(self) -> Optional[Dict[str, float]]:
        """This job's dense part timed here before planning (:func:`job_dense_ms`), where it plans with a calibration
        whose dense part is trusted and ``calibrate.dense_per_job`` is on; else None (the calibration's fit)."""
        from runner.data.pipeline import source
        from runner.plan import for_config

        cfg = self.cfg
        cal = for_config(cfg.cluster, cfg.mode, self.device.type).calibration if cfg.calibrate.dense_per_job else None
        # every rank times, all at once (as the calibration's ranks measured), or none does: where ranks share cores,
        # one rank timing alone runs faster than the step's ranks do together
        left_out = torch.tensor([float(cal is None or "dense" in cal.untrusted())], device=self.device)
        dist.all_reduce(left_out, op=dist.ReduceOp.MAX)
        if left_out.item() > 0:
            return None
        data = next(iter(source(self.inputs, self.env.rank, self.env.world, False, 0, 1)))
        # each micro-batch runs forward and backward at train.batch_size; the optimizer steps once
        timed = job_dense_ms(build_model(cfg, self.device), cfg.precision.autocast, cfg.optimizer, data,
                             int(cfg.train.batch_size), self.device)
        micro = int(cfg.train.grad_accumulation_steps)
        # the machine's speed now, beside the calibration's (:func:`runner.plan.cost.speed.speed_now`)
        dist.barrier()
        probe = {f"probe_{k}_ms": float(statistics.median(v)) for k, v in speed_probe(self.device, 5).items()}
        return {**timed, "fwd_ms": timed["fwd_ms"] * micro, "bwd_ms": timed["bwd_ms"] * micro, **probe}

    def _build(self) -> tuple:
        """Model on meta, the plan (rank 0 plans, every rank receives it), the sharded model, optimizers."""
        cfg, env = self.cfg, self.env
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg, self.device)
        autocast_forward(model, self.device.type, cfg.precision.autocast)
        apply_sparse_optimizer(model, cfg.optimizer)
        notes: List[str] = []
        facts: PlanFacts = {}
        spec = plan_spec(cfg)
        planned = spec.with_ddr_cap(self.ddr_cap_gib)  # the topology takes the host memory each worker has here
        dense_ms = self._dense_ms()  # for the whole step's estimate only
        plan, best_plan, seconds, sharders = make_plan(planned, model, env.world, env.local_world, self.device.type,
                                                       dist.GroupMember.WORLD, hbm_cap=self.hbm_cap, notes=notes,
                                                       facts=facts, dense_measured=dense_ms)
        self.marks["planned"] = time.time()
        # the baseline of what the model holds: imports, process group and plan up (rank 0 keeps its planner's
        # caches), the model on meta only, before DMP makes its shards
        self.baseline_mem = memory_now_bytes(self.device)
        # DDP's static-graph mode cannot take no_sync() micro-batches (gradient accumulation)
        wrapper = DefaultDataParallelWrapper(static_graph=cfg.train.grad_accumulation_steps == 1)
        dmp = DistributedModelParallel(module=model, device=self.device, plan=plan, sharders=sharders,
                                       data_parallel_wrapper=wrapper)
        types: List[str] = []
        if self.reporter.active:
            report = write_plan_report(spec, plan, best_plan, env.world, env.local_world, self.device.type,
                                       self.run_folder / run_files.PLAN, seconds, " ".join(notes), facts)
            self.reporter.plan(report)
            self.reporter.hbm_cap(self.hbm_cap, self.ddr_cap_gib)
            types = sorted(report.tags["runner.sharding_types"].split(","))
        return dmp, combined_optimizer(dmp, cfg.optimizer), types

    def _resume(self) -> int:
        """Load ``train.resume`` (after an elastic restart: this run's newest checkpoint); the start step."""
        cfg = self.cfg
        if cfg.train.resume is None and self.env.restarts > 0:
            found = checkpoint.complete_checkpoints(self.checkpointer.root)
            source: Optional[Path] = found[-1] if found else None
        else:
            source = checkpoint.resolve(cfg.train.resume, self.checkpointer.root)
        meta = checkpoint.load(source, self.dmp, self.optimizer, cfg.train.resume_optimizer,
                               self.env.rank) if source else {}
        if self.loss_scale is not None and meta.get("loss_scale"):
            self.loss_scale.load_state_dict(meta["loss_scale"])
        self.reporter.started(meta.get("step", 0), self.env.restarts, source)
        return meta.get("step", 0)

    def data(self, num_batches: int, eval_split: bool, first: int = 0) -> Any:
        # pinned on CUDA: the pipeline's non-blocking copies to the GPU then overlap the step
        return batches_for(self.inputs, self.env.rank, self.env.world, eval_split, first, num_batches,
                           pin=self.device.type == "cuda", low_loops=self.cfg.cluster.gloo_loop_priority == "low")

    def evaluate(self) -> Dict[str, float]:
        return evaluate(self.dmp, self.data(self.cfg.data.eval_batches, True), self.device, list(self.cfg.model.tasks),
                        samples_per_step(self.cfg.train))

    def save(self, step: int, metrics: Dict[str, float]) -> None:
        meta = {"world_size": self.env.world, "sharding_types": self.sharding_types, "metrics": metrics,
                "loss_scale": self.loss_scale.state_dict() if self.loss_scale is not None else None}
        path = self.checkpointer.save(step, self.dmp, self.optimizer, meta,
                                      self.run_folder / run_files.PLAN / "plan.json")
        self.reporter.checkpointed(step, path, metrics)

    def evaluate_and_save(self, step: int) -> None:
        """A checkpoint during training: evaluated first, so the best one can be kept."""
        metrics = self.evaluate()
        self.reporter.step_metrics(step, metrics)
        self.save(step, metrics)
        self.stop = self.pruning.should_stop(step, metrics)

    def run(self, cores: Optional[List[int]]) -> Dict[str, Any]:
        cfg, reporter = self.cfg, self.reporter
        start = self._resume()
        self.marks["model_ready"] = time.time()
        train_data = self.data(cfg.train.steps, False, start)
        try:
            with reporter.progress(cfg.train.steps, start) as bar:
                hooks = LoopHooks(reporter.step_metrics, bar, self.checkpointer.due, self.evaluate_and_save,
                                  lambda: self.stop)
                result = train(self.dmp, self.optimizer, train_data, start, cfg.train.steps, self.device, cfg.train,
                               cfg.optimizer, list(cfg.model.tasks), hooks, self.loss_scale)
        finally:
            getattr(train_data, "close", lambda: None)()
        if result.first_step_unix is not None:
            reporter.startup(dict(self.marks, first_step=result.first_step_unix))
        if result.data_ended:
            reporter.data_ended(result.last_step)
        if result.stopped_at is not None:
            reporter.pruned(result.stopped_at, self.pruning.metric, self.pruning.pruned_value)
        reporter.ids_hashed(*hashed_ids())
        held = held_bytes(self.device)  # before the embedding forward's timing adds its own
        embedding_ms = embedding_forward_ms(self.dmp, self.data(1, True), self.device)
        reporter.measured(gather_measurements(result, self.device, cores, embedding_ms, self.baseline_mem,
                                              dense_state_bytes(self.dmp, self.optimizer), held))
        eval_metrics = self.evaluate()
        if cfg.train.checkpoint.enabled:  # also when nothing was trained: the loaded state, in this layout
            self.save(result.last_step, eval_metrics)
        return reporter.finish(result, eval_metrics, self.env.world)
