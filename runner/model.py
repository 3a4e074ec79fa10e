"""Model construction on the meta device; DistributedModelParallel materialises the shards."""

from __future__ import annotations

from typing import Any

import torch
from torchrec import EmbeddingBagCollection
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig


def table_configs(model_cfg: Any) -> list[EmbeddingBagConfig]:
    """One TorchRec table per configured table; its single feature carries the table's name."""
    return [
        EmbeddingBagConfig(name=t.name, embedding_dim=model_cfg.embedding_dim,
                           num_embeddings=t.num_embeddings, feature_names=[t.name])
        for t in model_cfg.tables
    ]


def build_model(cfg: Any, dense_device: torch.device) -> DLRMTrain:
    """DLRM with its loss; embeddings on meta (never allocated whole), dense part on ``dense_device``."""
    ebc = EmbeddingBagCollection(tables=table_configs(cfg.model), device=torch.device("meta"))
    dlrm = DLRM(
        embedding_bag_collection=ebc,
        dense_in_features=cfg.data.num_dense_features,
        dense_arch_layer_sizes=list(cfg.model.dense_arch_layer_sizes),
        over_arch_layer_sizes=list(cfg.model.over_arch_layer_sizes),
        dense_device=dense_device,
    )
    return DLRMTrain(dlrm)
