"""Evaluation and measurement: AUC, log loss and normalised entropy over every rank's held-out batches, and each
rank's measured step time, peak memory and cores, gathered for the report beside the planner's estimates."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, Iterable, List, Optional

import torch
import torch.distributed as dist

from runner.train.loop import TrainResult
from runner.train.timing import Repeats


def memory_now_bytes(device: torch.device) -> int:
    """What this rank's tensors hold now: the caching allocator's reserved bytes (CUDA), or the process's anonymous
    resident memory (CPU, ``RssAnon`` after ``malloc_trim``: the heap and every tensor, not the libraries' code pages
    that the first call of a kernel brings in, nor freed pages the allocator kept). Taken as the baseline once the
    plan is made (imports, process group and planner up, the model on meta) and again after training, so that the
    difference is what the job's model, optimizer, buffers and steps hold. Python's cycle collector runs first:
    tensors that only a reference cycle keeps (a sharded lookup's output and its ids, with their autograd graph) are
    garbage, not held; 31 timed lookups of a 2-rank DLRM at batch 8,192 left 47 MiB of them, as much again as the
    job held."""
    import gc

    gc.collect()
    if device.type == "cuda":  # what earlier work (the dense part timed before planning) left cached is given back
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return int(torch.cuda.memory_reserved(device))
    import re

    from runner.runtime.allocator import give_back_freed_memory

    give_back_freed_memory()  # what was freed goes back first (a CPU worker keeps it): the bytes held, not its slack
    with open("/proc/self/status") as status:
        found = re.search(r"RssAnon:\s+(\d+)\s+kB", status.read())
    return int(found.group(1)) * 1024 if found else 0


def dense_state_bytes(dmp: torch.nn.Module, optimizer: Any) -> int:
    """What the dense part keeps on each rank, from its tensors: its parameters, their gradients, DDP's gradient
    buckets (a second copy of the gradients unless they are views of them) and the dense optimizer's state. The
    plan's storage covers the sharded tables, and of a data-parallel table its weights (TorchRec's storage estimate
    counts a data-parallel table's weights alone: 45.4 MiB of DLRM's six tables, its estimate 46.9 with the
    lookups' buffers); this is the rest a rank's memory holds for the model, those weights left out (counted in
    both, they put a data-parallel DLRM's estimate 19% over what it held)."""
    from torchrec.distributed.types import ShardedModule
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    def size(params: Any) -> int:
        return sum(p.numel() * p.element_size() for p in params)

    params = [p for _, p in in_backward_optimizer_filter(dmp.named_parameters())]
    weights = size(params)
    in_plan = {id(p) for m in dmp.modules() if isinstance(m, ShardedModule) for p in m.parameters()}
    planned = size(p for p in params if id(p) in in_plan)
    ddp = next((m for m in dmp.modules() if isinstance(m, torch.nn.parallel.DistributedDataParallel)), None)
    buckets = size(p for p in ddp.parameters() if p.requires_grad) \
        if ddp is not None and not getattr(ddp, "gradient_as_bucket_view", False) else 0
    dense = dict(getattr(optimizer, "optimizers", [])).get("dense")
    states = sum(t.numel() * t.element_size() for state in getattr(dense, "state", {}).values()
                 if isinstance(state, dict) for t in state.values() if torch.is_tensor(t) and t.dim() > 0)
    return int(2 * weights - planned + buckets + states)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak GPU memory the caching allocator reserved (CUDA: what tensors took plus the allocator's
    slack; the CUDA context and NCCL's buffers are outside it), or the process's peak resident set size
    (CPU)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_reserved(device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


# the embedding forward's calls: 5, then 5 more while their median is known worse than 3% (relative standard error),
# to 30 calls and FORWARD_BUDGET_S. A median of 5 alone scattered 29% (median; 54% at most) between two trainings of
# the same config (make bench-estimates, 2 CPU ranks), against 14% for the steps themselves
FORWARD_REPEATS, FORWARD_BUDGET_S = Repeats(5, 30, within=0.03), 2.0


@torch.enable_grad()
def embedding_forward_ms(dmp: torch.nn.Module, batches: Iterable, device: torch.device,
                         repeats: Optional[Repeats] = None) -> Optional[float]:
    """This rank's embedding lookup as the plan estimates it (the sharded tables' forward with its input and
    output all-to-alls), timed on a held-out batch: the median of its calls after one warm-up (``repeats``, default
    :data:`FORWARD_REPEATS`; every rank times as many), in ms. Timed with
    autograd recording, as a training step's forward runs (and as the calibration times its sharded lookups): on 2
    CPU ranks DLRM's lookup took 5-10% longer so than without. Changes nothing: no backward, so no table is
    updated, and the kernels' step counters are put back. None
    where the model has no sharded collection or a rank has no batch. Every rank must call it (the lookup's
    collectives)."""
    import statistics

    from runner.train.loop import device_sync
    from runner.train.timing import timed, together

    ebc = next((m for m in dmp.modules() if type(m).__name__.startswith("ShardedEmbeddingBagCollection")), None)
    batch = next(iter(batches), None)
    ready: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ready, ebc is not None and batch is not None)
    if not all(ready) or ebc is None or batch is None:
        return None
    features = batch.to(device).sparse_features

    def lookup() -> None:
        out = ebc(features)
        (out.wait() if hasattr(out, "wait") else out).values()

    # FBGEMM's kernels count every forward in their optimizer's step counter (Adam's bias correction reads it):
    # what these lookups add is taken back, so the job's state (and its checkpoint) is as training left it
    counters = [(m, name, getattr(m, name).clone()) for m in ebc.modules() for name in ("iter", "iter_cpu")
                if isinstance(getattr(m, name, None), torch.Tensor)]
    plan = repeats or FORWARD_REPEATS
    plan = dataclasses.replace(plan, deadline=time.perf_counter() + FORWARD_BUDGET_S, agree=together(device))
    try:
        return statistics.median(timed(lookup, plan, device_sync(device)))
    finally:
        for m, name, value in counters:
            getattr(m, name).copy_(value)


def held_bytes(device: torch.device) -> int:
    """What a rank holds once training is done, read before anything else runs (the embedding forward's timing
    makes garbage of its own): on a GPU the allocator's peak, on CPU what is held now (:func:`memory_now_bytes`)."""
    return peak_memory_bytes(device) if device.type == "cuda" else memory_now_bytes(device)


def gather_measurements(result: TrainResult, device: torch.device, cores: Optional[List[int]] = None,
                        embedding_ms: Optional[float] = None, baseline_bytes: int = 0, dense_bytes: int = 0,
                        held: int = 0) -> List[Dict[str, Any]]:
    """Every rank's measured step time, embedding forward (:func:`embedding_forward_ms`), minor page faults per
    step (pages first touched: on CPU, what the allocator gave back and maps in again), peak memory, what it holds
    (``held``, :func:`held_bytes` as training ended) over ``baseline_bytes`` (:func:`memory_now_bytes` before the
    model was built) and bound CPU cores, gathered to every rank."""
    mine = {"step_ms": result.step_time_ms, "embedding_fwd_ms": embedding_ms,
            "faults_per_step": result.faults_per_step,
            "peak_mem_bytes": float(peak_memory_bytes(device)), "mem_baseline_bytes": float(baseline_bytes),
            "mem_over_baseline_bytes": float(max(held - baseline_bytes, 0)), "dense_state_bytes": float(dense_bytes),
            "device": device.type, "cores": cores}
    out: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return out


def binary_metrics(scores: torch.Tensor, labels: torch.Tensor) -> Dict[str, float]:
    """AUC, log loss and normalised entropy (the log loss over that of always predicting the positive rate) of
    logits ``scores`` against 0/1 ``labels``: AUC by torchmetrics (tied scores count half, whatever their order:
    TorchRec's ``compute_auc`` integrates in sort order, so ties, frequent in bf16 and fp16 logits, would depend on
    it), NE by TorchRec's own functions (``torchrec.metrics.ne``, what its RecMetrics report); AUC is NaN where the
    labels are all of one class."""
    from torchmetrics.functional.classification import binary_auroc
    from torchrec.metrics.ne import compute_cross_entropy, compute_ne

    eta = 1e-12
    weights = torch.ones_like(labels)
    pos, neg = labels.sum(), (1.0 - labels).sum()
    one_class = bool(pos == 0 or neg == 0)  # no AUC (torchmetrics would warn and answer 0)
    auc = float("nan") if one_class else float(binary_auroc(torch.sigmoid(scores), labels.long(), validate_args=False))
    cross_entropy = compute_cross_entropy(labels, torch.sigmoid(scores), weights, eta).sum()
    return {"auc": auc,
            "logloss": torch.nn.functional.binary_cross_entropy_with_logits(scores, labels).item(),
            "ne": float(compute_ne(cross_entropy, weights.sum(), pos, neg, eta))}


@torch.no_grad()
def evaluate(dmp: torch.nn.Module, batches: Iterable, device: torch.device, tasks: List[str],
             rows: int) -> Dict[str, float]:
    """AUC, log loss and normalised entropy over every rank's held-out batches (of ``rows`` rows), gathered to all
    ranks; per task (``tasks``: ``model.tasks``) as well for multi-task models (``eval/auc``, ``eval/logloss`` and
    ``eval/ne`` are then the tasks' means)."""
    dmp.eval()
    logits, labels = [], []
    for b in batches:
        b = b.to(device, non_blocking=True)  # pinned batches: the copy overlaps the previous forward
        _loss, (_l, out, lab) = dmp(b)  # under the model's own autocast (models.autocast_forward)
        logits.append(out.detach().float().reshape(-1, len(tasks)))
        labels.append(lab.detach().float().reshape(-1, len(tasks)))
    if not logits:
        raise ValueError("evaluation got no batch: the evaluation data holds fewer than one batch "
                         f"({rows} rows) per rank")
    local = torch.cat([torch.cat(logits), torch.cat(labels)], dim=1)  # (rows, 2 * tasks)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    allv = torch.cat(gathered).cpu().double()
    metrics: Dict[str, float] = {}
    for i, task in enumerate(tasks):
        scores, target = allv[:, i], allv[:, len(tasks) + i]
        prefix = "eval" if len(tasks) == 1 else f"eval/{task}"
        metrics.update({f"{prefix}/{k}": v for k, v in binary_metrics(scores, target).items()})
        metrics[f"{prefix}/positive_rate"] = float(target.mean())
    if len(tasks) > 1:
        for name in ("auc", "logloss", "ne"):
            metrics[f"eval/{name}"] = sum(metrics[f"eval/{t}/{name}"] for t in tasks) / len(tasks)
    metrics["eval/samples"] = float(allv.shape[0])
    dmp.train()
    return metrics
