"""Model construction on the meta device; DistributedModelParallel materialises the shards.

Every model is wrapped so that ``forward(batch) -> (loss, (loss, logits, labels))``, the contract of
TorchRec's ``DLRMTrain`` that ``TrainPipelineSparseDist`` and evaluation rely on.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Tuple

import torch
from torch import nn
from torchrec import EmbeddingBagCollection
from torchrec.datasets.utils import Batch
from torchrec.models.deepfm import SimpleDeepFMNN
from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig
from torchrec.modules.mlp import MLP
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from runner.config.precisions import TABLE_DTYPES
from runner.config.tables import table_specs
from runner.train.optimizers import mark_sparse_optimizer

if TYPE_CHECKING:
    from runner.config.schema import ModelSchema, RunnerConfig


def table_configs(model_cfg: ModelSchema, embedding_dtype: str = "fp32") -> List[EmbeddingBagConfig]:
    """One TorchRec table per configured table; its single feature carries the table's name."""
    data_type = DataType[TABLE_DTYPES[embedding_dtype].member]
    return [EmbeddingBagConfig(name=t.name, embedding_dim=t.embedding_dim, num_embeddings=t.num_embeddings,
                               feature_names=[t.name], data_type=data_type) for t in table_specs(model_cfg)]


class EmbeddingMLP(nn.Module):
    """Pooled embeddings of any widths, concatenated with the dense MLP's output, into the over MLP."""

    def __init__(self, ebc: EmbeddingBagCollection, dense_in: int, dense_sizes: List[int],
                 over_sizes: List[int], dense_device: torch.device) -> None:
        super().__init__()
        self.embedding_bag_collection = ebc
        self.features = [f for cfg in ebc.embedding_bag_configs() for f in cfg.feature_names]
        emb_width = sum(cfg.embedding_dim for cfg in ebc.embedding_bag_configs())
        self.dense_arch = MLP(dense_in, dense_sizes, device=dense_device)
        in_width, hidden = dense_sizes[-1] + emb_width, over_sizes[:-1]
        layers: List[nn.Module] = [MLP(in_width, hidden, device=dense_device)] if hidden else []
        layers.append(nn.Linear(hidden[-1] if hidden else in_width, 1, device=dense_device))
        self.over_arch = nn.Sequential(*layers)

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.embedding_bag_collection(sparse).to_dict()  # fixed order, whatever the sharding
        x = torch.cat([self.dense_arch(dense)] + [pooled[f] for f in self.features], dim=1)
        return self.over_arch(x)


class ClickModelTrain(nn.Module):
    """Any ``model(dense, sparse) -> logits`` with TorchRec's ``DLRMTrain`` contract and BCE loss."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = nn.BCEWithLogitsLoss()

    def forward(self, batch: Batch) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        logits = self.model(batch.dense_features, batch.sparse_features).squeeze(-1)
        loss = self.loss_fn(logits, batch.labels.float())
        return loss, (loss.detach(), logits.detach(), batch.labels.detach())


class MMoE(nn.Module):
    """Multi-gate mixture of experts (Ma et al., KDD 2018) over the dense MLP's output and the pooled
    embeddings: shared expert MLPs, one softmax gate and one tower per task; one logit per task."""

    def __init__(self, ebc: EmbeddingBagCollection, dense_in: int, dense_sizes: List[int], num_experts: int,
                 expert_sizes: List[int], tower_sizes: List[int], tasks: int, dense_device: torch.device) -> None:
        super().__init__()
        self.embedding_bag_collection = ebc
        self.features = [f for cfg in ebc.embedding_bag_configs() for f in cfg.feature_names]
        width = dense_sizes[-1] + sum(cfg.embedding_dim for cfg in ebc.embedding_bag_configs())
        self.dense_arch = MLP(dense_in, dense_sizes, device=dense_device)
        self.experts = nn.ModuleList(MLP(width, expert_sizes, device=dense_device) for _ in range(num_experts))
        self.gates = nn.ModuleList(nn.Linear(width, num_experts, device=dense_device) for _ in range(tasks))
        hidden = tower_sizes[:-1]
        self.towers = nn.ModuleList(
            nn.Sequential(*([MLP(expert_sizes[-1], hidden, device=dense_device)] if hidden else []),
                          nn.Linear(hidden[-1] if hidden else expert_sizes[-1], 1, device=dense_device))
            for _ in range(tasks))

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.embedding_bag_collection(sparse).to_dict()
        x = torch.cat([self.dense_arch(dense)] + [pooled[f] for f in self.features], dim=1)
        experts = torch.stack([e(x) for e in self.experts], dim=1)  # (batch, experts, width)
        weights = [torch.softmax(gate(x), dim=-1).unsqueeze(-1) for gate in self.gates]  # each (batch, experts, 1)
        return torch.cat([tower((w * experts).sum(1)) for w, tower in zip(weights, self.towers, strict=True)],
                         dim=1)  # (batch, tasks)


class MultiTaskTrain(nn.Module):
    """``model(dense, sparse) -> (batch, tasks)`` logits; the loss is the sum of the tasks' BCE losses."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = nn.BCEWithLogitsLoss(reduction="none")

    def forward(self, batch: Batch) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        logits = self.model(batch.dense_features, batch.sparse_features)
        labels = batch.labels.float().reshape(logits.shape)
        loss = self.loss_fn(logits, labels).mean(0).sum()
        return loss, (loss.detach(), logits.detach(), batch.labels.detach())


def autocast_forward(model: nn.Module, device_type: str, dtype_name: Optional[str]) -> None:
    """Run ``model``'s forward (and only its forward: PyTorch advises against autocast in backward and the
    optimizer step) under autocast to ``dtype_name``; nothing when it is None. Hooks, not a wrapper
    module, so that parameter names (plans, checkpoints) stay the model's own."""
    if dtype_name is None:
        return
    dtype = getattr(torch, dtype_name)
    active: List[Any] = []

    def enter(_module: nn.Module, _args: Any) -> None:
        ctx = torch.autocast(device_type=device_type, dtype=dtype)
        ctx.__enter__()
        active.append(ctx)

    def leave(_module: nn.Module, _args: Any, _output: Any) -> None:
        active.pop().__exit__(None, None, None)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)


def build_dlrm(m: ModelSchema, ebc: EmbeddingBagCollection, dense_in: int, dense_device: torch.device) -> nn.Module:
    return DLRMTrain(DLRM(embedding_bag_collection=ebc, dense_in_features=dense_in,
                          dense_arch_layer_sizes=list(m.dense_arch_layer_sizes),
                          over_arch_layer_sizes=list(m.over_arch_layer_sizes), dense_device=dense_device))


def build_dcn(m: ModelSchema, ebc: EmbeddingBagCollection, dense_in: int, dense_device: torch.device) -> nn.Module:
    return DLRMTrain(DLRM_DCN(embedding_bag_collection=ebc, dense_in_features=dense_in,
                              dense_arch_layer_sizes=list(m.dense_arch_layer_sizes),
                              over_arch_layer_sizes=list(m.over_arch_layer_sizes), dcn_num_layers=m.dcn_num_layers,
                              dcn_low_rank_dim=m.dcn_low_rank_dim, dense_device=dense_device))


def build_deepfm(m: ModelSchema, ebc: EmbeddingBagCollection, dense_in: int, dense_device: torch.device) -> nn.Module:
    with torch.device(dense_device):  # TorchRec's DeepFM takes no device argument
        deepfm = SimpleDeepFMNN(num_dense_features=dense_in, embedding_bag_collection=ebc,
                                hidden_layer_size=m.dense_arch_layer_sizes[0],
                                deep_fm_dimension=m.over_arch_layer_sizes[0])
    return ClickModelTrain(deepfm)


def build_mmoe(m: ModelSchema, ebc: EmbeddingBagCollection, dense_in: int, dense_device: torch.device) -> nn.Module:
    return MultiTaskTrain(MMoE(ebc, dense_in, list(m.dense_arch_layer_sizes), m.num_experts,
                               list(m.expert_layer_sizes), list(m.over_arch_layer_sizes), len(m.tasks), dense_device))


def build_dnn(m: ModelSchema, ebc: EmbeddingBagCollection, dense_in: int, dense_device: torch.device) -> nn.Module:
    return ClickModelTrain(EmbeddingMLP(ebc, dense_in, list(m.dense_arch_layer_sizes),
                                        list(m.over_arch_layer_sizes), dense_device))


@contextlib.contextmanager
def _meta_tables_uninitialised() -> Iterator[None]:
    """While open, ``nn.EmbeddingBag`` skips its random initialisation: the tables are built on the meta device,
    where it writes nothing (and costs ~0.3 ms a table through meta kernels: 1.4 s at 5,384 tables)."""
    reset = nn.EmbeddingBag.reset_parameters
    nn.EmbeddingBag.reset_parameters = lambda self: None  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.EmbeddingBag.reset_parameters = reset  # type: ignore[method-assign]


def build_model(cfg: RunnerConfig, dense_device: torch.device) -> nn.Module:
    """The model with its loss, by its family's declaration (:mod:`runner.config.model_families`); embeddings on
    meta (never allocated whole), dense part on ``dense_device``."""
    from runner.config.model_families import FAMILIES
    from runner.config.parts import part

    with _meta_tables_uninitialised():
        ebc = EmbeddingBagCollection(tables=table_configs(cfg.model, cfg.precision.embedding_dtype),
                                     device=torch.device("meta"))
    builds, dense_device = part(FAMILIES[cfg.model.family].builds), torch.device(dense_device)
    if dense_device.type != "meta":  # sized on meta first: a dense part that cannot fit is refused, not allocated
        sized = builds(cfg.model, ebc, cfg.data.num_dense_features, torch.device("meta"))
        _check_dense_fits(sized, dense_device, cfg.data.num_dense_features, list(cfg.model.dense_arch_layer_sizes),
                          int(cfg.cluster.workers_per_node))
    return builds(cfg.model, ebc, cfg.data.num_dense_features, dense_device)


def _check_dense_fits(model: nn.Module, device: torch.device, num_dense: int, layers: List[int], workers: int) -> None:
    """One line (a :class:`ConfigError` on ``data.num_dense_features``, ``num_dense``) where the dense part's
    parameters alone (``model``'s, sized on meta; ``layers``: ``model.dense_arch_layer_sizes``) are more than a
    worker's share of the memory it would take them from: its GPU's free memory, or the host's available memory over
    the host's ``workers``."""
    import psutil

    from runner.config.errors import ConfigError
    from runner.plan import GIB, dense_bytes

    need = dense_bytes(model)
    if device.type == "cuda":
        room, where = torch.cuda.mem_get_info(device)[0], f"the {torch.cuda.get_device_name(device)}'s free memory"
    else:
        workers, available = max(workers, 1), int(psutil.virtual_memory().available)
        room = available // workers
        where = f"each worker's share of this host's available memory, {available / GIB:.2f} GiB over {workers}"
    if need > room:
        raise ConfigError("data.num_dense_features", num_dense,
                          f"a dense part that fits: with it the model's dense parameters alone take {need / GIB:.2f} "
                          f"GiB on each worker (model.dense_arch_layer_sizes={layers}"
                          f"), more than {where} ({room / GIB:.2f} GiB)")


def planning_model(cfg: RunnerConfig) -> nn.Module:
    """The model on the meta device with its tables' fused optimizer set (the planner's storage estimate
    reads it): what ``mode=plan`` plans, allocating nothing."""
    model = build_model(cfg, torch.device("meta"))
    mark_sparse_optimizer(model, cfg.optimizer)
    return model
