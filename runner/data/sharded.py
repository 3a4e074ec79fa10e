"""The file sources' common part: each reads one shard of the rows (shard = rank x dataloader workers +
worker), and cuts the Arrow tables it reads into batches of exactly the batch size."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Tuple

import numpy as np
import torch
from torchrec.datasets.utils import Batch

from runner.data.layout import Layout

if TYPE_CHECKING:
    import pyarrow as pa


class ShardedSource(torch.utils.data.IterableDataset):
    """Base of the file sources: shard = rank * workers + dataloader worker id."""

    def __init__(self, path: str, lay: Layout, batch_size: int, rank: int, world: int, workers: int,
                 hash_ids: bool, skip_batches: int = 0, max_batches: Optional[int] = None,
                 key: str = "data.path") -> None:
        super().__init__()
        self.path, self.lay, self.batch_size, self.key = path, lay, batch_size, key
        self.rank, self.world, self.workers, self.hash_ids = rank, world, max(workers, 1), hash_ids
        self.skip_batches, self.max_batches = skip_batches, max_batches

    def _shard(self) -> Tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        return self.rank * self.workers + worker, self.world * self.workers

    def _batch(self, table: pa.Table) -> Batch:
        raise NotImplementedError

    def _rebatch(self, tables: Iterator[Any]) -> Iterator[Batch]:
        """Batches of exactly ``batch_size`` rows from a stream of Arrow tables (a last, smaller remainder
        is dropped), from batch ``skip_batches`` on, at most up to ``max_batches``."""
        import pyarrow as pa

        pending: List[Any] = []
        pending_rows, emitted = 0, 0
        for table in tables:
            pending.append(table)
            pending_rows += table.num_rows
            while pending_rows >= self.batch_size:
                merged = pa.concat_tables(pending)
                take, rest = merged.slice(0, self.batch_size), merged.slice(self.batch_size)
                pending, pending_rows = [rest], rest.num_rows
                if emitted >= self.skip_batches:
                    yield self._batch(take)
                emitted += 1
                if self.max_batches is not None and emitted >= self.max_batches:
                    return

    def _ids(self, ids: np.ndarray, feature: int) -> np.ndarray:
        size = self.lay.sizes[feature]
        if self.hash_ids:
            return ids % size
        if ids.size and (ids.min() < 0 or ids.max() >= size):
            raise ValueError(f"feature {self.lay.features[feature]!r} has ids outside [0, {size}) and "
                             "data.hash_ids=false")
        return ids
