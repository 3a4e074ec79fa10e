"""Evaluation and measurement: AUC and log loss over every rank's held-out batches, and each rank's measured
step time, peak memory and cores, gathered for the report beside the planner's estimates."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional

import torch
import torch.distributed as dist

from runner.config.schema import samples_per_step
from runner.train.loop import TrainResult

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig


def peak_memory_bytes(device: torch.device) -> int:
    """Peak GPU memory the caching allocator reserved (CUDA: what tensors took plus the allocator's
    slack; the CUDA context and NCCL's buffers are outside it), or the process's peak resident set size
    (CPU)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_reserved(device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


@torch.no_grad()
def embedding_forward_ms(dmp: Any, batches: Iterable, device: torch.device, repeats: int = 5) -> Optional[float]:
    """This rank's embedding lookup as the plan estimates it (the sharded tables' forward with its input and
    output all-to-alls), timed on a held-out batch: the median of ``repeats`` after one warm-up, in ms. Changes
    nothing (no backward, no optimizer). None where the model has no sharded collection or a rank has no batch.
    Every rank must call it (the lookup's collectives)."""
    import statistics
    import time

    from runner.train.loop import device_sync

    ebc = next((m for m in dmp.modules() if type(m).__name__.startswith("ShardedEmbeddingBagCollection")), None)
    batch = next(iter(batches), None)
    ready: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ready, ebc is not None and batch is not None)
    if not all(ready) or ebc is None or batch is None:
        return None
    features, sync, times = batch.to(device).sparse_features, device_sync(device), []
    for _ in range(repeats + 1):
        sync()
        start = time.perf_counter()
        out = ebc(features)
        (out.wait() if hasattr(out, "wait") else out).values()
        sync()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times[1:])


def gather_measurements(result: TrainResult, device: torch.device, cores: Optional[List[int]] = None,
                        embedding_ms: Optional[float] = None) -> List[Dict[str, Any]]:
    """Every rank's measured step time, embedding forward (:func:`embedding_forward_ms`), peak memory and bound
    CPU cores, gathered to every rank."""
    mine = {"step_ms": result.step_time_ms, "embedding_fwd_ms": embedding_ms,
            "peak_mem_bytes": float(peak_memory_bytes(device)), "cores": cores}
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
def evaluate(dmp: Any, batches: Iterable, device: torch.device, cfg: RunnerConfig) -> Dict[str, float]:
    """AUC and log loss over every rank's held-out batches, gathered to all ranks; per task as well for
    multi-task models (``eval/auc`` is then the mean of the tasks' AUCs)."""
    dmp.eval()
    tasks = list(cfg.model.tasks)
    logits, labels = [], []
    for b in batches:
        b = b.to(device, non_blocking=True)  # pinned batches: the copy overlaps the previous forward
        _loss, (_l, out, lab) = dmp(b)  # under the model's own autocast (models.autocast_forward)
        logits.append(out.detach().float().reshape(-1, len(tasks)))
        labels.append(lab.detach().float().reshape(-1, len(tasks)))
    if not logits:
        raise ValueError("evaluation got no batch: the evaluation data holds fewer than one batch "
                         f"({samples_per_step(cfg)} rows) per rank")
    local = torch.cat([torch.cat(logits), torch.cat(labels)], dim=1)  # (rows, 2 * tasks)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    allv = torch.cat(gathered).cpu().double()
    metrics: Dict[str, float] = {}
    for i, task in enumerate(tasks):
        scores, target = allv[:, i], allv[:, len(tasks) + i]
        logloss = torch.nn.functional.binary_cross_entropy_with_logits(scores, target).item()
        prefix = "eval" if len(tasks) == 1 else f"eval/{task}"
        metrics.update({f"{prefix}/auc": binary_auc(scores, target), f"{prefix}/logloss": logloss,
                    f"{prefix}/positive_rate": float(target.mean())})
    if len(tasks) > 1:
        metrics["eval/auc"] = sum(metrics[f"eval/{t}/auc"] for t in tasks) / len(tasks)
        metrics["eval/logloss"] = sum(metrics[f"eval/{t}/logloss"] for t in tasks) / len(tasks)
    metrics["eval/samples"] = float(allv.shape[0])
    dmp.train()
    return metrics
