"""What a batch holds for a model (its :class:`Layout`), a job's data part (:class:`JobData`, built once from its
config), and building TorchRec ``Batch`` objects from arrays."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, List, Tuple

import numpy as np

from runner.config.tables import table_specs

if TYPE_CHECKING:
    from runner.config.data_sources import DataSource
    from runner.config.schema import DataSchema, ModelSchema, RunnerConfig

DENSE_PREFIX = "dense_"


@dataclass(frozen=True)
class Layout:
    """What a batch holds: label columns (one per task), dense features, sparse features with table sizes."""

    tasks: Tuple[str, ...]
    num_dense: int
    features: Tuple[str, ...]
    sizes: Tuple[int, ...]

    @property
    def dense_columns(self) -> List[str]:
        return [f"{DENSE_PREFIX}{i}" for i in range(self.num_dense)]


def layout(model: ModelSchema, num_dense: int) -> Layout:
    """The batches of ``model`` with ``num_dense`` dense features (``data.num_dense_features``)."""
    specs = table_specs(model)
    return Layout(tuple(model.tasks), int(num_dense), tuple(t.name for t in specs),
                  tuple(int(t.num_embeddings) for t in specs))


@dataclass(frozen=True)
class JobData:
    """A job's data part, built once from its config (:func:`job_data`) and handed to what reads or checks data:
    the ``data`` keys, the declaration of the source they name (looked up once), the batches' layout, the rows per
    rank per optimizer step and the seed of synthetic data."""

    settings: DataSchema
    source: DataSource
    layout: Layout
    rows: int
    seed: int


def job_data(cfg: RunnerConfig) -> JobData:
    """``cfg``'s data part (:class:`JobData`)."""
    from runner.config.data_sources import SOURCES
    from runner.config.schema import samples_per_step

    return JobData(cfg.data, SOURCES[cfg.data.name], layout(cfg.model, cfg.data.num_dense_features),
                   samples_per_step(cfg.train), int(cfg.train.seed))


def make_batch(lay: Layout, labels: np.ndarray, dense: np.ndarray, lengths: np.ndarray, values: np.ndarray) -> Any:
    """``lengths``: (features, rows); ``values``: ids in feature-major order (KJT's layout)."""
    import torch  # here, not at the top: the driver reads layouts (dataset lineage) without loading torch
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    lab = torch.from_numpy(np.array(labels, dtype=np.float32))  # a copy: Arrow's buffers are read-only
    if lab.dim() == 2 and lab.shape[1] == 1:
        lab = lab[:, 0]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=list(lay.features), values=torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)),
        lengths=torch.from_numpy(np.ascontiguousarray(lengths.reshape(-1), dtype=np.int32)))
    return Batch(dense_features=torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32)),
                 sparse_features=kjt, labels=lab)


def shard_range(total: int, shard: int, shards: int) -> Tuple[int, int]:
    """Rows ``[lo, hi)`` of shard ``shard`` of ``shards`` over ``total`` rows (sizes differ by at most 1)."""
    return total * shard // shards, total * (shard + 1) // shards
