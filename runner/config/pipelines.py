"""Every training pipeline ``train.pipeline`` may name, each declared once, here, with what its plan counts.

A declaration says which of TorchRec's pipeline classes (``torchrec.distributed.train_pipeline.train_pipelines``)
trains the step, the keyword arguments the runner gives it, where it runs, and whether the split step
(:mod:`runner.train.split_step`: gradient accumulation, fp16 loss scaling) may stand in for it. The schema's allowed
values (:mod:`.schema`), the validation (:func:`pipeline_fault`), the training loop and the planner read it;
nothing else names a pipeline. Every one of them is in each supported stack (TorchRec 1.6.1 to 1.9.2, read from
their wheels), so no stack refuses one.

TorchRec's storage estimator sizes the input buffers a pipeline keeps in flight on each GPU by the pipeline's
``PipelineType`` (``EmbeddingStorageEstimator(pipeline_type=...)``): ``train_sparse_dist`` twice a shard's
input, ``train_prefetch_sparse_dist`` three times and the caches' prefetch, ``train_base`` (as ``none``) the input
and the pooled output once. TorchRec has no type of its own for the fused, semi-synchronous and lite pipelines:
each is planned as the type whose buffers it keeps (said per declaration). Host memory (CPU workers) counts the
input and output once whatever the pipeline: TorchRec's estimator applies the pipeline's buffers to HBM only.

On CPU nothing overlaps (the pipelines' side streams are CUDA streams; gloo's collectives block), so the
pipelines that run there (``sparse_dist``, ``base``, ``sparse_dist_lite``) measure about the same and train to the
same losses. ``fused_sparse_dist`` and ``semi_sync`` start the embedding lookup through a pipelined forward that is
CUDA's only in TorchRec 1.9.2, ``prefetch_sparse_dist`` prefetches a CUDA cache: refused on CPU workers before
launch. ``semi_sync`` is not synchronous: from ``train.semi_sync_start`` on, each batch's embeddings are looked
up before the previous batch's sparse update is applied (one update stale), so its losses leave ``sparse_dist``'s;
before that step it trains as ``sparse_dist``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple


@dataclass(frozen=True)
class Pipeline:
    name: str
    summary: str
    """What it overlaps, in a few words (the schema's documentation, ``--help``)."""
    planned_as: str
    """The value of TorchRec's ``PipelineType`` its plan's storage estimate counts the buffers of."""
    torchrec_class: str
    """Its class in ``torchrec.distributed.train_pipeline.train_pipelines``."""
    runner_class: Optional[str] = None
    """A subclass of it in :mod:`runner.train.pipeline_classes` that the runner trains with instead (pausable, or
    able to run on CPU); None: TorchRec's class itself."""
    options: Tuple[Tuple[str, Any], ...] = ()
    """Keyword arguments the runner gives the class, beyond model, optimizer and device."""
    from_train: Tuple[Tuple[str, str], ...] = ()
    """Keyword arguments taken from ``train.*`` keys: (the class's argument, the key)."""
    gpu_only: Optional[str] = None
    """Why it cannot train on CPU workers (refused there before launch, saying this); None: it trains there."""
    split_step: bool = False
    """Whether the split step may replace it when accumulating micro-batches or scaling an fp16 loss (it is then not
    pipelined: ``sparse_dist`` and ``base`` only, whose step it reproduces); otherwise that combination is refused."""


_CUDA_FORWARD = ("starts its embedding lookup ahead of the forward on a CUDA stream: TorchRec's pipelined forward "
                 "for it assumes a CUDA device when no stream is given and records the lookup's output on the "
                 "current stream, which a CPU stream cannot take")
_DRAIN = (("execute_all_batches", True),)  # the batches in flight when the data ends are trained, as the loop counts
PIPELINES: Dict[str, Pipeline] = {p.name: p for p in (
    Pipeline("sparse_dist", "TorchRec's TrainPipelineSparseDist: batch i+1's input dist (all-to-all of its ids) and "
             "batch i+2's copy to the device overlap batch i's forward, backward and step on GPUs", "train_sparse_dist",
             "TrainPipelineSparseDist", options=_DRAIN, split_step=True),
    Pipeline("base", "TorchRec's TrainPipelineBase: only the next batch's copy to the device overlaps the step",
             "train_base", "TrainPipelineBase", "PausableBase", split_step=True),
    Pipeline("fused_sparse_dist", "TorchRec's TrainPipelineFusedSparseDist: as sparse_dist, and batch i+1's embedding "
             "lookup also overlaps batch i's dense optimizer step (the tables' update is fused into backward); "
             "planned as train_sparse_dist (the same batches in flight)", "train_sparse_dist",
             "TrainPipelineFusedSparseDist", options=_DRAIN, gpu_only=_CUDA_FORWARD),
    Pipeline("semi_sync", "TorchRec's TrainPipelineSemiSync: from train.semi_sync_start on, batch i+1's embedding "
             "lookup and output all-to-all overlap batch i's forward and backward, so each batch sees embeddings "
             "one update stale (not sparse_dist's losses); planned as train_sparse_dist", "train_sparse_dist",
             "TrainPipelineSemiSync", options=_DRAIN, from_train=(("start_batch", "semi_sync_start"),),
             gpu_only=_CUDA_FORWARD),
    Pipeline("prefetch_sparse_dist", "TorchRec's PrefetchTrainPipelineSparseDist: as sparse_dist, and batch i+1's "
             "UVM-caching tables' rows are prefetched into the cache during batch i (GPU only: its prefetch is CUDA's)",
             "train_prefetch_sparse_dist", "PrefetchTrainPipelineSparseDist", options=_DRAIN,
             gpu_only="prefetches UVM-caching tables' rows on a CUDA stream (no caching kernel on CPU)"),
    Pipeline("sparse_dist_lite", "TorchRec's TrainPipelineSparseDistLite: one batch in flight, only its copy to the "
             "device overlaps the step (input dist stays in it): less memory than sparse_dist, planned as train_base",
             "train_base", "TrainPipelineSparseDistLite"),
)}
SPLIT_STEP_PLANNED_AS = "train_base"
"""The split step (gradient accumulation, fp16 loss scaling: :mod:`runner.train.split_step`) holds one batch at a
time, as the unpipelined step does."""


def planned_pipeline(pipeline: str, split_step: bool) -> str:
    """The ``PipelineType`` value of the step the job runs: ``train.pipeline``'s, or the split step's where
    accumulation or loss scaling make the job run that instead (``split_step``:
    :func:`runner.config.schema.uses_split_step`)."""
    return SPLIT_STEP_PLANNED_AS if split_step else PIPELINES[pipeline].planned_as


def split_step_fault(pipeline: str, split_step: bool) -> Optional[str]:
    """What allows ``pipeline`` where the split step is on (``split_step``) and may not replace it, as one refusal
    line's allowed-values part; None where the job runs."""
    if not split_step or PIPELINES[pipeline].split_step:
        return None
    able = " or ".join(n for n, p in PIPELINES.items() if p.split_step)
    return (f"{able} with train.grad_accumulation_steps > 1 or fp16 loss scaling (the split step replaces the "
            f"pipeline; {pipeline} is not implemented for it)")


def device_fault(pipeline: str, device_kind: str) -> Optional[str]:
    """What allows ``pipeline`` on workers of ``device_kind`` (``cpu``, ``cuda``) where it cannot run there, as one
    refusal line's allowed-values part; None where it runs."""
    declared = PIPELINES[pipeline]
    if device_kind != "cpu" or declared.gpu_only is None:
        return None
    able = ", ".join(n for n, p in PIPELINES.items() if p.gpu_only is None)
    return f"a pipeline that runs on CPU workers ({able}): {pipeline} {declared.gpu_only}"
