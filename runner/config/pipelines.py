"""Every training pipeline ``train.pipeline`` may name, each declared once, here, with what its plan counts.

TorchRec's storage estimator sizes the input buffers a pipeline keeps in flight on each GPU by the pipeline's
``PipelineType`` (``EmbeddingStorageEstimator(pipeline_type=...)``): ``train_sparse_dist`` twice a shard's
input, ``train_prefetch_sparse_dist`` three times and the caches' prefetch, ``train_base`` (as ``none``) the input
and the pooled output once. A declaration says which of them the pipeline is planned as; the schema's allowed
values (:mod:`.schema_training`), the training loop and the planner read it. Host memory (CPU workers) counts the
input and output once whatever the pipeline: TorchRec's estimator applies the pipeline's buffers to HBM only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict


@dataclass(frozen=True)
class Pipeline:
    name: str
    summary: str
    """What it overlaps, in a few words (the schema's documentation, ``--help``)."""
    planned_as: str
    """The value of TorchRec's ``PipelineType`` its plan's storage estimate counts the buffers of."""


PIPELINES: Dict[str, Pipeline] = {p.name: p for p in (
    Pipeline("sparse_dist", "TorchRec's TrainPipelineSparseDist: the next batch's input dist overlaps this step's "
             "compute on GPUs", "train_sparse_dist"),
    Pipeline("base", "TorchRec's TrainPipelineBase: one step after the other", "train_base"),
)}
SPLIT_STEP_PLANNED_AS = "train_base"
"""The split step (gradient accumulation, fp16 loss scaling: :mod:`runner.train.split_step`) holds one batch at a
time, as the unpipelined step does."""


def planned_pipeline(pipeline: str, split_step: bool) -> str:
    """The ``PipelineType`` value of the step the job runs: ``train.pipeline``'s, or the split step's where
    accumulation or loss scaling make the job run that instead (``split_step``:
    :func:`runner.config.schema.uses_split_step`)."""
    return SPLIT_STEP_PLANNED_AS if split_step else PIPELINES[pipeline].planned_as
