"""``mode=calibrate``: what every rank measures, at once as a job runs, and one rank's part of the run. The parts
timed alone: collectives by message size in each scope, FBGEMM's embedding kernel (and its UVM-caching one on a
GPU), sharded lookups of each family, linear layers, the configured model's dense part, its optimizer and input.
Last, the configured job itself with every table tiny, trained by the runner's own loop, so that what its step takes
beyond every part measured alone (the loop, the pipeline, the model's wrappers) can be read off
(:func:`runner.plan.cost.fit.step_overhead`). Rank 0 gathers the measurements, fits them and writes the
calibration file and its report (:mod:`runner.plan.cost.fit`, :mod:`runner.plan.cost.calibration`), and logs them.
A training job times its own dense part here too (:func:`job_dense_ms`).

Every measurement is one warm-up and ``repeats`` timed runs, each synchronised with the device, as lists of ms.
Every rank measures at once, as in a job (the ranks share the host's cores and links as training does).

One concept: the measuring a calibration is fitted from, on the job's workers: each part's samples, the phases
that take them over the grid, and the run that orders the phases and gathers what every rank measured. The fit,
the file and their use are the planner's (:mod:`runner.plan.cost`).
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union, cast

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.datasets.utils import Batch
from torchrec.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, data_parallel, row_wise, table_wise
from torchrec.distributed.types import ShardingPlan
from torchrec.distributed.utils import optimizer_type_to_emb_opt_type
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from runner.config.schema import CalibrateSchema, OptimizerSchema, PrecisionSchema, RunnerConfig, uses_split_step
from runner.config.tables import table_specs
from runner.data.layout import job_data
from runner.data.pipeline import batches_for, source
from runner.plan import (
    PARTS,
    REUSE_ROWS,
    SHARDED_DIM,
    TINY_ROWS,
    allowed_median_error,
    calibrate_results,
    dense_facts,
    make_plan,
    plan_spec,
    sharders_for,
)
from runner.runtime.hardware import fingerprint
from runner.runtime.moved_names import fused_tbe_class, tbe_placement
from runner.track.reporter import Reporter, SilentBar
from runner.train.loop import LoopHooks, device_sync, train
from runner.train.models import autocast_forward, build_model
from runner.train.optimizers import apply_sparse_optimizer, combined_optimizer, dense_optimizer, sparse_optimizer
from runner.train.timing import ExtraBudget, Repeats, forward_backward, timed, together

if TYPE_CHECKING:
    from runner.train.rank_env import RankEnv


KIB, MIB = 1024, 1024**2
COLLECTIVES = ("all_to_all", "all_reduce", "reduce_scatter", "all_gather")
BACK_TO_BACK = 4  # calls timed together for messages up to 1 MiB
DDP_BUCKET = 25 * MIB  # TorchRec's DMP gives DDP bucket_cap_mb=25, so its first bucket is that size too


def ddp_buckets(n: int) -> List[int]:
    """The lengths of DDP's buckets (:data:`DDP_BUCKET` each) of ``n`` float32s."""
    cap = DDP_BUCKET // 4
    return [min(cap, n - start) for start in range(0, n, cap)]


def message_sizes(device_kind: str, grid: str, max_mib: Any) -> List[int]:
    """Bytes per rank: 4 KiB, then x4 up to the largest (64 MiB on CPU, 256 MiB on a GPU: past DDP's 25 MiB bucket,
    so that a job's all-reduce of tens of MiB, a data-parallel table's, is measured, not extrapolated;
    ``grid=small``: 3)."""
    top = int((max_mib if max_mib else (64 if device_kind == "cpu" else 256)) * MIB)
    sizes = [4 * KIB]
    while sizes[-1] * 4 <= top:
        sizes.append(sizes[-1] * 4)
    return [sizes[0], sizes[len(sizes) // 2], sizes[-1]] if grid == "small" else sizes


def scopes(world: int, local: int) -> Dict[str, List[List[int]]]:
    """The groups each scope measures at once: the workers of each node (``intra``), with several nodes the workers
    of one local rank across nodes (``cross``), and with several nodes of several workers every worker (``world``,
    the all-reduce alone: :data:`WORLD_SCOPE`)."""
    nodes = world // local
    out = {"intra": [list(range(n * local, (n + 1) * local)) for n in range(nodes)]} if local > 1 else {}
    if nodes > 1:
        out["cross"] = [list(range(lr, world, local)) for lr in range(local)]
    if nodes > 1 and local > 1:
        out["world"] = [list(range(world))]
    return out


# the collectives measured over every worker where the world is neither one node nor one worker per node: DDP's
# all-reduce of the dense gradients and data-parallel tables spans the world, and scaled from the cross-node pairs as
# a ring's steps would scale it, 2 emulated nodes of 2 on 2 cores put a 2-node data-parallel DCN's all-reduce at
# 74 ms of a step measured at 193 ms, where the estimate came to 137
WORLD_SCOPE = ("all_reduce",)


def collective_samples(name: str, group: Any, size: int, nbytes: int, device: torch.device, repeats: Repeats
                       ) -> List[float]:
    """``name`` over ``group`` (``size`` ranks) with ``nbytes`` per rank in (what TorchRec's comms terms count), ms
    per call: messages up to 1 MiB are timed :data:`BACK_TO_BACK` calls at a time (as a step issues them), so that
    when the ranks leave the barrier is not most of what is timed. The all-to-all, the reduce-scatter (a row-wise
    forward's output) and the all-gather (its backward's: ``nbytes`` gathered, as TorchRec's all-gather term counts
    them; on 2 CPU ranks it moved 1.0 GiB/s where the all-to-all moved 1.8, which TorchRec's fallback gave it) receive
    into a tensor each call allocates, as TorchRec's distributions do (their outputs are new every step); the
    all-reduce works in place and is issued as DDP issues a step's gradients: in its 25 MiB buckets
    (:func:`ddp_buckets`), every bucket's call started before the first is waited for (gloo works on two at once:
    on 2 CPU ranks 50 MiB in two calls at once took 43-49 ms, in one 50-71 ms). Measured here (2 CPU ranks, gloo): into
    a reused tensor a 3 MiB all-to-all took 1.4 ms, into a new one 3.3 ms (a fresh buffer's pages are first touched by
    the collective), so a reused buffer's bandwidth left the embeddings' distributions at half their time."""
    n = max(nbytes // 4 // size * size, size)
    calls = BACK_TO_BACK if nbytes <= MIB else 1
    data = torch.ones(n, device=device)
    if name == "all_to_all":
        def run() -> None:
            for _ in range(calls):
                dist.all_to_all_single(torch.empty_like(data), data, group=group)
    elif name == "all_reduce":
        buckets = data.split(ddp_buckets(n))

        def run() -> None:
            for _ in range(calls):
                for work in [dist.all_reduce(b, group=group, async_op=True) for b in buckets]:
                    work.wait()
    elif name == "reduce_scatter":
        def run() -> None:
            for _ in range(calls):
                dist.reduce_scatter_tensor(torch.empty(n // size, device=device), data, group=group)
    else:  # all_gather: ``nbytes`` gathered, each rank's slice in (TorchRec counts a row-wise backward's output)
        part = data[: n // size]

        def run() -> None:
            for _ in range(calls):
                dist.all_gather_into_tensor(torch.empty(n, device=device), part, group=group)
    # every rank of every group of a scope measures at once, so they agree over the world: each group's samples
    # then have as many repeats as the others'
    return [t / calls for t in timed(run, repeats.with_agree(together(device)), device_sync(device),
                                     lambda: dist.barrier(group=group))]


LARGE_TABLE_ROWS = 2_000_000  # 488 MiB at 64 wide: past a CPU's caches (on this machine's 2 ranks, 977 MiB held)


def kernel_shapes(grid: str, device_kind: str = "cpu", uvm: bool = False) -> List[Dict[str, int]]:
    """Table shapes x lookups the kernel is timed at (rows, dim, ids per sample, batch); on a GPU large enough
    that the bytes, not the launch, set the larger calls' time. But for the UVM-caching kernel (whose cache would
    hold it whole), also a :data:`REUSE_ROWS`-row table at the most ids per sample."""
    dims: Tuple[int, ...] = (16, 128) if grid == "small" else (16, 64, 256)
    rows: Tuple[int, ...] = (20_000,) if grid == "small" else (20_000, 200_000)
    poolings, batches = (1, 8), (256, 2048)
    if device_kind == "cuda":
        rows, poolings, batches = (1_000_000,) if grid == "small" else (100_000, 1_000_000), (1, 32), (2048, 65536)
    shapes = [{"rows": r, "dim": d, "pooling": p, "batch": b}
              for r, d, p, b in itertools.product(rows, dims, poolings, batches)]
    if device_kind != "cuda" and grid != "small" and not uvm:
        # and a table past the caches (the grid's largest is 195 MiB): the kernel's cost by the tables' bytes
        # (:mod:`runner.plan.cost.table_size`)
        shapes += [{"rows": LARGE_TABLE_ROWS, "dim": 64, "pooling": p, "batch": batches[-1]} for p in poolings]
    # and a table whose rows the ids repeat (the most ids): the backward's share paid per distinct row
    # (:func:`runner.plan.cost.fit.fit_kernels`)
    return shapes + ([] if uvm else [{"rows": REUSE_ROWS, "dim": d, "pooling": poolings[-1], "batch": b}
                                     for d, b in itertools.product(dims, batches)])


UVM_CACHE_RATIO = 0.2  # the GPU cache's share of a UVM-caching table's rows (TorchRec's UVM_CACHING_RATIO)


def kernel_samples(shape: Dict[str, int], device: torch.device, sparse_optimizer: Any, repeats: Union[int, Repeats],
                   uvm_caching: bool = False) -> Tuple[List[float], List[float]]:
    """FBGEMM's fused table-batched embedding (TorchRec's ``fused`` kernel; with ``uvm_caching``, its
    ``fused_uvm_caching`` one: rows in host memory, :data:`UVM_CACHE_RATIO` of them cached on the GPU) with the job's
    sparse optimizer fused into its backward: forward and backward ms."""
    cls, kwargs = sparse_optimizer
    tbe = fused_tbe_class()([(shape["rows"], shape["dim"], *tbe_placement(device.type == "cuda", uvm_caching))],
                            **({"cache_load_factor": UVM_CACHE_RATIO} if uvm_caching else {}),
                            optimizer=optimizer_type_to_emb_opt_type(cls), learning_rate=kwargs.get("lr", 0.01),
                            eps=kwargs.get("eps", 1e-8), device=device)
    lookups = shape["batch"] * shape["pooling"]
    ids: List[Any] = [None]  # drawn before each call, the warm-up's too
    offsets = torch.arange(0, lookups + 1, shape["pooling"], device=device)
    grad = torch.ones(shape["batch"], shape["dim"], device=device)

    def fresh() -> None:  # untimed: new ids each call, as each training step brings (the same ids again would
        ids[0] = torch.randint(shape["rows"], (lookups,), device=device)  # find their rows in the caches)
    return forward_backward(lambda: tbe(ids[0], offsets), lambda out: out.backward(grad), repeats,
                            device_sync(device), before=fresh)


class FixedEmbeddings(nn.Module):
    """Stands in for the model's embedding collection: the same pooled widths, given, so that only the dense part
    is timed (its gradient still flows back to the pooled embeddings, as in training)."""

    def __init__(self, ebc: EmbeddingBagCollection, batch: int, device: torch.device) -> None:
        super().__init__()
        self.keys = [f for c in ebc.embedding_bag_configs() for f in c.feature_names]
        self.dims = [c.embedding_dim for c in ebc.embedding_bag_configs() for _ in c.feature_names]
        self.values = torch.randn(batch, sum(self.dims), device=device, requires_grad=True)

    def forward(self, features: KeyedJaggedTensor) -> Any:
        return KeyedTensor(keys=self.keys, length_per_key=self.dims, values=self.values)


def dense_model(model: nn.Module, device: torch.device, batch: int) -> nn.Module:
    """The configured model (``model``, built on ``device``) with its embedding collection replaced by
    :class:`FixedEmbeddings`."""
    for name, module in list(model.named_modules()):
        if isinstance(module, EmbeddingBagCollection):
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            setattr(parent, name.rsplit(".", 1)[-1], FixedEmbeddings(module, batch, device))
    # some of TorchRec's arches make their parameters on the CPU whatever the dense device (DCN's LowRankCrossNet:
    # seen on an H200, "mat2 is on cpu"); in training DMP moves them, here nothing else would
    return model.to(device)


def _dense_at(model: nn.Module, autocast: Optional[str], batch_data: Any, rows: int, device: torch.device
              ) -> Tuple[nn.Module, Batch]:
    """``model`` (the configured model, built on ``device``) as its dense part alone (:func:`dense_model`) with the
    job's autocast, and ``rows`` samples of ``batch_data`` on ``device`` to call it with."""
    model = dense_model(model, device, rows)
    autocast_forward(model, device.type, autocast)
    return model, Batch(dense_features=batch_data.dense_features[:rows], sparse_features=batch_data.sparse_features,
                        labels=batch_data.labels[:rows]).to(device)


def dense_samples(model: nn.Module, autocast: Optional[str], optimizer_cfg: OptimizerSchema, batch_data: Any,
                  rows: int, device: torch.device, repeats: Union[int, Repeats]) -> Dict[str, List[float]]:
    """The dense part's forward, backward and the dense optimizer's step at ``rows`` samples, ms: ``model`` the
    configured model built on ``device``, ``autocast`` and ``optimizer_cfg`` the job's."""
    model, b = _dense_at(model, autocast, batch_data, rows, device)
    optimizer = dense_optimizer(model, optimizer_cfg)
    sync = device_sync(device)
    fwd, bwd = forward_backward(lambda: model(b)[0], lambda loss: loss.backward(), repeats, sync)
    step = timed(optimizer.step, repeats, sync)
    return {"fwd": fwd, "bwd": bwd, "optimizer": step}


LOCKSTEP_ROUNDS = 3  # rounds of the dense part in lockstep at each batch (:func:`lockstep_samples`)
LOCKSTEP_BATCHES = (1, 4)  # the job's batch and 4x: a call's wait beyond the ranks' medians, fixed and per ms
LOCKSTEP_CALLS = (5, 20)  # calls per round, at least and at most ...
LOCKSTEP_ROUND_MS = 1500.0  # ... as many as fit this long a round at the slowest rank's first call
LOCKSTEP_WARM = 3  # untimed calls first


def lockstep_samples(model: nn.Module, autocast: Optional[str], batch_data: Any, rows: int, device: torch.device,
                     rounds: int = LOCKSTEP_ROUNDS) -> Dict[str, List[List[float]]]:
    """The dense part's forward and backward at ``rows`` samples (``model`` the configured model built on
    ``device``), called in lockstep on every rank: each call starts on every rank at once (a barrier), and each
    rank records its own time and the slowest rank's time of the same call (an all-reduce of the largest), ms, per
    round. In a job's step every stretch of compute between two collectives ends when its slowest rank's does, and
    the step is a mean over steps, where every part is timed alone as its median: measured here, two ranks' calls of
    15-29 ms took 1.04-1.15 times their median, four ranks' on two cores 5 ms calls 1.2-1.6 times, 27 ms calls
    1.16-1.22 times (a wait of its own per call beside one that grows with the call:
    :func:`runner.plan.cost.fit.rank_wait`). Every rank makes the same calls: their number is agreed from the
    slowest rank's first call."""
    model, b = _dense_at(model, autocast, batch_data, rows, device)
    sync = device_sync(device)

    def call() -> float:
        dist.barrier()
        sync()
        start = time.perf_counter()
        model(b)[0].backward()
        sync()
        return (time.perf_counter() - start) * 1000.0

    def slowest(ms: float) -> float:
        worst = torch.tensor([ms], dtype=torch.float64, device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        return float(worst.item())
    for _ in range(LOCKSTEP_WARM):  # the allocator, autograd's graph: one warm call leaves the next ones slow
        call()
    first = slowest(call())  # sizes the rounds
    least, most = LOCKSTEP_CALLS
    calls = int(min(max(LOCKSTEP_ROUND_MS / max(first, 1e-3), least), most))
    own: List[List[float]] = []
    worst: List[List[float]] = []
    for _ in range(rounds):
        mine: List[float] = []
        theirs: List[float] = []
        for _ in range(calls):
            ms = call()
            mine.append(ms)
            theirs.append(slowest(ms))
        own.append(mine)
        worst.append(theirs)
    return {"own": own, "slowest": worst}


def job_dense_ms(model: nn.Module, autocast: Optional[str], optimizer_cfg: OptimizerSchema, batch_data: Any,
                 rows: int, device: torch.device) -> Dict[str, float]:
    """A training job's own dense part (``model``, built on ``device``) timed on its worker at its batch before it
    plans (forward, backward and the dense optimizer's step, ms: the median of 5 after warming; every rank at once,
    as in training), for the whole step's estimate. The plan never depends on it (it is the same for every plan)."""
    # a first pass warms what the first steps of a job warm (the allocator, autograd's graph, the optimizer's state),
    # which one warm-up call alone leaves cold: measured at job start, the dense part came out up to a third high
    dense_samples(model, autocast, optimizer_cfg, batch_data, rows, device, 1)
    got = dense_samples(model, autocast, optimizer_cfg, batch_data, rows, device, 5)
    return {f"{k}_ms": float(statistics.median(v)) for k, v in got.items()}


def optimizer_samples(optimizer_cfg: OptimizerSchema, params: int, device: torch.device, repeats: Union[int, Repeats]
                      ) -> List[float]:
    """The dense optimizer's step over ``params`` parameters (in tensors of at most 1 M), ms."""
    holder = nn.Module()
    chunks = [min(1 << 20, params - i) for i in range(0, params, 1 << 20)]
    holder.weights = nn.ParameterList([nn.Parameter(torch.randn(n, device=device)) for n in chunks])
    for p in holder.parameters():
        p.grad = torch.randn_like(p)
    return timed(dense_optimizer(holder, optimizer_cfg).step, repeats, device_sync(device))


def input_samples(batches: Iterator[Any], repeats: int) -> List[float]:
    """A training batch from the data source (``batches``: at least ``repeats`` + 1 of them, built in this thread:
    no prefetch), ms each."""
    return timed(lambda: next(batches), repeats, lambda: None)


SHARDED = ("table_wise", "row_wise", "data_parallel")  # one of each family of TorchRec's sharded lookups


class _Lookup(nn.Module):
    def __init__(self, ebc: EmbeddingBagCollection) -> None:
        super().__init__()
        self.ebc = ebc

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        return self.ebc(features).values()


def sharded_samples(optimizer_cfg: OptimizerSchema, precision: PrecisionSchema, sharding_type: str, world: int,
                    local: int, device: torch.device, tables: int, batches: Tuple[int, ...], repeats: Repeats
                    ) -> Dict[int, Dict[str, List[float]]]:
    """An embedding collection of ``tables`` tiny tables sharded ``sharding_type`` over the job's ranks by TorchRec
    (its input and output distribution, the kernel with the job's fused optimizer, the bookkeeping between):
    forward and backward ms at each per-rank batch of ``batches``. The tables are tiny, so their time is what a
    sharded lookup costs whatever the tables' size (per call and per table), which TorchRec's model leaves out."""
    rows, names = TINY_ROWS * world, [f"t{i}" for i in range(tables)]
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=n, embedding_dim=SHARDED_DIM, num_embeddings=rows,
                                                            feature_names=[n]) for n in names],
                                 device=torch.device("meta"))
    cls, kwargs = sparse_optimizer(optimizer_cfg)
    if sharding_type != "data_parallel":
        apply_optimizer_in_backward(cls, ebc.parameters(), kwargs)
    by_type = {"table_wise": lambda i: table_wise(rank=i % world), "row_wise": lambda i: row_wise(),
            "data_parallel": lambda i: data_parallel()}
    sharder = sharders_for(precision)[0]
    plan = construct_module_sharding_plan(ebc, {n: by_type[sharding_type](i) for i, n in enumerate(names)},
                                          sharder=sharder, local_size=local, world_size=world,
                                          device_type=device.type)
    model = DistributedModelParallel(_Lookup(ebc), device=device, plan=ShardingPlan({"ebc": plan}), sharders=[sharder])
    sync, out = device_sync(device), {}
    for batch in batches:
        features = KeyedJaggedTensor.from_lengths_sync(
            keys=names, values=torch.randint(rows, (batch * tables,), device=device),
            lengths=torch.ones(batch * tables, dtype=torch.int64, device=device))
        fwd, bwd = forward_backward(functools.partial(model, features), lambda y: y.sum().backward(),
                                    repeats.with_agree(together(device)), sync, dist.barrier)
        out[batch] = {"fwd": fwd, "bwd": bwd}
    return out


LINEAR_WIDTHS = (64, 256, 1024)  # square layers whose forward and backward give the dense rate by layer size


def linear_samples(width: int, rows: int, device: torch.device, repeats: Union[int, Repeats]
                   ) -> Dict[str, List[float]]:
    """One ``width`` x ``width`` linear layer (with bias and ReLU, as an MLP's) at ``rows`` samples: forward and
    backward ms."""
    layer = nn.Sequential(nn.Linear(width, width, device=device), nn.ReLU())
    x = torch.randn(rows, width, device=device, requires_grad=True)
    fwd, bwd = forward_backward(lambda: layer(x), lambda y: y.sum().backward(), repeats, device_sync(device))
    return {"fwd": fwd, "bwd": bwd}


# the speed probe's layer width, its samples and its copy's bytes, by device: on a GPU, large enough that the work,
# not the launch, sets the time
PROBE = {"cpu": (512, 512, 32 * MIB), "cuda": (4096, 8192, 1024 * MIB)}


def speed_probe(device: torch.device, repeats: Union[int, Repeats]) -> Dict[str, List[float]]:
    """The machine's speed now, by two fixed workloads that a calibration and every job planned with it time alike
    (every rank at once): a linear layer's forward and backward (``compute``) and a copy (``memory``), of
    :data:`PROBE`'s sizes, ms. A job compares its own with its calibration's
    (:func:`runner.plan.cost.speed.speed_now`): on this 2-core machine two quiet 1 x 2 calibrations 34
    minutes apart measured the embedding kernel's bandwidth 19.7 and 13.4 GiB/s, the all-to-all's 1.64 and 0.99
    GiB/s, and DLRM's dense forward at 256 samples 0.59 and 1.10 ms."""
    width, rows, nbytes = PROBE["cuda" if device.type == "cuda" else "cpu"]
    layer = linear_samples(width, rows, device, repeats)
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    copy = timed(lambda: dst.copy_(src), repeats, device_sync(device))
    return {"compute": [f + b for f, b in zip(layer["fwd"], layer["bwd"], strict=False)], "memory": copy}


# the sharded lookups' small batch, and their table counts beyond one: a model's tens to hundreds of features cost
# per table more than 8 tables show (TorchRec's bookkeeping per feature), so the fit reaches 64
SMALL_BATCH, MANY_TABLES, MOST_TABLES = 64, 8, 64
# the sharded lookups' widest batch, a multiple of the job's (at most WIDE_BATCH): the cost per table and sample read
# off 64 and the job's 256 alone (8 tiny tables, their calls some 0.4 ms apart) came out 0 in two calibrations of 1 x 2
# and 0.29 ms per table and 1,000 samples in a third, which put DLRM's lookup at 8,192 samples 77% over its measurement
LOOKUP_SPAN, WIDE_BATCH = 16, 16384
# the tiny-table job's batches, as multiples of the job's: its overhead grows with the batch (2 x 2 emulated nodes on
# 2 cores: 13, 17 and 27 ms at 64, 256 and 1,024 samples), and a slope read off a quarter and the batch alone, one of
# them disturbed, put it at 69 ms at 1,024 (+82% on the step); a point at 4x spans the batches jobs use
STEP_BATCHES = (0.25, 1, 4)
# the families the tiny-table job is also timed in at the job's batch: what a step takes beyond its parts is not the
# same in each (2 x 2, 256 samples, as jobs: table-wise 12-16 ms beyond its parts, row-wise -2 to +2, data-parallel
# -18 to -2); every batch and family is timed in interleaved rounds (:func:`tiny_job_rounds`), each round's steps a
# warm-up window, then the timed ones
STEP_FAMILIES = ("table_wise", "row_wise", "data_parallel")
ROUND_STEPS = (5, 10)
STEP_ROUNDS = {"small": 3, "full": 6}


def step_batches(batch: int, grid: str) -> List[int]:
    """The per-rank batches the tiny-table job is timed at: :data:`STEP_BATCHES` x ``batch`` (``grid=small``: the
    first two)."""
    span = STEP_BATCHES[:2] if grid == "small" else STEP_BATCHES
    return sorted({max(int(batch * f), 1) for f in span})


def _tiny_job(cfg: RunnerConfig, rank: int, world: int, local: int, device: torch.device, sharding_type: str,
              batch: int, steps: int, log_every: Optional[int] = None) -> Tuple[Any, Any, Any, Any]:
    """The configured job at a per-rank batch of ``batch`` with every table cut to :data:`TINY_ROWS` rows per rank, all
    ``sharding_type``, planned with TorchRec's constants (a job whose embeddings cost next to nothing, so that its
    step is the rest of the step): its config, sharded model, optimizer and ``steps`` batches."""
    rows = TINY_ROWS * world
    tables = [{"name": t.name, "num_embeddings": min(int(t.num_embeddings), rows), "embedding_dim": t.embedding_dim}
              for t in cfg.model.tables]
    small = {"model": {"tables": tables, "generated_tables": {"min_rows": rows, "max_rows": rows}},
             "sharding": {"types": [sharding_type], "constraints": {}, "plan": None}, "train": {
                 "batch_size": batch, "checkpoint": {"enabled": False},
                 **({"log_every": log_every} if log_every else {})}, "cluster": {"calibration": "none"}}
    tiny = cast("RunnerConfig", OmegaConf.merge(cfg, small))
    OmegaConf.set_readonly(cast(Any, tiny), False)
    tiny.sharding.constraints = {}  # replaced, not merged: a table's own constraint would refuse the type
    model = build_model(tiny, device)
    autocast_forward(model, device.type, tiny.precision.autocast)
    apply_sparse_optimizer(model, tiny.optimizer)
    plan, _, _, sharders = make_plan(plan_spec(tiny), model, world, local, device.type, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(module=model, device=device, plan=plan, sharders=sharders,
                                   # as training wraps it: DDP's static graph refuses the split step's no_sync
                                   data_parallel_wrapper=DefaultDataParallelWrapper(
                                       static_graph=tiny.train.grad_accumulation_steps == 1))
    batches = batches_for(job_data(tiny), rank, world, False, 0, steps,
                          low_loops=tiny.cluster.gloo_loop_priority == "low")
    return tiny, dmp, combined_optimizer(dmp, tiny.optimizer), batches


def _trained_ms(tiny: Any, dmp: Any, optimizer: Any, batches: Any, steps: int, device: torch.device
                ) -> Tuple[float, int]:
    """``steps`` steps of a tiny-table job by the runner's own loop: its timed windows' step, ms, and the steps it
    ran (fewer where the data ended)."""
    result = train(dmp, optimizer, batches, 0, steps, device, tiny.train, tiny.optimizer, list(tiny.model.tasks),
                   LoopHooks(lambda step, metrics: None, SilentBar()), None)
    return result.step_time_ms, result.last_step


def tiny_job_rounds(make: Callable[[str, int, int, int], Tuple[Any, Any, Any, Any]], runs: Sequence[Tuple[str, int]],
                    device: torch.device, rounds: int, say: Optional[Callable[[str, int, int], None]] = None
                    ) -> Dict[Tuple[str, int], List[float]]:
    """The tiny-table job (``make(family, batch, batches, log_every)``: :func:`_tiny_job`) in each of ``runs`` (its
    family and per-rank batch), interleaved:
    ``rounds`` rounds, each training every run's job :data:`ROUND_STEPS` steps in turn (the order turned by one
    each round), so that the machine's drift falls alike on the runs of a round. Here its speed wanders by 8% over
    seconds, and the job timed once per batch gave an overhead of 5.5 to 17.9 ms at 256 samples in four 2 x 2
    calibrations within ten minutes: per run, its step in each round, ms
    (:func:`runner.plan.cost.fit.step_overhead` takes each run's median, and the families' differences round by
    round)."""
    warm, timed_steps = ROUND_STEPS
    per_call = warm + timed_steps
    # each call's pipeline takes batches ahead of its steps and drops them when it ends: a few spare per call
    jobs: Dict[Tuple[str, int], Tuple[Any, Any, Any, Any]] = {}
    got: Dict[Tuple[str, int], List[float]] = {run: [] for run in runs}
    order = list(runs)
    try:
        for run in runs:
            jobs[run] = make(run[0], run[1], (per_call + 4) * rounds, warm)
        for i in range(rounds):
            for run in order[i % len(order):] + order[:i % len(order)]:
                tiny, dmp, optimizer, batches = jobs[run]
                # each call warms a pipeline of its own over ``warm`` steps (its first window, not timed)
                ms, done = _trained_ms(tiny, dmp, optimizer, batches, per_call, device)
                if done < per_call:  # a file source's shard ended: the rounds every run finished are kept
                    return {r: v[:i] for r, v in got.items()}
                got[run].append(ms)
            if say is not None:
                say("the job's step with tiny tables, each batch and family in turn", i + 1, rounds)
    finally:
        for _, _, _, batches in jobs.values():
            getattr(batches, "close", lambda: None)()
    return got


class _Progress:
    """Rank 0's progress line, at most every ``every_s`` seconds and at each phase's start."""

    def __init__(self, active: bool, every_s: float = 5.0) -> None:
        self.active, self.every_s, self.last, self.t0 = active, every_s, 0.0, time.perf_counter()

    def __call__(self, phase: str, done: int, of: int, force: bool = False) -> None:
        now = time.perf_counter()
        if self.active and (force or now - self.last >= self.every_s):
            self.last = now
            print(f"[runner] calibrate: {phase} {done} of {of} ({now - self.t0:.0f} s)", flush=True)


FLOOR_SHARE = 0.125  # of calibrate.max_extra_s, kept for each part still to be measured (:class:`ExtraTime`)


class ExtraTime:
    """``calibrate.max_extra_s``: the seconds the extra rounds of repeats take (the first ``calibrate.repeats`` of
    each point not counted), shared by the parts in the order they are measured (collectives, kernels, sharded
    lookups, the dense part): a part may take what the parts before it left, less a floor (:data:`FLOOR_SHARE` of
    it) kept for each part still to come, and never less than that floor. An equal share each left a scattered part
    short while the steady ones used a fraction of theirs: beside a busy process on 1 x 2, the collectives' share ran
    out in their third collective, the fourth's points kept their first 7 repeats (known to 29-55%), and the part was
    known to 12.0% where 11.8% was allowed, while the kernels, sharded lookups and dense part took none of their
    extra repeats."""

    def __init__(self, c: CalibrateSchema, parts: int = len(PARTS)) -> None:
        self.c, self.parts, self.used, self.spent = c, parts, 0, [0.0]

    def repeats(self) -> Repeats:
        """The next part's repeats (:class:`Repeats`): ``calibrate.repeats``, more while a point's median is known
        less well than ``calibrate.max_spread`` allows at ``calibrate.repeats`` (:func:`allowed_median_error`), up
        to ``calibrate.max_repeats``, while the extra rounds of this and the earlier parts have taken less than this
        part's share allows."""
        c = self.c
        floor = c.max_extra_s * FLOOR_SHARE
        self.used += 1
        later = max(self.parts - self.used, 0)
        until = max(c.max_extra_s - floor * later, self.spent[0] + floor)
        return Repeats(c.repeats, max(c.max_repeats, c.repeats), allowed_median_error(c.max_spread, c.repeats),
                       math.inf, budget=ExtraBudget(self.spent, until))


def _collectives(c: CalibrateSchema, env: RankEnv, device: torch.device, say: _Progress, repeats: Repeats
                 ) -> Dict[str, Any]:
    """Every collective at every size, in each scope; this rank's samples (ranks outside a group: none)."""
    sizes = message_sizes(device.type, c.grid, c.max_message_mib)
    out: Dict[str, Any] = {name: {} for name in COLLECTIVES}
    for scope, groups in scopes(env.world, env.local_world).items():
        made = [(members, dist.new_group(members)) for members in groups]  # every rank makes every group
        members, group = next((m, g) for m, g in made if env.rank in m)
        names = WORLD_SCOPE if scope == "world" else COLLECTIVES
        for i, name in enumerate(names):
            say("collectives (every worker)" if scope == "world" else f"collectives ({scope}-node)", i, len(names),
                force=i == 0)
            out[name][scope] = {n: collective_samples(name, group, len(members), n, device, repeats) for n in sizes}
        dist.barrier()
    return out


def _kernels(c: CalibrateSchema, optimizer: OptimizerSchema, device: torch.device, say: _Progress, repeats: Repeats,
             uvm: bool = False) -> List[Dict[str, Any]]:
    """The embedding kernel's samples over the grid's shapes; ``uvm``: the UVM-caching kernel's, on a GPU (none
    where FBGEMM's build cannot run it here: the calibration then keeps TorchRec's host-to-GPU bandwidth, and its
    report says so)."""
    shapes, out = kernel_shapes(c.grid, device.type, uvm), []
    for i, shape in enumerate(shapes):
        say("UVM-caching kernels" if uvm else "embedding kernels", i, len(shapes), force=i == 0)
        try:
            fwd, bwd = kernel_samples(shape, device, sparse_optimizer(optimizer), repeats, uvm)
        except Exception as exc:  # noqa: BLE001 - a build without UVM: the rest of the calibration stands
            if not uvm:
                raise
            print(f"[runner] calibrate: the UVM-caching kernel did not run here ({type(exc).__name__}): TorchRec's "
                  "host-to-GPU bandwidth is kept", flush=True)
            return []
        out.append({"shape": shape, "fwd": fwd, "bwd": bwd})
    return out


def _sharded(batch_size: int, optimizer: OptimizerSchema, precision: PrecisionSchema, repeats: Repeats, env: RankEnv,
             device: torch.device, say: _Progress) -> Dict[str, Any]:
    """Each family of sharded lookup over every rank: one and :data:`MANY_TABLES` tiny tables, each at a small
    batch, the job's (``batch_size``) and :data:`LOOKUP_SPAN` times it (the cost per call, per table and per table and
    sample, the last read over the batches jobs use), and :data:`MOST_TABLES` at the small batch."""
    small, job = SMALL_BATCH, max(batch_size, 2 * SMALL_BATCH)
    span = tuple(sorted({small, job, max(job, min(LOOKUP_SPAN * job, WIDE_BATCH))}))
    out = {}
    for i, kind in enumerate(SHARDED):
        say("sharded lookups", i, len(SHARDED), force=i == 0)
        out[kind] = {n: sharded_samples(optimizer, precision, kind, env.world, env.local_world, device, n, batches,
                                        repeats)
                     for n, batches in ((1, span), (MANY_TABLES, span), (MOST_TABLES, (small,)))}
    return out


def _dense(cfg: RunnerConfig, env: RankEnv, device: torch.device, say: _Progress, repeats: Repeats) -> Dict[str, Any]:
    """The dense part at the job's batch, a half and a quarter of it; the optimizer over the dense parameters,
    4x and 16x as many; a batch from the source at the job's batch and a quarter of it."""
    whole = job_data(cfg)  # the job's data part: its rows per rank per step, its source
    rows = whole.rows
    say("dense part", 0, 3, force=True)
    # also at the tiny-table job's batches (its overhead is what its step takes beyond these): a batch that large
    steps = step_batches(cfg.train.batch_size, cfg.calibrate.grid)
    data = next(iter(source(replace(whole, rows=max(steps[-1], rows * max(LOCKSTEP_BATCHES))), env.rank, env.world,
                            False, 0, 1)))
    dense = {r: dense_samples(build_model(cfg, device), cfg.precision.autocast, cfg.optimizer, data, r, device,
                              repeats) for r in sorted({max(rows // 4, 1), max(rows // 2, 1), rows, *steps})}
    facts = dense_facts(build_model(cfg, torch.device("meta")), rows)
    params = facts.params
    widths = LINEAR_WIDTHS[:2] if cfg.calibrate.grid == "small" else LINEAR_WIDTHS
    linear = {w: {r: linear_samples(w, r, device, repeats) for r in (max(rows // 4, 1), rows)}
              for w in widths}
    # after the parts whose extra repeats share one budget (:class:`ExtraTime`): it takes a fixed number of calls
    say("dense part in lockstep", 0, 3, force=True)
    lockstep = {rows * k: lockstep_samples(build_model(cfg, device), cfg.precision.autocast, data, rows * k, device)
                for k in LOCKSTEP_BATCHES}
    say("dense optimizer", 1, 3, force=True)
    # up to 16 M parameters: data-parallel tables are the dense optimizer's too, and past the caches its rate per
    # parameter is memory's, not the small dense part's
    sizes = (params, 16 * params) if cfg.calibrate.grid == "small" else (params, 16 * params, 1 << 22, 1 << 24)
    optimizer = {n: optimizer_samples(cfg.optimizer, n, device, repeats) for n in sorted(set(sizes))}
    say("input", 2, 3, force=True)
    n = cfg.calibrate.repeats
    quarter = max(cfg.train.batch_size // 4, 1) * cfg.train.grad_accumulation_steps  # the job's rows at a quarter batch
    inputs = {r: input_samples(iter(source(replace(whole, rows=r), env.rank, env.world, False, 0, n + 1)), n)
              for r in (rows, quarter)}
    job = {"batch": rows, "world": env.world, "local": env.local_world, "device": device.type,
           "pooling": int(cfg.data.ids_per_feature), "layers": facts.layers, "other_params": facts.other_params,
           "dims": tuple(int(t.embedding_dim) for t in table_specs(cfg.model))}  # a tuple: one value, not per rank
    return {"dense": dense, "optimizer": optimizer, "input": inputs, "params": params, "job": job, "linear": linear,
            "lockstep": lockstep, "probe": _probe_together(device, cfg.calibrate.repeats)}


def _probe_together(device: torch.device, repeats: int) -> Dict[str, List[float]]:
    dist.barrier()  # every rank at once, as a job's ranks time theirs
    return speed_probe(device, repeats)


def _by_rank(mine: Dict[str, Any], world: int) -> Dict[str, Any]:
    """Every rank's measurements, gathered: each sample list becomes a list of per-rank sample lists."""
    everyone: List[Any] = [None] * world
    dist.all_gather_object(everyone, mine)

    def merge(values: List[Any]) -> Any:
        if isinstance(values[0], dict):
            keys = [k for k in values[0] if all(k in v for v in values)]
            return {k: merge([v[k] for v in values]) for k in keys}
        if isinstance(values[0], list) and values[0] and isinstance(values[0][0], dict):
            return [merge([v[i] for v in values]) for i in range(len(values[0]))]
        if isinstance(values[0], list):
            return values
        return values[0]
    return merge(everyone)


def run_calibration(cfg: RunnerConfig, run_folder: Path, env: RankEnv, device: torch.device, reporter: Reporter,
                    *_: object) -> Dict[str, Any]:
    """A calibration job's rank (its mode's ``works``; the trainer's marks, cores and host allocation unused):
    every rank measures (collectives, kernels, sharded lookups, the dense part, the job's step with tiny tables),
    the measurements gathered on every rank; rank 0 fits, writes and logs the calibration and returns the
    results."""
    started = time.perf_counter()
    say = _Progress(reporter.active)
    c = cfg.calibrate
    extra = ExtraTime(c, len(PARTS) + (device.type == "cuda"))
    mine: Dict[str, Any] = {"collectives": _collectives(c, env, device, say, extra.repeats())}
    mine["kernels"] = _kernels(c, cfg.optimizer, device, say, extra.repeats())
    if device.type == "cuda":  # (an empty list would gather as every rank's empty list)
        mine["uvm_kernels"] = _kernels(c, cfg.optimizer, device, say, extra.repeats(), uvm=True)
    mine["sharded"] = _sharded(cfg.train.batch_size, cfg.optimizer, cfg.precision, extra.repeats(), env, device, say)
    mine.update(_dense(cfg, env, device, say, extra.repeats()))
    say("the job's step with tiny tables", 0, 1, force=True)
    one = max(int(cfg.train.batch_size), 1)
    runs = [("table_wise", r) for r in step_batches(one, cfg.calibrate.grid)]
    # the other families: not with gradient accumulation (its step's samples are not the batch the families' parts
    # are costed at), and no data-parallel tables where the split step trains (loss scaling refuses them)
    families = [] if cfg.train.grad_accumulation_steps > 1 else [
        kind for kind in STEP_FAMILIES[1:] if kind != "data_parallel" or not uses_split_step(cfg.train, cfg.precision)]
    runs += [(kind, one) for kind in families]
    make = functools.partial(_tiny_job, cfg, env.rank, env.world, env.local_world, device)
    got = tiny_job_rounds(make, runs, device, STEP_ROUNDS["small" if cfg.calibrate.grid == "small" else "full"], say)
    mine["step"] = {r: got[(kind, r)] for kind, r in runs if kind == "table_wise" and got[(kind, r)]}
    if families and got[runs[-1]]:  # table-wise's: the batch's own rounds
        mine["step_family"] = {kind: got[(kind, one)] for kind in ("table_wise", *families)}
    # a scope's group holds only some ranks: its samples are merged over the ranks that measured them
    gathered = _by_rank(mine, env.world)
    for name, by_scope in gathered["collectives"].items():
        for scope, by_size in by_scope.items():
            gathered["collectives"][name][scope] = {n: [s for s in per_rank if s] for n, per_rank in by_size.items()}
    if not reporter.active:
        return {}
    return calibrate_results(c, cfg.cluster.calibration_dir, run_folder, gathered, fingerprint(
        device.type, env.world // env.local_world, env.local_world, device), time.perf_counter() - started, reporter)
