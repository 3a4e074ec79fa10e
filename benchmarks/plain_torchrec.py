"""A plain TorchRec training loop, wired as TorchRec's own examples do, for comparison with the runner.

    torchrun --standalone --nproc_per_node=2 benchmarks/plain_torchrec.py --steps 300 --out plain.json
    torchrun --standalone --nproc_per_node=1 benchmarks/plain_torchrec.py --device cuda --out plain.json

Same model as ``conf/model/dlrm.yaml`` (tables, widths, MLPs), table-wise plan, fused row-wise Adagrad
(lr 0.05) for the tables and Adam (lr 1e-3) for the MLPs, TrainPipelineSparseDist, RandomRecDataset
generating a new batch every step.
Uses nothing from the runner.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection
from torchrec.datasets.random import RandomRecDataset
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.optim import RowWiseAdagrad
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

TABLES = {"t0": 100000, "t1": 50000, "t2": 20000, "t3": 10000, "t4": 5000, "t5": 1000}
DIM, DENSE_IN = 64, 13


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=50, help="untimed first steps (the runner's first log window)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: one GPU per rank, NCCL")
    ap.add_argument("--bind-cores", action="store_true",
                    help="bind each rank to its own slice of the cores (as the runner's cluster.cpu_affinity=auto)")
    args = ap.parse_args()

    if args.bind_cores:
        cores, local, local_world = sorted(os.sched_getaffinity(0)), int(os.environ["LOCAL_RANK"]), int(
            os.environ["LOCAL_WORLD_SIZE"])
        per = len(cores) // local_world
        os.sched_setaffinity(0, cores[local * per:(local + 1) * per])

    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=n, embedding_dim=DIM, num_embeddings=r,
                                                            feature_names=[n]) for n, r in TABLES.items()],
                                 device=torch.device("meta"))
    model = DLRMTrain(DLRM(embedding_bag_collection=ebc, dense_in_features=DENSE_IN,
                           dense_arch_layer_sizes=[128, DIM], over_arch_layer_sizes=[128, 64, 1],
                           dense_device=device))
    apply_optimizer_in_backward(RowWiseAdagrad, model.model.sparse_arch.parameters(), {"lr": 0.05, "eps": 1e-8})
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, local_world_size=int(os.environ["LOCAL_WORLD_SIZE"]),
                          compute_device=args.device),
        batch_size=args.batch,
        constraints={n: ParameterConstraints(sharding_types=["table_wise"]) for n in TABLES},
    )
    plan = planner.collective_plan(model, [EmbeddingBagCollectionSharder()], dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(module=model, device=device, plan=plan)
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                  lambda params: torch.optim.Adam(params, lr=1e-3))
    optimizer = CombinedOptimizer([dmp.fused_optimizer, dense])
    data = RandomRecDataset(keys=list(TABLES), batch_size=args.batch, hash_sizes=list(TABLES.values()),
                            ids_per_feature=1, num_dense=DENSE_IN, manual_seed=rank, num_batches=args.steps,
                            num_generated_batches=-1)  # a new batch every step, as the runner's data
    pipeline = TrainPipelineSparseDist(dmp, optimizer, device)
    it = iter(data)
    first_step = t_start = None
    windows, t_window = [], time.perf_counter()  # samples/s of every `--warmup` steps, the first included
    for step in range(1, args.steps + 1):
        pipeline.progress(it)
        if cuda and (step == 1 or step % args.warmup == 0):
            torch.cuda.synchronize()  # the runner's windows end on a synchronised step too
        if step == 1:
            first_step = time.time()
        if step == args.warmup:
            t_start = time.perf_counter()
        if step % args.warmup == 0:
            now = time.perf_counter()
            windows.append(world * args.batch * args.warmup / (now - t_window))
            t_window = now
    elapsed = time.perf_counter() - t_start
    if rank == 0:
        types = {t: p.sharding_type for m in plan.plan.values() for t, p in m.items()}
        with open(args.out, "w") as f:
            json.dump({"samples_per_s": world * args.batch * (args.steps - args.warmup) / elapsed,
                       "first_step_unix": first_step, "sharding_types": types, "windows": windows}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # The figures are written. Tearing the interpreter down after TorchRec's pipeline and gloo aborted
    # (SIGABRT) in 2 of 3 runs here, and torchrun then fails the command: end without the teardown.
    sys.stdout.flush()
    os._exit(0)
