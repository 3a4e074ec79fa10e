"""Schema of what is trained and where: the model and its tables, the sharding policy, the cluster.

Every field's docstring gives its unit, default and range; ``python -m runner --cfg job`` shows the values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from runner.config.choices import one_of, some_of
from runner.config.model_families import FAMILIES
from runner.config.proposers import BALANCED_STARTS, PROPOSERS
from runner.config.reservations import RESERVATIONS

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
