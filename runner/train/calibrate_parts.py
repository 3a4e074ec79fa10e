"""What ``mode=calibrate`` times on each worker (:mod:`.calibrate` runs them and fits the results): collectives,
FBGEMM's embedding kernel and the configured model's dense part, optimizer and input.

Every measurement is one warm-up and ``repeats`` timed runs, each synchronised with the device, as lists of ms.
Every rank measures at once, as in a job (the ranks share the host's cores and links as training does).
"""

from __future__ import annotations

import functools
import itertools
import statistics
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn

from runner.train.loop import device_sync
from runner.train.timing import Repeats, forward_backward, timed, together

if TYPE_CHECKING:
    from torchrec import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from runner.config.schema import OptimizerSchema, PrecisionSchema

KIB, MIB = 1024, 1024**2
COLLECTIVES = ("all_to_all", "all_reduce", "reduce_scatter")
BACK_TO_BACK = 4  # calls timed together for messages up to 1 MiB


def message_sizes(device_kind: str, grid: str, max_mib: Any) -> List[int]:
    """Bytes per rank: 4 KiB, then x4 up to the largest (16 MiB on CPU, 256 MiB on a GPU; ``grid=small``: 3)."""
    top = int((max_mib if max_mib else (16 if device_kind == "cpu" else 256)) * MIB)
    sizes = [4 * KIB]
    while sizes[-1] * 4 <= top:
        sizes.append(sizes[-1] * 4)
    return [sizes[0], sizes[len(sizes) // 2], sizes[-1]] if grid == "small" else sizes


def scopes(world: int, local: int) -> Dict[str, List[List[int]]]:
    """The groups each scope measures at once: the workers of each node (``intra``), and with several nodes the
    workers of one local rank across nodes (``cross``)."""
    nodes = world // local
    out = {"intra": [list(range(n * local, (n + 1) * local)) for n in range(nodes)]} if local > 1 else {}
    if nodes > 1:
        out["cross"] = [list(range(lr, world, local)) for lr in range(local)]
    return out


def collective_samples(name: str, group: Any, size: int, nbytes: int, device: torch.device, repeats: Repeats
                       ) -> List[float]:
    """``name`` over ``group`` (``size`` ranks) with ``nbytes`` per rank in (what TorchRec's comms terms count), ms
    per call: messages up to 1 MiB are timed :data:`BACK_TO_BACK` calls at a time (as a step issues them), so that
    when the ranks leave the barrier is not most of what is timed. The all-to-all and the reduce-scatter receive
    into a tensor each call allocates, as TorchRec's distributions do (their outputs are new every step); the
    all-reduce works in place, as DDP's on its buckets. Measured here (2 CPU ranks, gloo): into a reused tensor a
    3 MiB all-to-all took 1.4 ms, into a new one 3.3 ms (a fresh buffer's pages are first touched by the
    collective), so a reused buffer's bandwidth left the embeddings' distributions at half their time."""
    n = max(nbytes // 4 // size * size, size)
    calls = BACK_TO_BACK if nbytes <= MIB else 1
    data = torch.ones(n, device=device)
    if name == "all_to_all":
        def run() -> None:
            for _ in range(calls):
                dist.all_to_all_single(torch.empty_like(data), data, group=group)
    elif name == "all_reduce":
        def run() -> None:
            for _ in range(calls):
                dist.all_reduce(data, group=group)
    else:
        def run() -> None:
            for _ in range(calls):
                dist.reduce_scatter_tensor(torch.empty(n // size, device=device), data, group=group)
    # every rank of every group of a scope measures at once, so they agree over the world: each group's samples
    # then have as many repeats as the others'
    return [t / calls for t in timed(run, repeats.with_agree(together(device)), device_sync(device),
                                     lambda: dist.barrier(group=group))]


def kernel_shapes(grid: str, device_kind: str = "cpu") -> List[Dict[str, int]]:
    """Table shapes x lookups the kernel is timed at (rows, dim, ids per sample, batch); on a GPU large enough
    that the bytes, not the launch, set the larger calls' time."""
    dims: Tuple[int, ...] = (16, 128) if grid == "small" else (16, 64, 256)
    rows: Tuple[int, ...] = (20_000,) if grid == "small" else (20_000, 200_000)
    poolings, batches = (1, 8), (256, 2048)
    if device_kind == "cuda":
        rows, poolings, batches = (1_000_000,) if grid == "small" else (100_000, 1_000_000), (1, 32), (2048, 65536)
    return [{"rows": r, "dim": d, "pooling": p, "batch": b}
            for r, d, p, b in itertools.product(rows, dims, poolings, batches)]


UVM_CACHE_RATIO = 0.2  # the GPU cache's share of a UVM-caching table's rows (TorchRec's UVM_CACHING_RATIO)


def kernel_samples(shape: Dict[str, int], device: torch.device, sparse_optimizer: Any, repeats: Union[int, Repeats],
                   uvm_caching: bool = False) -> Tuple[List[float], List[float]]:
    """FBGEMM's fused table-batched embedding (TorchRec's ``fused`` kernel; with ``uvm_caching``, its
    ``fused_uvm_caching`` one: rows in host memory, :data:`UVM_CACHE_RATIO` of them cached on the GPU) with the job's
    sparse optimizer fused into its backward: forward and backward ms."""
    from torchrec.distributed.utils import optimizer_type_to_emb_opt_type

    from runner.runtime.moved_names import fused_tbe_class, tbe_placement

    cls, kwargs = sparse_optimizer
    tbe = fused_tbe_class()([(shape["rows"], shape["dim"], *tbe_placement(device.type == "cuda", uvm_caching))],
                            **({"cache_load_factor": UVM_CACHE_RATIO} if uvm_caching else {}),
                            optimizer=optimizer_type_to_emb_opt_type(cls), learning_rate=kwargs.get("lr", 0.01),
                            eps=kwargs.get("eps", 1e-8), device=device)
    lookups = shape["batch"] * shape["pooling"]
    ids = torch.randint(shape["rows"], (lookups,), device=device)
    offsets = torch.arange(0, lookups + 1, shape["pooling"], device=device)
    grad = torch.ones(shape["batch"], shape["dim"], device=device)
    return forward_backward(lambda: tbe(ids, offsets), lambda out: out.backward(grad), repeats, device_sync(device))


class FixedEmbeddings(nn.Module):
    """Stands in for the model's embedding collection: the same pooled widths, given, so that only the dense part
    is timed (its gradient still flows back to the pooled embeddings, as in training)."""

    def __init__(self, ebc: EmbeddingBagCollection, batch: int, device: torch.device) -> None:
        super().__init__()
        self.keys = [f for c in ebc.embedding_bag_configs() for f in c.feature_names]
        self.dims = [c.embedding_dim for c in ebc.embedding_bag_configs() for _ in c.feature_names]
        self.values = torch.randn(batch, sum(self.dims), device=device, requires_grad=True)

    def forward(self, features: KeyedJaggedTensor) -> Any:
        from torchrec.sparse.jagged_tensor import KeyedTensor

        return KeyedTensor(keys=self.keys, length_per_key=self.dims, values=self.values)


def dense_model(model: nn.Module, device: torch.device, batch: int) -> nn.Module:
    """The configured model (``model``, built on ``device``) with its embedding collection replaced by
    :class:`FixedEmbeddings`."""
    from torchrec import EmbeddingBagCollection

    for name, module in list(model.named_modules()):
        if isinstance(module, EmbeddingBagCollection):
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            setattr(parent, name.rsplit(".", 1)[-1], FixedEmbeddings(module, batch, device))
    # some of TorchRec's arches make their parameters on the CPU whatever the dense device (DCN's LowRankCrossNet:
    # seen on an H200, "mat2 is on cpu"); in training DMP moves them, here nothing else would
    return model.to(device)


def dense_samples(model: nn.Module, autocast: Optional[str], optimizer_cfg: OptimizerSchema, batch_data: Any,
                  rows: int, device: torch.device, repeats: Union[int, Repeats]) -> Dict[str, List[float]]:
    """The dense part's forward, backward and the dense optimizer's step at ``rows`` samples, ms: ``model`` the
    configured model built on ``device``, ``autocast`` and ``optimizer_cfg`` the job's."""
    from torchrec.datasets.utils import Batch

    from runner.train.models import autocast_forward
    from runner.train.optimizers import dense_optimizer

    model = dense_model(model, device, rows)
    autocast_forward(model, device.type, autocast)
    optimizer = dense_optimizer(model, optimizer_cfg)
    b = Batch(dense_features=batch_data.dense_features[:rows], sparse_features=batch_data.sparse_features,
              labels=batch_data.labels[:rows]).to(device)
    sync = device_sync(device)
    fwd, bwd = forward_backward(lambda: model(b)[0], lambda loss: loss.backward(), repeats, sync)
    step = timed(optimizer.step, repeats, sync)
    return {"fwd": fwd, "bwd": bwd, "optimizer": step}


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
    from runner.train.optimizers import dense_optimizer

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
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, data_parallel, row_wise, table_wise
    from torchrec.distributed.types import ShardingPlan
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from runner.plan import sharders_for
    from runner.train.optimizers import sparse_optimizer

    rows, names = 64 * world, [f"t{i}" for i in range(tables)]
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=n, embedding_dim=16, num_embeddings=rows,
                                                            feature_names=[n]) for n in names],
                                 device=torch.device("meta"))
    cls, kwargs = sparse_optimizer(optimizer_cfg)
    if sharding_type != "data_parallel":
        apply_optimizer_in_backward(cls, ebc.parameters(), kwargs)
    spec = {"table_wise": lambda i: table_wise(rank=i % world), "row_wise": lambda i: row_wise(),
            "data_parallel": lambda i: data_parallel()}
    sharder = sharders_for(precision)[0]
    plan = construct_module_sharding_plan(ebc, {n: spec[sharding_type](i) for i, n in enumerate(names)},
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
