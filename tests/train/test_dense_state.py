"""The dense state a job counts beside its plan's storage holds a data-parallel table's weights once."""

from __future__ import annotations

from pathlib import Path
from typing import Tuple

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, data_parallel, table_wise
from torchrec.distributed.types import ShardingPlan
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

from runner.train.evaluate import dense_state_bytes


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=n, embedding_dim=16, num_embeddings=1000,
                                                                     feature_names=[n]) for n in ("t0", "t1")],
                                          device=torch.device("meta"))
        self.top = torch.nn.Linear(32, 1)


def _state(replicated: bool) -> Tuple[int, bool]:
    """The dense state with t0 data-parallel or table-wise (fused where sharded, as the runner's sharded tables
    are: the optimizer in FBGEMM's kernel) and t1 table-wise, and whether DDP's buckets are views of the
    gradients."""
    model = _Model()
    fused = ["t1"] if replicated else ["t0", "t1"]
    kind = data_parallel() if replicated else table_wise(rank=0, compute_kernel="fused")
    for name in fused:
        apply_optimizer_in_backward(torch.optim.SGD, model.ebc.embedding_bags[name].parameters(), {"lr": 0.1})
    kinds = {"t0": kind, "t1": table_wise(rank=0, compute_kernel="fused")}
    plan = ShardingPlan({"ebc": construct_module_sharding_plan(model.ebc, kinds, local_size=1, world_size=1,
                                                               device_type="cpu")})
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan)
    ddp = next(m for m in dmp.modules() if isinstance(m, torch.nn.parallel.DistributedDataParallel))
    return dense_state_bytes(dmp, None), bool(getattr(ddp, "gradient_as_bucket_view", False))


def test_a_data_parallel_tables_weights_are_left_to_the_plans_storage(tmp_path: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        (dp, views), (tw, _) = _state(True), _state(False)
    finally:
        dist.destroy_process_group()
    table = 1000 * 16 * 4
    # t0 data-parallel adds its gradient and DDP's bucket for it, or its gradient alone where the buckets are
    # views of the gradients; never its weights, which the plan's storage holds
    assert dp - tw == table * (1 if views else 2), (dp, tw, views)
