"""Schema of how a job trains: optimizers and schedules, precision, data, the training loop, checkpoints.

Every field's docstring gives its unit, default and range; ``python -m runner --cfg job`` shows the values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from runner.config.choices import one_of
from runner.config.data_sources import SOURCES
from runner.config.optimizer_kinds import DENSE, SCHEDULES, SPARSE
from runner.config.pipelines import PIPELINES
from runner.config.precisions import AUTOCASTS, COMM_DTYPES, TABLE_DTYPES, autocast_notes


@dataclass
class ScheduleSchema:
    name: str = one_of("constant", tuple(SCHEDULES))
    """The learning-rate schedule, after ``warmup_steps`` of linear warm-up."""
    warmup_steps: int = 0
    """Steps of linear warm-up from lr/warmup_steps to lr."""
    decay_rate: float = 0.5
    """``exp_decay``: factor applied every ``decay_steps``."""
    decay_steps: int = 1000
    """``exp_decay``: steps per ``decay_rate`` factor (applied smoothly)."""
    milestones: List[int] = field(default_factory=list)
    """``steps``: steps at which the learning rate is multiplied by ``gamma``."""
    gamma: float = 0.1
    """``steps``: factor applied at each milestone."""
    min_factor: float = 0.0
    """Floor, as a fraction of the base learning rate (``exp_decay``, ``cosine``)."""


@dataclass
class ClipSchema:
    kind: str = one_of("none", ("none", "norm", "value"))
    """Gradient clipping of the dense parameters: ``none`` | ``norm`` | ``value``."""
    max: float = 1.0
    """Largest total L2 norm (``norm``) or absolute value (``value``) of the dense gradients."""


@dataclass
class OptimizerSchema:
    name: str = "rowwise_adagrad_adam"
    """Preset name, for display."""
    sparse: str = one_of("rowwise_adagrad", tuple(SPARSE),
                         said={n: "CPU and GPU" if o.cpu else "GPU only" for n, o in SPARSE.items()})
    """Fused optimizer of the embedding tables, applied inside backward by FBGEMM (its CPU build runs only some)."""
    sparse_lr: float = 0.05
    """Base learning rate of the sparse optimizer."""
    sparse_eps: float = 1e-8
    """Epsilon of the sparse optimizer (Adagrad and Adam families)."""
    sparse_weight_decay: float = 0.0
    """Weight decay of the sparse optimizer."""
    sparse_weight_decay_mode: str = one_of("l2", ("l2", "decoupled"))
    """How FBGEMM applies ``sparse_weight_decay``: ``l2`` (added to the gradient) | ``decoupled``."""
    sparse_schedule: ScheduleSchema = field(default_factory=ScheduleSchema)
    """Learning-rate schedule of the sparse optimizer."""
    dense: str = one_of("adam", tuple(DENSE))
    """Optimizer of the dense (MLP) parameters (torch's)."""
    dense_lr: float = 1e-3
    """Base learning rate of the dense optimizer."""
    dense_eps: float = 1e-8
    """Epsilon of the dense optimizer (Adam, AdamW, Adagrad)."""
    dense_weight_decay: float = 0.0
    """Weight decay of the dense optimizer (decoupled for ``adamw``, L2 otherwise)."""
    dense_momentum: float = 0.0
    """Momentum of ``sgd`` (Nesterov off)."""
    dense_fused: bool = True
    """torch's fused kernel for the dense optimizer where torch has one (``fused=True``: every parameter in one
    call; the same update up to float rounding, faster than torch's per-parameter default: docs/benchmarks.md);
    false: torch's default implementation."""
    dense_schedule: ScheduleSchema = field(default_factory=ScheduleSchema)
    """Learning-rate schedule of the dense optimizer."""
    clip: ClipSchema = field(default_factory=ClipSchema)
    """Gradient clipping of the dense parameters (embedding gradients are applied inside backward)."""


@dataclass
class GradScalerSchema:
    enabled: Optional[bool] = None
    """Dynamic loss scaling (``torch.amp.GradScaler``'s rules): null = on with ``autocast: float16``."""
    init_scale: float = 65536.0
    """Loss scale of the first step."""
    growth_factor: float = 2.0
    """Factor applied to the scale after ``growth_interval`` steps without inf/nan gradients."""
    backoff_factor: float = 0.5
    """Factor applied to the scale when a step's gradients hold inf/nan (the step is skipped)."""
    growth_interval: int = 2000
    """Good steps between growths."""


@dataclass
class PrecisionSchema:
    name: str = "fp32"
    """Preset name, for display."""
    autocast: Optional[str] = one_of(None, tuple(AUTOCASTS), null=True, said=autocast_notes())
    """Autocast dtype for the dense part (null: fp32)."""
    grad_scaler: GradScalerSchema = field(default_factory=GradScalerSchema)
    """Loss scaling for fp16 autocast; the embeddings' fused optimizer gets unscaled gradients."""
    embedding_dtype: str = one_of("fp32", tuple(TABLE_DTYPES))
    """Storage type of the embedding tables (``fp16``: half the memory; FBGEMM's kernels compute in fp32 and
    round the stored rows)."""
    qcomm_forward: Optional[str] = one_of(None, tuple(COMM_DTYPES), null=True)
    """Quantised communication of the sharded embeddings' forward collectives (null: fp32)."""
    qcomm_backward: Optional[str] = one_of(None, tuple(COMM_DTYPES), null=True)
    """Quantised communication of the backward (gradient) collectives (null: fp32)."""
    tf32: bool = False
    """Allow TF32 matmuls and convolutions on CUDA (Ampere and newer); refused on CPU."""


@dataclass
class DataSchema:
    name: str = one_of("synthetic", tuple(SOURCES), said={n: s.summary for n, s in SOURCES.items()})
    """Data source (``runner/config/data_sources.py``)."""
    path: Optional[str] = None
    """``parquet``: a folder (searched recursively) or file; ``criteo``: a TSV file or a folder of them."""
    eval_path: Optional[str] = None
    """Held-out data of the same kind (null: evaluate on the first ``eval_batches`` of ``path``)."""
    num_workers: int = 0
    """Dataloader worker processes per rank reading ``path`` (0: read in the training process)."""
    prefetch_batches: int = 2
    """Training batches built ahead in a background thread of each rank (0: built between steps)."""
    hash_ids: bool = True
    """File sources: ids (criteo: hex values) taken modulo their table's size; false: out-of-range ids
    are an error."""
    num_dense_features: int = 13
    """Dense (continuous) features per sample."""
    eval_batches: int = 8
    """Held-out batches per rank for evaluation."""
    label_noise: float = 0.5
    """Temperature of the label model: larger means noisier labels (lower reachable AUC)."""
    ids_per_feature: int = 1
    """Ids per sample per table (multi-hot when > 1; the planner's pooling factor follows it)."""
    variable_lengths: bool = False
    """Draw each sample's id count from 1 .. 2 * ids_per_feature - 1 instead of exactly ids_per_feature."""
    zipf_alpha: float = 0.0
    """0: uniform ids; > 0: power-law ids with this exponent (about 1.05 for click logs), hot ids
    scattered over the table."""
    write_rows: int = 100_000
    """``mode=write_data``: training rows written (the synthetic source, as Parquet, to ``data.path``)."""
    write_files: int = 4
    """``mode=write_data``: files the training rows are split into."""
    write_eval_rows: int = 8192
    """``mode=write_data``: held-out rows (``<data.path>/eval``)."""


@dataclass
class CheckpointSchema:
    enabled: bool = True
    """Write checkpoints (torch.distributed.checkpoint) of model, optimizers, step and data position."""
    every_steps: Optional[int] = None
    """Steps between checkpoints (null: only at the end, which is always written when enabled)."""
    keep_last: int = 2
    """Newest checkpoints kept; older ones are deleted (the best one is always kept)."""
    best_metric: Optional[str] = one_of("eval/auc", ("eval/auc", "eval/logloss", "eval/ne"), null=True)
    """Eval metric that picks the best checkpoint (each checkpoint is evaluated); null: no best."""
    best_mode: str = one_of("max", ("max", "min"))
    """``max`` | ``min``: whether a larger or a smaller ``best_metric`` is better."""
    dir: Optional[str] = None
    """Folder of the checkpoints (default: ``<run folder>/checkpoints``)."""


@dataclass
class TrainSchema:
    steps: int = 200
    """Training steps (batches per rank)."""
    batch_size: int = 256
    """Samples per rank per micro-batch (per step when ``grad_accumulation_steps`` is 1)."""
    pipeline: str = one_of("sparse_dist", tuple(PIPELINES), said={n: p.summary for n, p in PIPELINES.items()})
    """Training step (``runner/config/pipelines.py``, each one's overlap in ``--help``): ``sparse_dist`` | ``base`` |
    ``fused_sparse_dist`` | ``semi_sync`` | ``sparse_dist_lite`` | ``prefetch_sparse_dist`` (GPU only). On CPU none
    overlaps anything (all measure about the same). Accumulation and fp16 loss scaling use the split step, with
    ``sparse_dist`` or ``base`` only. The plan counts the pipeline's input buffers in each GPU's memory (TorchRec's
    ``PipelineType``), in plan-only jobs too."""
    semi_sync_start: int = 900
    """``semi_sync`` only: the step (counted from the job's start or its resume) from which batches are looked up
    one update stale; before it the pipeline trains as ``sparse_dist`` (TorchRec's ``start_batch``, default 900:
    synchronous early training lowers early NE loss). >= 0."""
    grad_accumulation_steps: int = 1
    """Micro-batches per optimizer step: a step sees ``batch_size * grad_accumulation_steps`` samples
    per rank, with the dense part's activations of one micro-batch at a time (same result as the larger
    batch; embeddings are looked up and updated once per step)."""
    log_every: int = 50
    """Steps between logged training metrics."""
    stop_on_nonfinite: bool = True
    """Stop the job when the loss becomes NaN or infinite, naming the first such step (checked where the loss
    is read anyway, once every ``log_every`` steps, so it costs nothing; with fp16 loss scaling, only a window
    with no finite step, since the scaler skips single ones). false: train on, as some studies want."""
    seed: int = 0
    """Seed of the model initialisation and the synthetic data."""
    threads_per_worker: Optional[int] = None
    """torch intra-op threads per worker (default: CPU cores / workers on this host, at least 1)."""
    checkpoint: CheckpointSchema = field(default_factory=CheckpointSchema)
    """When and where checkpoints are written."""
    resume: Optional[str] = None
    """null | ``latest`` (newest complete checkpoint in the checkpoint folder) | a checkpoint path
    (a ``step-N`` folder, or a checkpoints folder: its newest). Any world size or sharding may load it."""
    resume_optimizer: bool = True
    """Restore optimizer state too. When the new sharding cannot take it (e.g. data_parallel <->
    row_wise), the job fails unless this is false: then optimizer state starts fresh, with a warning."""
