"""Typed configuration schema: the single source of truth for every key.

The root dataclass is registered in Hydra's ConfigStore as ``runner_schema`` and named first in
``conf/config.yaml``'s defaults list, so every group's YAML file merges onto its typed node. A value of the
wrong type fails while Hydra composes; ranges and cross-key rules are checked by
:func:`runner.validation.validate` before anything is launched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

SHARDING_TYPES = (
    "data_parallel",
    "table_wise",
    "column_wise",
    "table_column_wise",
    "row_wise",
    "table_row_wise",
    "grid_shard",
)
COMPUTE_KERNELS = ("dense", "fused", "fused_uvm", "fused_uvm_caching", "key_value")
SPARSE_OPTIMIZERS = ("rowwise_adagrad", "adagrad", "sgd", "adam", "lamb", "partial_rowwise_adam",
                     "partial_rowwise_lamb")
SPARSE_OPTIMIZERS_CPU = ("rowwise_adagrad", "adagrad", "sgd")
DENSE_OPTIMIZERS = ("adam", "adamw", "adagrad", "sgd")
SCHEDULES = ("constant", "exp_decay", "steps", "cosine")
AUTOCAST_DTYPES = ("bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
STORAGE_POLICIES = ("heuristic", "fixed")
PROPOSERS = ("default", "dynamic_programming", "greedy", "grid_search", "uniform")
MODES = ("train", "plan", "write_data")
MODEL_FAMILIES = ("dlrm", "dcn", "deepfm", "dnn", "mmoe")
DATA_SOURCES = ("synthetic", "parquet", "criteo")
ONE_WIDTH_FAMILIES = ("dlrm", "dcn", "deepfm")


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
    family: str = "dlrm"
    """``dlrm`` (TorchRec's DLRM, dot interaction) | ``dcn`` (TorchRec's DLRM with a DCN-v2 cross
    network) | ``deepfm`` (TorchRec's DeepFM) | ``dnn`` (pooled embeddings of any widths concatenated
    with the dense MLP's output, then the over MLP). All but ``dnn`` need one width for every table."""
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

    sharding_types: Optional[List[str]] = None
    """Sharding types allowed for this table (overrides ``sharding.types``)."""
    compute_kernels: Optional[List[str]] = None
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
    types: List[str] = field(default_factory=list)
    """Sharding types allowed for every table (empty: the planner chooses among all)."""
    compute_kernels: List[str] = field(default_factory=list)
    """Compute kernels allowed (empty: the device's defaults; on CPU ``fused``/``dense``)."""
    storage_reserve_percent: float = 0.15
    """Fraction (0..1) of every device's memory the planner keeps free for non-embedding use."""
    storage_reserve_policy: str = "heuristic"
    """``heuristic`` (TorchRec's estimate of dense parameters and activations, plus the percent) or
    ``fixed`` (exactly the percent)."""
    planner_batch_size: Optional[int] = None
    """Per-rank batch size the planner assumes for its estimates (default: ``train.batch_size``)."""
    constraints: Dict[str, Any] = field(default_factory=dict)
    """Per-table constraints (fields of :class:`TableConstraintSchema`), e.g.
    ``+sharding.constraints.t0.sharding_types=[row_wise]``."""
    proposer: str = "default"
    """``default`` (TorchRec's: grid search, greedy, uniform) | ``dynamic_programming`` | ``greedy`` |
    ``grid_search`` | ``uniform``."""
    dp_hbm_bins: int = 100
    """HBM bins per device of the dynamic-programming proposer (its precision)."""
    grid_max_proposals: int = 10000
    """Proposals the grid-search proposer may try before it gives up."""
    planner_timeout_s: Optional[int] = None
    """Stop proposing after this many seconds and keep the best plan so far (null: no limit)."""
    plan: Optional[str] = None
    """Path of a ``plan.json`` written by an earlier run: reuse that plan exactly instead of planning."""


@dataclass
class ScheduleSchema:
    name: str = "constant"
    """``constant`` | ``exp_decay`` | ``steps`` | ``cosine``; all after ``warmup_steps`` of linear warm-up."""
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
    kind: str = "none"
    """Gradient clipping of the dense parameters: ``none`` | ``norm`` | ``value``."""
    max: float = 1.0
    """Largest total L2 norm (``norm``) or absolute value (``value``) of the dense gradients."""


@dataclass
class OptimizerSchema:
    name: str = "rowwise_adagrad_adam"
    """Preset name, for display."""
    sparse: str = "rowwise_adagrad"
    """Fused optimizer of the embedding tables, applied inside backward by FBGEMM: ``rowwise_adagrad`` |
    ``adagrad`` | ``sgd`` (CPU and GPU) | ``adam`` | ``lamb`` | ``partial_rowwise_adam`` |
    ``partial_rowwise_lamb`` (GPU only: FBGEMM's CPU build does not run them)."""
    sparse_lr: float = 0.05
    """Base learning rate of the sparse optimizer."""
    sparse_eps: float = 1e-8
    """Epsilon of the sparse optimizer (Adagrad and Adam families)."""
    sparse_weight_decay: float = 0.0
    """Weight decay of the sparse optimizer."""
    sparse_weight_decay_mode: str = "l2"
    """How FBGEMM applies ``sparse_weight_decay``: ``l2`` (added to the gradient) | ``decoupled``."""
    sparse_schedule: ScheduleSchema = field(default_factory=ScheduleSchema)
    """Learning-rate schedule of the sparse optimizer."""
    dense: str = "adam"
    """Optimizer of the dense (MLP) parameters: ``adam`` | ``adamw`` | ``adagrad`` | ``sgd``."""
    dense_lr: float = 1e-3
    """Base learning rate of the dense optimizer."""
    dense_eps: float = 1e-8
    """Epsilon of the dense optimizer (Adam, AdamW, Adagrad)."""
    dense_weight_decay: float = 0.0
    """Weight decay of the dense optimizer (decoupled for ``adamw``, L2 otherwise)."""
    dense_momentum: float = 0.0
    """Momentum of ``sgd`` (Nesterov off)."""
    dense_schedule: ScheduleSchema = field(default_factory=ScheduleSchema)
    """Learning-rate schedule of the dense optimizer."""
    clip: ClipSchema = field(default_factory=ClipSchema)
    """Gradient clipping of the dense parameters (embedding gradients are applied inside backward)."""


@dataclass
class ClusterSchema:
    name: str = "local"
    """Preset name, for display."""
    nodes: int = 1
    """Number of nodes (hosts). On one host, nodes > 1 are emulated by one elastic agent each."""
    workers_per_node: int = 2
    """Worker processes per node (one per GPU with CUDA)."""
    device: str = "auto"
    """``auto`` (CUDA when present, else CPU) | ``cpu`` | ``cuda``."""
    hbm_cap_gib: Optional[float] = None
    """Accelerator memory per worker, GiB, that the planner may use (default: TorchRec's 32 GiB)."""
    ddr_cap_gib: Optional[float] = None
    """Host memory per worker, GiB, that the planner may use (default: TorchRec's 128 GiB)."""
    intra_node_bandwidth: float = 600.0
    """Bandwidth between workers of one node, GiB/s (TorchRec's default 600)."""
    cross_node_bandwidth: float = 12.5
    """Bandwidth between nodes, GiB/s per worker (TorchRec's default 12.5)."""
    master_addr: str = "127.0.0.1"
    """Rendezvous host (node 0's address on a real cluster)."""
    master_port: Optional[int] = None
    """Rendezvous port (default: a free port on this host)."""
    node_rank: Optional[int] = None
    """This host's node rank on a real multi-node job. Unset: all nodes run on this host."""
    pg_timeout_s: int = 300
    """Process-group (collective) timeout, seconds."""
    max_restarts: int = 0
    """How many times torch elastic restarts the workers after a worker fails."""
    start_method: str = "auto"
    """How agents start workers: ``fork`` (workers inherit the agent's imports: faster start-up) |
    ``spawn`` (fresh interpreters) | ``auto`` (fork for CPU workers, spawn for CUDA workers)."""
    cpu_affinity: str = "auto"
    """``auto``: bind each CPU worker to its own slice of the host's cores (none when the host has fewer
    cores than workers) | ``none``: let the kernel move workers between cores."""


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
    autocast: Optional[str] = None
    """Autocast dtype for the dense part: null (fp32) | ``bfloat16`` | ``float16`` (with loss scaling)."""
    grad_scaler: GradScalerSchema = field(default_factory=GradScalerSchema)
    """Loss scaling for fp16 autocast; the embeddings' fused optimizer gets unscaled gradients."""
    embedding_dtype: str = "fp32"
    """Storage type of the embedding tables: ``fp32`` | ``fp16`` (half the memory; FBGEMM's kernels
    compute in fp32 and round the stored rows)."""
    qcomm_forward: Optional[str] = None
    """Quantised communication of the sharded embeddings' forward collectives: null | ``fp16`` | ``bf16``."""
    qcomm_backward: Optional[str] = None
    """Quantised communication of the backward (gradient) collectives: null | ``fp16`` | ``bf16``."""
    tf32: bool = False
    """Allow TF32 matmuls and convolutions on CUDA (Ampere and newer); refused on CPU."""


@dataclass
class DataSchema:
    name: str = "synthetic"
    """Data source: ``synthetic`` (generated; learnable labels that depend on ids and dense features) |
    ``parquet`` (a folder of Parquet files) | ``criteo`` (Criteo click-log TSV files)."""
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
    best_metric: Optional[str] = "eval/auc"
    """Eval metric that picks the best checkpoint (each checkpoint is evaluated); null: no best."""
    best_mode: str = "max"
    """``max`` | ``min``: whether a larger or a smaller ``best_metric`` is better."""
    dir: Optional[str] = None
    """Folder of the checkpoints (default: ``<run folder>/checkpoints``)."""


@dataclass
class TrainSchema:
    steps: int = 200
    """Training steps (batches per rank)."""
    batch_size: int = 256
    """Samples per rank per micro-batch (per step when ``grad_accumulation_steps`` is 1)."""
    pipeline: str = "sparse_dist"
    """Training step: ``sparse_dist`` (TorchRec's ``TrainPipelineSparseDist``: the next batch's input
    dist overlaps this step's compute on GPUs) | ``base`` (TorchRec's ``TrainPipelineBase``: one step
    after the other; on CPU both measure the same). Accumulation and fp16 loss scaling use the split step."""
    grad_accumulation_steps: int = 1
    """Micro-batches per optimizer step: a step sees ``batch_size * grad_accumulation_steps`` samples
    per rank, with the dense part's activations of one micro-batch at a time (same result as the larger
    batch; embeddings are looked up and updated once per step)."""
    log_every: int = 50
    """Steps between logged training metrics."""
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


@dataclass
class TrackingSchema:
    uri: Optional[str] = None
    """MLflow tracking URI. Default: $MLFLOW_TRACKING_URI, else sqlite:///<project>/mlflow.db."""
    experiment: str = "runner"
    """MLflow experiment name."""
    run_name: Optional[str] = None
    """MLflow run name (default: the config choices, e.g. ``dlrm-rowwise-local``)."""


@dataclass
class RunnerConfig:
    mode: str = "train"
    """``train`` (launch workers) | ``plan`` (plan and log in this process only; any cluster) |
    ``write_data`` (write the synthetic source for this model as Parquet to ``data.path``)."""
    model: ModelSchema = field(default_factory=ModelSchema)
    sharding: ShardingSchema = field(default_factory=ShardingSchema)
    optimizer: OptimizerSchema = field(default_factory=OptimizerSchema)
    cluster: ClusterSchema = field(default_factory=ClusterSchema)
    precision: PrecisionSchema = field(default_factory=PrecisionSchema)
    data: DataSchema = field(default_factory=DataSchema)
    train: TrainSchema = field(default_factory=TrainSchema)
    tracking: TrackingSchema = field(default_factory=TrackingSchema)


def samples_per_step(cfg: Any) -> int:
    """Rows per rank per optimizer step: ``train.batch_size`` times ``train.grad_accumulation_steps``."""
    return int(cfg.train.batch_size) * int(cfg.train.grad_accumulation_steps)


def loss_scaling_enabled(cfg: Any) -> bool:
    """``precision.grad_scaler.enabled``, whose null means: on with float16 autocast."""
    enabled = cfg.precision.grad_scaler.enabled
    return cfg.precision.autocast == "float16" if enabled is None else bool(enabled)


def uses_split_step(cfg: Any) -> bool:
    """Gradient accumulation and loss scaling train with the split step (``runner/steps.py``), which
    needs every table sharded by TorchRec: no ``data_parallel`` tables."""
    return cfg.train.grad_accumulation_steps > 1 or loss_scaling_enabled(cfg)


def register_schemas() -> None:
    """Register the root schema; ``conf/config.yaml`` names it first, so every group merges onto it."""
    ConfigStore.instance().store(name="runner_schema", node=RunnerConfig)
