"""Optimizers, the training loop and evaluation for a DMP-wrapped DLRM."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional

import torch
import torch.distributed as dist
from torchrec.distributed.train_pipeline import TrainPipelineBase, TrainPipelineSparseDist

from runner.optimizers import Schedule, set_learning_rates
from runner.schema import samples_per_step
from runner.steps import LossScale, SplitStep


def autocast(device: torch.device, dtype_name: Optional[str]) -> contextlib.AbstractContextManager:
    if dtype_name is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, dtype_name))


def make_step(dmp: Any, optimizer: Any, device: torch.device, cfg: Any, loss_scale: Optional[LossScale]) -> Any:
    """TorchRec's sparse pipeline; the split step when accumulating micro-batches or scaling the loss."""
    if cfg.train.grad_accumulation_steps == 1 and loss_scale is None:
        if cfg.train.pipeline == "base":
            return _BasePipeline(dmp, optimizer, device)
        return TrainPipelineSparseDist(dmp, optimizer, device, execute_all_batches=True)
    return SplitStep(dmp, optimizer, device, cfg.train.grad_accumulation_steps, cfg.precision.autocast,
                     loss_scale)


class _BasePipeline(TrainPipelineBase):
    """TorchRec's unpipelined step (input dist, forward, backward, step in order), pausable like
    the sparse pipeline."""

    def detach(self) -> None:
        pass

    def attach(self, model: Any) -> None:
        pass


@dataclass
class TrainResult:
    losses: List[float] = field(default_factory=list)
    steps: List[int] = field(default_factory=list)
    first_step_unix: Optional[float] = None
    final_loss: float = float("nan")
    samples_per_s: float = 0.0
    step_time_ms: float = 0.0
    last_step: int = 0
    data_ended: bool = False


def _mean_across_ranks(values: List[float], device: torch.device) -> List[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return (t / dist.get_world_size()).tolist()


def _task_losses(logits: torch.Tensor, labels: torch.Tensor) -> List[float]:
    """Each task's BCE of one step (multi-task models: logits and labels are (batch, tasks))."""
    per = torch.nn.functional.binary_cross_entropy_with_logits(
        logits.float(), labels.float().reshape(logits.shape), reduction="none").mean(0)
    return per.tolist()


def train(dmp: Any, optimizer: Any, batches: Iterable, start: int, steps: int, device: torch.device, cfg: Any,
          on_log: Callable[[int, Dict[str, float]], None], progress: Any,
          due: Callable[[int], bool] = lambda step: False,
          on_checkpoint: Optional[Callable[[int], None]] = None,
          loss_scale: Optional[LossScale] = None) -> TrainResult:
    """Run steps ``start+1 .. steps`` (fewer when the data ends first: then every rank stops at the same
    step). Every ``train.log_every`` steps report metrics; at steps where ``due(step)``, hand the model to
    ``on_checkpoint`` (outside the pipeline). All ranks join both. ``loss_scale`` (fp16) is updated
    in place, so that checkpoints can save it."""
    result = TrainResult(last_step=start)
    if start >= steps:
        return result
    pipeline = make_step(dmp, optimizer, device, cfg, loss_scale)
    it = iter(batches)
    dmp.train()
    world, batch = dist.get_world_size(), samples_per_step(cfg)
    tasks = list(cfg.model.tasks)
    # the loop reads no OmegaConf node: each read costs microseconds, every step
    schedule, log_every, autocast_dtype = Schedule(cfg.optimizer, steps), cfg.train.log_every, cfg.precision.autocast
    window_loss, window_tasks, window_steps = 0.0, [0.0] * len(tasks), 0
    window_start, paused = time.perf_counter(), 0.0
    applied: tuple = (float("nan"), float("nan"))
    timed_s, timed_steps, first_window = 0.0, 0, True  # the first window holds the pipeline's tracing

    def log_window(step: int) -> None:
        nonlocal window_loss, window_tasks, window_steps, window_start, paused, timed_s, timed_steps, first_window
        now = time.perf_counter()
        elapsed = now - window_start - paused  # wall time of the window: logging included, pauses not
        if not first_window or step == steps and timed_steps == 0:
            timed_s, timed_steps = timed_s + elapsed, timed_steps + window_steps
        first_window = False
        means = _mean_across_ranks([window_loss / window_steps] + [t / window_steps for t in window_tasks], device)
        metrics = {
            "train/loss": means[0],
            "train/samples_per_s": world * batch * window_steps / max(elapsed, 1e-9),
            "train/lr_dense": applied[1],
            "train/lr_sparse": applied[0],
        }
        if len(tasks) > 1:
            metrics.update({f"train/{t}/loss": v for t, v in zip(tasks, means[1:], strict=True)})
        if loss_scale is not None:
            metrics["train/loss_scale"] = float(loss_scale.scale)
            metrics["train/skipped_steps"] = float(loss_scale.skipped)
        result.losses.append(means[0])
        result.steps.append(step)
        progress.set_postfix(loss=f"{means[0]:.4f}", refresh=False)
        on_log(step, metrics)
        window_loss, window_tasks, window_steps, window_start, paused = 0.0, [0.0] * len(tasks), 0, now, 0.0

    for step in range(start + 1, steps + 1):
        rates = schedule(step)
        if rates != applied:  # constant schedules touch the optimizers once
            applied = set_learning_rates(optimizer, *rates)
        try:
            with autocast(device, autocast_dtype):
                loss, logits, labels = pipeline.progress(it)
        except StopIteration:  # every rank's data check said: some rank has no batch left
            result.data_ended = True
            break
        result.last_step = step
        window_loss += float(loss.detach().float().mean())
        if len(tasks) > 1:
            window_tasks = [a + b for a, b in zip(window_tasks, _task_losses(logits, labels), strict=True)]
        window_steps += 1
        if result.first_step_unix is None:
            result.first_step_unix = time.time()
        progress.update(1)
        if step % log_every == 0 or step == steps:
            log_window(step)
        if on_checkpoint is not None and step < steps and due(step):
            t0 = time.perf_counter()
            pipeline.detach()  # evaluation and saving run the model outside the pipeline
            on_checkpoint(step)
            dmp.train()
            pipeline.attach(dmp)
            paused += time.perf_counter() - t0
    if window_steps:  # the data ended inside a window
        log_window(result.last_step)
    pipeline.detach()  # restore the model's own forward, for evaluation outside the pipeline
    result.final_loss = result.losses[-1] if result.losses else float("nan")
    result.samples_per_s = world * batch * timed_steps / max(timed_s, 1e-9)
    result.step_time_ms = 1000.0 * timed_s / max(timed_steps, 1)
    return result


def peak_memory_bytes(device: torch.device) -> int:
    """Peak accelerator memory allocated (CUDA) or the process's peak resident set size (CPU)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def gather_measurements(result: TrainResult, device: torch.device,
                        cores: Optional[List[int]] = None) -> List[Dict[str, Any]]:
    """Every rank's measured step time, peak memory and bound CPU cores, gathered to every rank."""
    mine = {"step_ms": result.step_time_ms, "peak_mem_bytes": float(peak_memory_bytes(device)), "cores": cores}
    out: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return out


def binary_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC AUC by the rank-sum formula (ties get their mean rank)."""
    pos = int(labels.sum().item())
    neg = labels.numel() - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order = torch.argsort(scores)
    ranks = torch.empty_like(scores, dtype=torch.float64)
    ranks[order] = torch.arange(1, scores.numel() + 1, dtype=torch.float64)
    uniq, inverse = torch.unique(scores, return_inverse=True)
    if uniq.numel() < scores.numel():  # average the ranks of tied scores
        sums = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inverse, ranks)
        counts = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inverse, torch.ones_like(ranks))
        ranks = (sums / counts)[inverse]
    return float((ranks[labels > 0.5].sum() - pos * (pos + 1) / 2) / (pos * neg))


@torch.no_grad()
def evaluate(dmp: Any, batches: Iterable, device: torch.device, cfg: Any) -> Dict[str, float]:
    """AUC and log loss over every rank's held-out batches, gathered to all ranks; per task as well for
    multi-task models (``eval/auc`` is then the mean of the tasks' AUCs)."""
    dmp.eval()
    tasks = list(cfg.model.tasks)
    logits, labels = [], []
    for b in batches:
        b = b.to(device)
        with autocast(device, cfg.precision.autocast):
            _loss, (_l, out, lab) = dmp(b)
        logits.append(out.detach().float().reshape(-1, len(tasks)))
        labels.append(lab.detach().float().reshape(-1, len(tasks)))
    if not logits:
        raise ValueError("evaluation got no batch: the evaluation data holds fewer than one batch "
                         f"({samples_per_step(cfg)} rows) per rank")
    local = torch.cat([torch.cat(logits), torch.cat(labels)], dim=1)  # (rows, 2 * tasks)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    allv = torch.cat(gathered).cpu().double()
    out: Dict[str, float] = {}
    for i, task in enumerate(tasks):
        scores, target = allv[:, i], allv[:, len(tasks) + i]
        logloss = torch.nn.functional.binary_cross_entropy_with_logits(scores, target).item()
        prefix = "eval" if len(tasks) == 1 else f"eval/{task}"
        out.update({f"{prefix}/auc": binary_auc(scores, target), f"{prefix}/logloss": logloss,
                    f"{prefix}/positive_rate": float(target.mean())})
    if len(tasks) > 1:
        out["eval/auc"] = sum(out[f"eval/{t}/auc"] for t in tasks) / len(tasks)
        out["eval/logloss"] = sum(out[f"eval/{t}/logloss"] for t in tasks) / len(tasks)
    out["eval/samples"] = float(allv.shape[0])
    dmp.train()
    return out
