"""Typed configuration schema: the single source of truth for every key.

The root dataclass is registered in Hydra's ConfigStore as ``runner_schema`` and named first in
``conf/config.yaml``'s defaults list, so every group's YAML file merges onto its typed node. A value of the
wrong type fails while Hydra composes; ranges and cross-key rules are checked by :func:`validate`
before anything is launched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

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
SPARSE_OPTIMIZERS = ("rowwise_adagrad", "adagrad", "sgd")
DENSE_OPTIMIZERS = ("adam", "adagrad", "sgd")
AUTOCAST_DTYPES = ("bfloat16",)
DEVICES = ("auto", "cpu", "cuda")
STORAGE_POLICIES = ("heuristic", "fixed")


@dataclass
class TableSchema:
    name: str = MISSING
    """Table name; its feature is named ``<name>_id``."""
    num_embeddings: int = MISSING
    """Rows (hash size) of the table; ids are drawn in [0, num_embeddings)."""


@dataclass
class ModelSchema:
    name: str = "dlrm"
    """Model family. Only ``dlrm`` (TorchRec's DLRM with dot interaction) so far."""
    embedding_dim: int = 64
    """Width of every embedding table (DLRM's dot interaction needs one shared width)."""
    tables: List[TableSchema] = field(default_factory=list)
    """Sparse features, one embedding table each."""
    dense_arch_layer_sizes: List[int] = field(default_factory=lambda: [64, 64])
    """Bottom MLP widths; the last must equal ``embedding_dim``."""
    over_arch_layer_sizes: List[int] = field(default_factory=lambda: [64, 32, 1])
    """Top MLP widths; the last must be 1 (one logit)."""


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


@dataclass
class OptimizerSchema:
    name: str = "rowwise_adagrad_adam"
    """Preset name, for display."""
    sparse: str = "rowwise_adagrad"
    """Fused optimizer for embedding tables, applied in backward by FBGEMM:
    ``rowwise_adagrad`` | ``adagrad`` | ``sgd`` (the ones FBGEMM's CPU build runs)."""
    sparse_lr: float = 0.05
    """Learning rate of the sparse optimizer."""
    sparse_eps: float = 1e-8
    """Epsilon of the (row-wise) Adagrad sparse optimizer."""
    dense: str = "adam"
    """Optimizer of the dense (MLP) parameters: ``adam`` | ``adagrad`` | ``sgd``."""
    dense_lr: float = 1e-3
    """Learning rate of the dense optimizer."""
    dense_weight_decay: float = 0.0
    """L2 weight decay of the dense optimizer."""


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


@dataclass
class PrecisionSchema:
    name: str = "fp32"
    """Preset name, for display."""
    autocast: Optional[str] = None
    """Autocast dtype for the dense part: null (fp32) | ``bfloat16``."""


@dataclass
class DataSchema:
    name: str = "synthetic"
    """Data source. Only ``synthetic`` so far: learnable labels that depend on ids and dense features."""
    num_dense_features: int = 13
    """Dense (continuous) features per sample."""
    eval_batches: int = 8
    """Held-out batches per rank for evaluation."""
    label_noise: float = 0.5
    """Temperature of the label model: larger means noisier labels (lower reachable AUC)."""


@dataclass
class TrainSchema:
    steps: int = 200
    """Training steps (batches per rank)."""
    batch_size: int = 256
    """Samples per rank per step."""
    log_every: int = 20
    """Steps between logged training metrics."""
    seed: int = 0
    """Seed of the model initialisation and the synthetic data."""
    threads_per_worker: Optional[int] = None
    """torch intra-op threads per worker (default: CPU cores / workers on this host, at least 1)."""


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
    model: ModelSchema = field(default_factory=ModelSchema)
    sharding: ShardingSchema = field(default_factory=ShardingSchema)
    optimizer: OptimizerSchema = field(default_factory=OptimizerSchema)
    cluster: ClusterSchema = field(default_factory=ClusterSchema)
    precision: PrecisionSchema = field(default_factory=PrecisionSchema)
    data: DataSchema = field(default_factory=DataSchema)
    train: TrainSchema = field(default_factory=TrainSchema)
    tracking: TrackingSchema = field(default_factory=TrackingSchema)


def register_schemas() -> None:
    """Register the root schema; ``conf/config.yaml`` names it first, so every group merges onto it."""
    ConfigStore.instance().store(name="runner_schema", node=RunnerConfig)


class ConfigError(ValueError):
    """A config value outside what is allowed; ``str()`` is the one-line message users see."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        super().__init__(f"{key}={value!r} is not allowed; expected {allowed}")
        self.key = key


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(key, value, allowed)


def _check_choices(key: str, values: Any, choices: tuple) -> None:
    for v in values:
        _check(v in choices, key, v, "one of " + ", ".join(choices))


def _validate_model(m: Any) -> None:
    _check(m.name == "dlrm", "model.name", m.name, "dlrm")
    _check(m.embedding_dim > 0, "model.embedding_dim", m.embedding_dim, "a positive integer")
    _check(len(m.tables) > 0, "model.tables", list(m.tables), "at least one table")
    names = [tb.name for tb in m.tables]
    _check(len(set(names)) == len(names), "model.tables", names, "unique table names")
    for i, tb in enumerate(m.tables):
        _check(tb.num_embeddings > 0, f"model.tables[{i}].num_embeddings", tb.num_embeddings, "> 0")
    _check(
        len(m.dense_arch_layer_sizes) > 0 and m.dense_arch_layer_sizes[-1] == m.embedding_dim,
        "model.dense_arch_layer_sizes", list(m.dense_arch_layer_sizes),
        f"a list ending with model.embedding_dim ({m.embedding_dim})",
    )
    _check(
        len(m.over_arch_layer_sizes) > 0 and m.over_arch_layer_sizes[-1] == 1,
        "model.over_arch_layer_sizes", list(m.over_arch_layer_sizes), "a list ending with 1",
    )


def _validate_sharding(s: Any) -> None:
    _check_choices("sharding.types", s.types, SHARDING_TYPES)
    _check_choices("sharding.compute_kernels", s.compute_kernels, COMPUTE_KERNELS)
    _check(0.0 <= s.storage_reserve_percent < 1.0, "sharding.storage_reserve_percent",
           s.storage_reserve_percent, "a fraction in [0, 1)")
    _check_choices("sharding.storage_reserve_policy", [s.storage_reserve_policy], STORAGE_POLICIES)
    _check(s.planner_batch_size is None or s.planner_batch_size > 0, "sharding.planner_batch_size",
           s.planner_batch_size, "null or a positive integer")


def _validate_optimizer(o: Any) -> None:
    _check_choices("optimizer.sparse", [o.sparse], SPARSE_OPTIMIZERS)
    _check_choices("optimizer.dense", [o.dense], DENSE_OPTIMIZERS)
    for key in ("sparse_lr", "dense_lr", "sparse_eps"):
        _check(getattr(o, key) > 0, f"optimizer.{key}", getattr(o, key), "a positive number")
    _check(o.dense_weight_decay >= 0, "optimizer.dense_weight_decay", o.dense_weight_decay, ">= 0")


def _validate_cluster(c: Any) -> None:
    _check(c.nodes >= 1, "cluster.nodes", c.nodes, "an integer >= 1")
    _check(c.workers_per_node >= 1, "cluster.workers_per_node", c.workers_per_node, "an integer >= 1")
    _check_choices("cluster.device", [c.device], DEVICES)
    for key in ("intra_node_bandwidth", "cross_node_bandwidth"):
        _check(getattr(c, key) > 0, f"cluster.{key}", getattr(c, key), "a positive bandwidth in GiB/s")
    for key in ("hbm_cap_gib", "ddr_cap_gib"):
        v = getattr(c, key)
        _check(v is None or v > 0, f"cluster.{key}", v, "null or a positive size in GiB")
    _check(c.master_port is None or 0 < c.master_port < 65536, "cluster.master_port", c.master_port,
           "null or a port in 1..65535")
    _check(c.node_rank is None or 0 <= c.node_rank < c.nodes, "cluster.node_rank", c.node_rank,
           f"null or an integer in [0, cluster.nodes={c.nodes})")
    _check(c.pg_timeout_s > 0, "cluster.pg_timeout_s", c.pg_timeout_s, "a positive number of seconds")
    _check(c.max_restarts >= 0, "cluster.max_restarts", c.max_restarts, "an integer >= 0")


def _validate_run(p: Any, d: Any, t: Any) -> None:
    _check(p.autocast is None or p.autocast in AUTOCAST_DTYPES, "precision.autocast", p.autocast,
           "null or one of " + ", ".join(AUTOCAST_DTYPES))
    _check(d.name == "synthetic", "data.name", d.name, "synthetic")
    _check(d.num_dense_features > 0, "data.num_dense_features", d.num_dense_features, "a positive integer")
    _check(d.eval_batches > 0, "data.eval_batches", d.eval_batches, "a positive integer")
    _check(d.label_noise > 0, "data.label_noise", d.label_noise, "a positive number")
    for key in ("steps", "batch_size", "log_every"):
        _check(getattr(t, key) > 0, f"train.{key}", getattr(t, key), "a positive integer")
    _check(t.threads_per_worker is None or t.threads_per_worker > 0, "train.threads_per_worker",
           t.threads_per_worker, "null or a positive integer")


def validate(cfg: Any) -> None:
    """Check ranges and cross-key rules of a composed config; raise :class:`ConfigError` on the first."""
    _validate_model(cfg.model)
    _validate_sharding(cfg.sharding)
    _validate_optimizer(cfg.optimizer)
    _validate_cluster(cfg.cluster)
    _validate_run(cfg.precision, cfg.data, cfg.train)
