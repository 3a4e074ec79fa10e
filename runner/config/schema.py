"""Typed configuration schema: the single source of truth for every key and its default.

The root dataclass is registered in Hydra's ConfigStore as ``runner_schema`` and named first in
``conf/config.yaml``'s defaults list, so every group's YAML file merges onto its typed node and holds only
what its option changes. A value of the wrong type fails while Hydra composes; ranges and cross-key rules
are checked by :func:`runner.config.validation.validate` before anything is launched.

One concept: the typed config, every key with its unit, default and range, read top to bottom as the
reference of what a job can be told (the model, sharding and cluster; the optimizer, precision, data and
training loop; tracking, sweeps and calibration; the root that holds them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, cast

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runner.config.choices import one_of, some_of
from runner.config.data_sources import SOURCES
from runner.config.errors import ConfigError, config_error_line, first_line, wrong_type
from runner.config.model_families import FAMILIES
from runner.config.modes import DEFAULT, MODES
from runner.config.optimizer_kinds import DENSE, SCHEDULES, SPARSE
from runner.config.pipelines import PIPELINES
from runner.config.precisions import AUTOCASTS, COMM_DTYPES, TABLE_DTYPES, autocast_notes, loss_scaling_by_default
from runner.config.proposers import BALANCED_STARTS, PROPOSERS
from runner.config.reservations import RESERVATIONS

# What is trained and where: the model and its tables, the sharding policy, the cluster.

SHARDING_TYPES = ("data_parallel", "table_wise", "column_wise", "table_column_wise", "row_wise", "table_row_wise",
                  "grid_shard")
COMPUTE_KERNELS = ("dense", "fused", "fused_uvm", "fused_uvm_caching", "key_value")


@dataclass
class TableSchema:
    name: str = MISSING
    """Table name; its single feature has the same name."""
    num_embeddings: int = MISSING
    """Rows (hash size) of the table; ids are drawn in [0, num_embeddings)."""
    embedding_dim: Optional[int] = None
    """Width of this table (default: ``model.embedding_dim``; ``dlrm`` needs one width for all)."""


@dataclass
class GeneratedTablesSchema:
    count: int = 0
    """Tables to add after ``model.tables``, named ``g000``, ``g001``, ..."""
    min_rows: int = 1000
    """Smallest table; row counts are spread log-uniformly between min_rows and max_rows."""
    max_rows: int = 100_000_000
    """Largest table."""
    dims: List[int] = field(default_factory=lambda: [32, 64, 128, 256])
    """Widths, assigned in turn (``dnn`` models only; ``dlrm`` uses ``model.embedding_dim``)."""
    seed: int = 0
    """Seed of the row counts (the same seed gives the same tables)."""


@dataclass
class ModelSchema:
    name: str = "dlrm"
    """Preset name, for display."""
    family: str = one_of("dlrm", tuple(FAMILIES), said={n: f.summary for n, f in FAMILIES.items()})
    """The model's family: its builder, and whether it needs one width for every table and one task
    (``runner/config/model_families.py``)."""
    dcn_num_layers: int = 3
    """``dcn``: cross layers."""
    dcn_low_rank_dim: int = 16
    """``dcn``: rank of each cross layer's low-rank weight."""
    embedding_dim: int = 64
    """Width of every embedding table (DLRM's dot interaction needs one shared width)."""
    tables: List[TableSchema] = field(default_factory=list)
    """Sparse features, one embedding table each."""
    generated_tables: GeneratedTablesSchema = field(default_factory=GeneratedTablesSchema)
    """More tables, generated (for planning studies with many tables)."""
    dense_arch_layer_sizes: List[int] = field(default_factory=lambda: [64, 64])
    """Bottom MLP widths; for ``dlrm`` the last must equal ``embedding_dim``."""
    over_arch_layer_sizes: List[int] = field(default_factory=lambda: [64, 32, 1])
    """Top MLP widths; the last must be 1 (one logit). ``mmoe``: each task tower's widths."""
    tasks: List[str] = field(default_factory=lambda: ["label"])
    """Labels the model predicts, one logit each (the data's label columns). Only ``mmoe`` takes more
    than one; each task gets its own loss and metrics (``train/<task>/loss``, ``eval/<task>/auc``)."""
    num_experts: int = 4
    """``mmoe``: shared experts (MLPs over the dense output and the pooled embeddings)."""
    expert_layer_sizes: List[int] = field(default_factory=lambda: [64, 32])
    """``mmoe``: widths of each expert MLP."""


@dataclass
class TableConstraintSchema:
    """TorchRec ``ParameterConstraints`` for one table; null fields leave the planner free."""

    sharding_types: Optional[List[str]] = some_of(SHARDING_TYPES, null=True)
    """Sharding types allowed for this table (overrides ``sharding.types``)."""
    compute_kernels: Optional[List[str]] = some_of(COMPUTE_KERNELS, null=True)
    """Compute kernels allowed for this table (overrides ``sharding.compute_kernels``)."""
    min_partition: Optional[int] = None
    """Smallest column-shard width for column-wise splits."""
    pooling_factor: Optional[float] = None
    """Average ids per sample of this table's feature (the planner's cost model input; default 1)."""
    cache_load_factor: Optional[float] = None
    """Fraction of rows cached in HBM with the ``fused_uvm_caching`` kernel (0..1)."""
    enforce_hbm: Optional[bool] = None
    """Keep this table's caching kernel's storage in HBM."""


@dataclass
class ShardingSchema:
    name: str = "auto"
    """Preset name, for display."""
    types: List[str] = some_of(SHARDING_TYPES)
    """Sharding types allowed for every table (empty: the planner chooses among all)."""
    compute_kernels: List[str] = some_of(COMPUTE_KERNELS)
    """Compute kernels allowed (empty: the device's defaults; on CPU ``fused``/``dense``)."""
    storage_reserve_percent: float = 0.15
    """Fraction (0..1) of every device's memory the planner keeps free for non-embedding use (policies
    ``heuristic``, ``fixed_percent``, ``inference``; ``sku_aware``: of the home hardware's memory). Default 0.15."""
    storage_reserve_policy: str = one_of("heuristic", tuple(RESERVATIONS),
                                         said={n: r.summary for n, r in RESERVATIONS.items()})
    """How much of each device's memory the planner keeps free: one of TorchRec's storage reservations
    (``runner/config/reservations.py``; docs/planning.md). Default ``heuristic``. On CPU workers the same bytes of
    host memory (what the policy keeps free of a GPU that size). ``fixed`` is ``fixed_percent``'s old name."""
    storage_reserve_gib: Optional[float] = None
    """``fixed_absolute``: GiB kept free on every device (>= 0; required by that policy). Default null."""
    storage_reserve_home_gib: Optional[float] = None
    """``sku_aware``: memory per device, GiB, of the home hardware kind its margin is anchored to: the margin is
    ``storage_reserve_percent`` of it, whatever devices the job lands on (e.g. 80 for an 80 GB GPU; > 0).
    Default null: this cluster's device memory (``cluster.hbm_cap_gib``, or host memory on CPU)."""
    storage_reserve_dense_multiplier: float = 6.0
    """``heuristic`` and ``sku_aware``: the dense part's bytes kept free per byte of its parameters (parameters,
    gradients, optimizer state, DDP's buckets; > 0). Default 6.0, TorchRec's."""
    storage_reserve_base_gib: Optional[float] = None
    """``sku_aware``: a measured base, GiB per device, kept free in place of the margin and the dense part (>= 0).
    Default null: the margin plus the dense part."""
    storage_reserve_overhead_gib: float = 0.0
    """``sku_aware``: runtime overhead, GiB per device (driver context, NCCL buffers, fragmentation; >= 0).
    Default 0, TorchRec's."""
    planner_batch_size: Optional[int] = None
    """Per-rank batch size the planner assumes for its estimates (default: ``train.batch_size``)."""
    constraints: Dict[str, Any] = field(default_factory=dict)
    """Per-table constraints (fields of :class:`TableConstraintSchema`), e.g.
    ``+sharding.constraints.t0.sharding_types=[row_wise]``."""
    proposer: str = one_of("default", tuple(PROPOSERS), said={n: p.summary for n, p in PROPOSERS.items()})
    """The proposer of the sharding planner (``runner/config/proposers.py``; docs/planning.md)."""
    balanced_work: int = 2_000_000
    """Work the ``balanced`` proposer's search may do, in evaluations (a sharding option placed, a shard moved;
    docs/planning.md), counted rather than timed so that a config gives the same plan on any machine (> 0)."""
    balanced_patience: int = 20_000
    """The ``balanced`` search stops once this much work (evaluations) has gone by since its plan last improved
    (>= 0): hundreds of ruin-and-recreate rounds on a few tables, a few at thousands of tables."""
    balanced_gap: float = 0.005
    """The ``balanced`` search stops once its plan is within this fraction of the simple lower bound (>= 0; the
    estimates themselves are rarely closer than a few percent to a measured step: docs/calibration.md)."""
    balanced_compare: Optional[List[str]] = some_of(BALANCED_STARTS, null=True)
    """TorchRec's proposers whose plans the ``balanced`` proposer also starts from and reports (null:
    ``[dynamic_programming]`` on GPU clusters, none on CPU, where that proposer does not run; ``greedy``
    takes a minute at 300 tables on 64 GPUs)."""
    dp_hbm_bins: int = 100
    """HBM bins per device of the dynamic-programming proposer (its precision)."""
    grid_max_proposals: int = 10000
    """Proposals the grid-search proposer may try before it gives up."""
    planner_timeout_s: Optional[float] = None
    """A safety stop: each search (TorchRec's proposers' loop, the balanced search after its starts) stops after
    this many seconds of wall clock and keeps the best plan so far (null: no limit). Where it fires, the plan may
    differ by machine and load, and the run says so (tag ``runner.plan_cut_short``)."""
    plan: Optional[str] = None
    """Path of a ``plan.json`` written by an earlier run: reuse that plan exactly instead of planning."""


@dataclass
class ClusterSchema:
    name: str = "local"
    """Preset name, for display."""
    nodes: int = 1
    """Number of nodes (hosts). On one host, nodes > 1 are emulated by one elastic agent each."""
    workers_per_node: int = 2
    """Worker processes per node (one per GPU with CUDA)."""
    device: str = one_of("auto", ("auto", "cpu", "cuda"))
    """``auto`` (CUDA when present, else CPU) | ``cpu`` | ``cuda``."""
    hbm_cap_gib: Optional[float] = None
    """GPU memory per worker, GiB, that the planner may use. Default (null): training on CUDA reads it from
    the job's GPUs (the smallest); planning without GPUs uses TorchRec's 32 GiB. Refused above the
    memory a training job's GPUs have."""
    ddr_cap_gib: Optional[float] = None
    """Host memory per worker, GiB, that the planner may use (default: TorchRec's 128 GiB)."""
    intra_node_bandwidth: Optional[float] = None
    """Bandwidth between workers of one node, GiB/s (null: the calibration's measured all-to-all, else TorchRec's
    default 600)."""
    cross_node_bandwidth: Optional[float] = None
    """Bandwidth between nodes, GiB/s per worker (null: the calibration's measured all-to-all across nodes, else
    TorchRec's default 12.5)."""
    calibration: str = "auto"
    """The cost model's constants a plan is made with: ``auto`` (the newest calibration in
    ``cluster.calibration_dir`` made on this hardware, by ``python -m runner mode=calibrate``; none there:
    TorchRec's defaults) | ``none`` (TorchRec's default constants, unchanged) | a calibration file's path (one
    made on another machine too: plan for the cluster you are about to rent). A calibration's measured
    bandwidths are used where ``intra_node_bandwidth``/``cross_node_bandwidth`` are null (docs/calibration.md)."""
    calibration_dir: Optional[str] = None
    """Where ``mode=calibrate`` keeps calibrations and ``auto`` looks for them (null: ``$RUNNER_CALIBRATION_DIR``,
    else ``~/.cache/runner/calibrations``)."""
    master_addr: str = "127.0.0.1"
    """Rendezvous host (node 0's address on a real cluster)."""
    master_port: Optional[int] = None
    """Rendezvous port (default: a free port on this host)."""
    node_rank: Optional[int] = None
    """This host's node rank on a real multi-node job. Unset: all nodes run on this host."""
    scheduler: str = "auto"
    """``auto``: a task of a scheduler's job takes its node rank, rendezvous host and port from that scheduler |
    a scheduler's name: the same, and an error outside its jobs | ``local`` (or ``none``): ignore any scheduler's
    environment (all nodes on this host, or ``cluster.node_rank`` by hand). The names, and how each scheduler
    submits (its ``hydra/launcher``), are :mod:`runner.launch.schedulers`' (checked there; docs/clusters.md)."""
    pg_timeout_s: int = 300
    """Process-group (collective) timeout, seconds."""
    max_restarts: int = 0
    """How many times torch elastic restarts the workers after a worker fails."""
    start_method: str = one_of("auto", ("auto", "fork", "spawn"))
    """How agents start workers: ``fork`` (workers inherit the agent's imports: faster start-up) |
    ``spawn`` (fresh interpreters) | ``auto`` (fork for CPU workers, spawn for CUDA workers)."""
    cpu_affinity: str = one_of("auto", ("auto", "none"))
    """``auto``: bind each CPU worker to its own slice of the host's cores (none when the host has fewer
    cores than workers), each CUDA worker to the cores of its GPU's socket | ``none``: let the kernel move
    workers between cores."""
    gloo_loop_priority: str = one_of("low", ("low", "normal"))
    """``low``: each worker's gloo event-loop threads at nice 19. Such a thread polls without sleeping
    while a peer's data waits for this rank to post its receive, on the cores of the rank's training
    thread, which it then slows: low, it runs when that thread waits (what that buys: docs/benchmarks.md)
    | ``normal``: as torch starts them."""


# How a job trains: optimizers and schedules, precision, data, the training loop, checkpoints.


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


# What a job reports and how a sweep runs it; the calibration; the root.


@dataclass
class ObjectiveSchema:
    metric: Optional[str] = None
    """The run metric a job returns to a searching sweeper (``hydra/sweeper=optuna``); null: ``eval/auc``
    in train mode, ``plan/est_step_ms`` (the plan's estimated step time) in plan mode."""
    direction: Optional[str] = one_of(None, ("max", "min"), null=True)
    """``max`` | ``min``; null: ``max`` for metrics named ``*auc*`` or ``*accuracy*``, else ``min``. A point
    with no value (no plan fits, a failed job) returns the worst value: -inf for max, +inf for min."""
    more_metrics: List[str] = field(default_factory=list)
    """Further run metrics a job returns after ``metric``, for a multi-objective study (``hydra.sweeper.direction``
    a list, one direction per metric: e.g. ``[minimize, minimize]`` for ``plan/est_step_ms`` and
    ``plan/max_mem_bytes``); each one's direction by its name, as ``direction``'s null says."""
    study: Optional[str] = None
    """Set by the Optuna sweeper on a trial's job when its study has a pruner: the file naming the study's storage,
    name and pruner (``optuna_trial.yaml`` in the sweep folder); the job reports ``metric`` at each checkpoint's
    evaluation and stops where the pruner says so (:mod:`runner.track.trial`)."""
    trial: Optional[int] = None
    """Set by the Optuna sweeper with ``study``: the number of the trial this job is."""


@dataclass
class TrackingSchema:
    uri: Optional[str] = None
    """MLflow tracking URI. Default: $MLFLOW_TRACKING_URI, else sqlite:///<project>/mlflow.db."""
    experiment: str = "runner"
    """MLflow experiment name."""
    run_name: Optional[str] = None
    """MLflow run name (default: the config choices, e.g. ``dlrm-rowwise-local``)."""
    system_metrics: bool = True
    """Record CPU, memory, disk, network (and GPU) use over a training run, per node, in the run's System metrics."""
    system_metrics_interval_s: float = 10.0
    """Seconds between system-metric samples."""
    objective: ObjectiveSchema = field(default_factory=ObjectiveSchema)
    """What each job returns to the sweeper (metric and direction)."""


@dataclass
class SweepSchema:
    retries: int = 0
    """Run a job (a sweep's point, or a single job) again, up to this many times, when it failed from a fault:
    a worker or agent killed by a signal, a tracking server that did not answer at the start. Each attempt
    keeps its files (the earlier ones in ``previous/<n>/``) and its MLflow run (tag ``runner.attempt``).
    Config errors, failures of the job's own code and "no plan fits" are answers, never retried."""
    reuse: Optional[bool] = None
    """Link a sweep's point to a FINISHED run of the same config (tag ``runner.config_hash``) in the experiment
    instead of running it; null: on for plan-only points (their answers are deterministic), off for training."""
    max_failures: Optional[int] = None
    """Stop the sweep once this many points have failed (null: never): no point starts after that, the points
    running are stopped (KILLED), the parent ends FAILED naming the failures' common reason, and ``python -m
    runner resume <sweep folder>`` runs the rest once the cause is fixed. A plan-only "no plan fits" is an
    answer and a fault retried into a success (``sweep.retries``) is not a failure."""
    verbose: bool = False
    """Print each point's details (its plan's table and note) as a single run does; by default a sweep's point
    prints its one summary line and the sweep one progress line per finished point."""
    resume_changed: bool = False
    """Resume a sweep folder (``python -m runner resume <folder>``, or the same ``hydra.sweep.dir`` again) with
    overrides that differ from its command; its points finished with another config run again."""


@dataclass
class CalibrateSchema:
    """``mode=calibrate``: how the hardware is measured (docs/calibration.md)."""

    repeats: int = 7
    """Timed repeats of each measurement, after one warm-up (at least 3: the spread needs them)."""
    max_spread: float = 0.25
    """The repeats' allowed scatter (median absolute deviation over the median, a fraction) at ``repeats``: a part
    is trusted when its medians are known as well as ``repeats`` repeats scattered this much know them (their
    relative standard error, 1.2533 x spread / sqrt(repeats)); a scattered point takes more repeats
    (``max_repeats``). A part that stays untrusted falls back alone to TorchRec's constants (docs/calibration.md)."""
    max_repeats: int = 256
    """The most timed repeats of one measurement, when its median is not yet known well enough (the median's error
    shrinks as 1/sqrt(repeats): 64 know it three times better than 7, 256 six times). At least ``repeats``.
    ``max_extra_s`` bounds the time they take: a small message's round of 7 takes milliseconds, and beside a busy
    process on 1 x 2 a third of the collectives' points still scattered 13-19% after 64."""
    max_extra_s: float = 40.0
    """Seconds, at most, that the extra repeats of one calibration take, shared by its parts in the order they are
    measured (the collectives, kernels, sharded lookups and dense part: each may take what the parts before it
    left, an eighth kept for each part still to come), so the whole command stays bounded on a busy machine."""
    dense_per_job: bool = True
    """A training job planned with a calibration times its own dense part (forward, backward, the dense optimizer's
    step; 3 repeats on each worker, before planning) for its whole step's estimate, instead of the calibration's
    rate per FLOP, which models of other shapes (wide inputs, cross layers) do not follow. Never changes the plan."""
    grid: str = one_of("full", ("full", "small"))
    """``full``: every kernel shape and message size | ``small``: a few of each (seconds; a quick check)."""
    max_message_mib: Optional[float] = None
    """The largest collective message per rank, MiB (null: 64 on CPU, 256 on a GPU)."""
    keep: bool = True
    """Keep a trusted calibration in ``cluster.calibration_dir`` for ``cluster.calibration=auto``."""


@dataclass
class RunnerConfig:
    mode: str = one_of(DEFAULT, tuple(MODES), said={n: m.summary for n, m in MODES.items()})
    """``train`` (launch workers) | ``plan`` (plan and log in this process only; any cluster) | ``calibrate``
    (measure this cluster's kernels, collectives and dense part on the job's workers; write a calibration for
    ``cluster.calibration``: docs/calibration.md) | ``write_data`` (write the synthetic source for this model as
    Parquet to ``data.path``)."""
    model: ModelSchema = field(default_factory=ModelSchema)
    sharding: ShardingSchema = field(default_factory=ShardingSchema)
    optimizer: OptimizerSchema = field(default_factory=OptimizerSchema)
    cluster: ClusterSchema = field(default_factory=ClusterSchema)
    precision: PrecisionSchema = field(default_factory=PrecisionSchema)
    data: DataSchema = field(default_factory=DataSchema)
    train: TrainSchema = field(default_factory=TrainSchema)
    tracking: TrackingSchema = field(default_factory=TrackingSchema)
    sweep: SweepSchema = field(default_factory=SweepSchema)
    calibrate: CalibrateSchema = field(default_factory=CalibrateSchema)


def samples_per_step(train: TrainSchema) -> int:
    """Rows per rank per optimizer step: ``train.batch_size`` times ``train.grad_accumulation_steps``."""
    return int(train.batch_size) * int(train.grad_accumulation_steps)


def loss_scaling_enabled(precision: PrecisionSchema) -> bool:
    """``precision.grad_scaler.enabled``, whose null means: on with float16 autocast."""
    enabled = precision.grad_scaler.enabled
    return loss_scaling_by_default(precision.autocast) if enabled is None else bool(enabled)


def uses_split_step(train: TrainSchema, precision: PrecisionSchema) -> bool:
    """Gradient accumulation and loss scaling train with the split step (:mod:`runner.train.split_step`), which
    needs every table sharded by TorchRec: no ``data_parallel`` tables."""
    return train.grad_accumulation_steps > 1 or loss_scaling_enabled(precision)


def resolved_mapping(node: object) -> Dict[str, Any]:
    """An OmegaConf mapping resolved, in plain dicts: a job's config where it leaves the typed one (its run, its
    ``resolved.yaml``, its hash, enumeration's reuse key), made once per job; or a node of Hydra's own config."""
    plain = OmegaConf.to_container(node, resolve=True)
    assert isinstance(plain, dict)  # the root is a mapping
    return {str(k): v for k, v in plain.items()}


def load_resolved(path: Path) -> RunnerConfig:
    """A job's ``resolved.yaml`` (written by the driver, or given to torchrun) as the typed config: merged onto
    the schema, so a value of the wrong type, or a key the schema does not have, fails here in one line naming
    the key and the file (:class:`ConfigError`), and every later assignment is checked as Hydra's is."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError("resolved config", str(path), f"a config file the runner wrote ({first_line(exc)})") from None
    if not isinstance(data, dict):
        raise ConfigError("resolved config", str(path), "a config file the runner wrote (a mapping of keys)")
    try:
        return freeze(cast(RunnerConfig, OmegaConf.merge(OmegaConf.structured(RunnerConfig), data)))
    except OmegaConfBaseException as exc:
        key = str(getattr(exc, "full_key", "") or "resolved config")
        typed = wrong_type(exc)
        raise config_error_line(f"{typed} (in {path})" if typed else f"{key}: {first_line(exc)} (in {path})",
                                key) from None


def register_schemas() -> None:
    """Register the root schema; ``conf/config.yaml`` names it first, so every group merges onto it."""
    ConfigStore.instance().store(name="runner_schema", node=RunnerConfig)


def freeze(cfg: RunnerConfig) -> RunnerConfig:
    """``cfg`` made read-only: an assignment while the job runs fails instead of changing what every later
    reader sees (the driver's config once the job's place is known, every agent's and worker's)."""
    OmegaConf.set_readonly(cast(Any, cfg), True)  # the schema-typed config is an OmegaConf node
    return cfg
