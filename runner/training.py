"""Optimizers, the training loop and evaluation for a DMP-wrapped DLRM."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional

import torch
import torch.distributed as dist
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

from runner.optimizers import scheduled_rates, set_learning_rates


def autocast(device: torch.device, dtype_name: Optional[str]) -> contextlib.AbstractContextManager:
    if dtype_name is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, dtype_name))


@dataclass
class TrainResult:
    losses: List[float] = field(default_factory=list)
    steps: List[int] = field(default_factory=list)
    first_step_unix: Optional[float] = None
    final_loss: float = float("nan")
    samples_per_s: float = 0.0
    step_time_ms: float = 0.0


def _mean_across_ranks(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def train(dmp: Any, optimizer: Any, batches: Iterable, start: int, steps: int, device: torch.device, cfg: Any,
          on_log: Callable[[int, Dict[str, float]], None], progress: Any,
          due: Callable[[int], bool] = lambda step: False,
          on_checkpoint: Optional[Callable[[int], None]] = None) -> TrainResult:
    """Run steps ``start+1 .. steps`` pipelined. Every ``train.log_every`` steps report metrics; at steps
    where ``due(step)``, hand the model to ``on_checkpoint`` (outside the pipeline). All ranks join both."""
    result = TrainResult()
    if start >= steps:
        return result
    pipeline = TrainPipelineSparseDist(dmp, optimizer, device, execute_all_batches=True)
    it = iter(batches)
    dmp.train()
    world, batch = dist.get_world_size(), cfg.train.batch_size
    window_loss, window_steps, window_start, paused = 0.0, 0, time.perf_counter(), 0.0
    applied: tuple = ()
    timed_s, timed_steps, first_window = 0.0, 0, True  # the first window holds the pipeline's tracing
    for step in range(start + 1, steps + 1):
        with autocast(device, cfg.precision.autocast):
            rates = scheduled_rates(cfg.optimizer, step, steps)
            if rates != applied:  # constant schedules touch the optimizers once
                applied = set_learning_rates(optimizer, *rates)
            lr_sparse, lr_dense = applied
            loss, _logits, _labels = pipeline.progress(it)
        window_loss += float(loss.detach().float().mean())
        window_steps += 1
        if result.first_step_unix is None:
            result.first_step_unix = time.time()
        progress.update(1)
        if step % cfg.train.log_every == 0 or step == steps:
            now = time.perf_counter()
            elapsed = now - window_start - paused  # wall time of the window: logging included, pauses not
            if not first_window or step == steps and timed_steps == 0:
                timed_s, timed_steps = timed_s + elapsed, timed_steps + window_steps
            first_window = False
            loss_avg = _mean_across_ranks(window_loss / window_steps, device)
            metrics = {
                "train/loss": loss_avg,
                "train/samples_per_s": world * batch * window_steps / max(elapsed, 1e-9),
                "train/lr_dense": lr_dense,
                "train/lr_sparse": lr_sparse,
            }
            result.losses.append(loss_avg)
            result.steps.append(step)
            progress.set_postfix(loss=f"{loss_avg:.4f}", refresh=False)
            on_log(step, metrics)
            window_loss, window_steps, window_start, paused = 0.0, 0, now, 0.0
        if on_checkpoint is not None and step < steps and due(step):
            t0 = time.perf_counter()
            pipeline.detach()  # evaluation and saving run the model outside the pipeline
            on_checkpoint(step)
            dmp.train()
            pipeline.attach(dmp)
            paused += time.perf_counter() - t0
    pipeline.detach()  # restore the model's own forward, for evaluation outside the pipeline
    result.final_loss = result.losses[-1]
    result.samples_per_s = world * batch * timed_steps / max(timed_s, 1e-9)
    result.step_time_ms = 1000.0 * timed_s / max(timed_steps, 1)
    return result


def peak_memory_bytes(device: torch.device) -> int:
    """Peak accelerator memory allocated (CUDA) or the process's peak resident set size (CPU)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def gather_measurements(result: TrainResult, device: torch.device) -> List[Dict[str, float]]:
    """Every rank's measured step time and peak memory, gathered to every rank."""
    mine = {"step_ms": result.step_time_ms, "peak_mem_bytes": float(peak_memory_bytes(device))}
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
    """AUC and log loss over every rank's held-out batches, gathered to all ranks."""
    dmp.eval()
    logits, labels = [], []
    for b in batches:
        b = b.to(device)
        with autocast(device, cfg.precision.autocast):
            _loss, (_l, out, lab) = dmp(b)
        logits.append(out.detach().float().reshape(-1))
        labels.append(lab.detach().float().reshape(-1))
    local = torch.stack([torch.cat(logits), torch.cat(labels)])
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    allv = torch.cat(gathered, dim=1).cpu().double()
    scores, target = allv[0], allv[1]
    logloss = torch.nn.functional.binary_cross_entropy_with_logits(scores, target).item()
    auc = binary_auc(scores, target)
    dmp.train()
    return {"eval/auc": auc, "eval/logloss": logloss,
            "eval/samples": float(target.numel()), "eval/positive_rate": float(target.mean())}
