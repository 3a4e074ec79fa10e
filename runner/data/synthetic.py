"""Synthetic click data that a model can learn: labels come from a hidden logistic model over ids
and dense features, so a falling loss and an AUC above 0.5 mean something."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterator, List

import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from runner.data.layout import layout

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig

# The hidden model is fixed (independent of train.seed): every seed samples the same task.
_TRUTH_SEED = 20240611
_EVAL_STREAM = 1_000_003
_SALT = 7919  # per-task offset of the id-weight hash


def _id_weight(ids: torch.Tensor, table_index: torch.Tensor) -> torch.Tensor:
    """Pseudo-random weight in [-1, 1] per (table, id), computed by hashing: no table to store."""
    h = (ids * 2654435761 + (table_index + 1) * 2246822519) % 4294967291
    h = (h ^ (h >> 13)) * 1274126177 % 4294967291
    return (h % 65536).float() / 32767.5 - 1.0


class SyntheticClicks:
    """Finite iterable of TorchRec ``Batch`` for one rank: batches ``start_batch`` .. ``num_batches - 1``.

    Batch ``i`` depends only on (seed, rank, split, i), so a resumed run sees exactly the batches an
    uninterrupted run would have seen from that point.
    """

    def __init__(self, feature_names: List[str], num_embeddings: List[int], num_dense: int,
                 batch_size: int, num_batches: int, seed: int, rank: int, eval_split: bool = False,
                 label_noise: float = 0.5, start_batch: int = 0, ids_per_feature: int = 1,
                 variable_lengths: bool = False, zipf_alpha: float = 0.0, tasks: int = 1) -> None:
        self.feature_names = list(feature_names)
        self.num_embeddings = list(num_embeddings)
        self.num_dense = num_dense
        self.batch_size = batch_size
        self.num_batches = num_batches
        self.start_batch = start_batch
        self.label_noise = label_noise
        self.ids_per_feature, self.variable_lengths, self.zipf_alpha = ids_per_feature, variable_lengths, zipf_alpha
        self._seed = seed * 7919 + rank * 104729 + (_EVAL_STREAM if eval_split else 0)
        g = torch.Generator().manual_seed(_TRUTH_SEED)
        self.tasks = tasks
        # one hidden model per task: its own dense weights, its own id weights (a salt in the hash)
        self._dense_w = torch.randn(tasks, num_dense, generator=g) / math.sqrt(num_dense)
        self._sizes = torch.tensor(self.num_embeddings, dtype=torch.float64).unsqueeze(1)
        self._table_index = torch.arange(len(self.num_embeddings)).unsqueeze(1)
        self._lengths = torch.ones(batch_size * len(self.num_embeddings), dtype=torch.int32)

    def __len__(self) -> int:
        return max(self.num_batches - self.start_batch, 0)

    def __iter__(self) -> Iterator[Batch]:
        g = torch.Generator()
        for i in range(self.start_batch, self.num_batches):
            g.manual_seed(self._seed * 1_000_003 + i)
            yield self._batch(g)

    def _batch(self, g: torch.Generator) -> Batch:
        b, tables = self.batch_size, len(self.num_embeddings)
        dense = torch.randn(b, self.num_dense, generator=g)
        if self.ids_per_feature == 1 and not self.variable_lengths:
            # one draw per (table, sample), scaled to each table's size: every table at once
            ids = self._draw(torch.rand(tables, b, generator=g, dtype=torch.float64), self._sizes)
            sparse = torch.stack([_id_weight(ids, self._table_index + _SALT * k).sum(0)
                                  for k in range(self.tasks)]) / math.sqrt(tables)
            values, lengths = ids.reshape(-1), self._lengths
        else:
            values, lengths, sparse = self._multi_hot(g, b, tables)
        score = self._dense_w @ dense.T + sparse * math.sqrt(3.0)  # (tasks, b); unit variance each part
        p = torch.sigmoid(score / self.label_noise)
        labels = (torch.rand(self.tasks, b, generator=g) < p).float()
        labels = labels[0] if self.tasks == 1 else labels.T.contiguous()
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=self.feature_names, values=values, lengths=lengths)
        return Batch(dense_features=dense, sparse_features=kjt, labels=labels)

    def _draw(self, u: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        """Ids from uniforms ``u``: uniform over each table, or power-law (Zipf-like) with the hot ids
        scattered over the table (as hashing does to real ids)."""
        if self.zipf_alpha <= 0:
            return (u * sizes).long()
        a = self.zipf_alpha
        if abs(a - 1.0) < 1e-9:
            rank = torch.exp(u * torch.log(sizes + 1.0))  # inverse CDF of 1/x on [1, n+1)
        else:
            rank = ((torch.pow(sizes + 1.0, 1 - a) - 1) * u + 1) ** (1 / (1 - a))
        ranks = (rank.long() - 1).clamp_(min=0)
        n = sizes.long()
        return torch.minimum((ranks * 1_000_003 + 7) % n, n - 1)

    def _multi_hot(self, g: torch.Generator, b: int, tables: int) -> tuple:
        """Several ids per (table, sample); a sample's score uses the mean weight of its ids."""
        if self.variable_lengths:  # 1 .. 2 * ids_per_feature - 1, mean ids_per_feature
            lengths = torch.randint(1, 2 * self.ids_per_feature, (tables, b), generator=g)
        else:
            lengths = torch.full((tables, b), self.ids_per_feature)
        per_table = lengths.sum(1)
        table_of = torch.repeat_interleave(torch.arange(tables), per_table)
        sizes = self._sizes.squeeze(1)[table_of]
        ids = self._draw(torch.rand(table_of.numel(), generator=g, dtype=torch.float64), sizes)
        segment = torch.repeat_interleave(torch.arange(tables * b), lengths.reshape(-1))
        sparse = []
        for k in range(self.tasks):
            sums = torch.zeros(tables * b).index_add_(0, segment, _id_weight(ids, table_of + _SALT * k))
            sparse.append((sums / lengths.reshape(-1)).view(tables, b).sum(0) / math.sqrt(tables))
        sparse = torch.stack(sparse)
        return ids, lengths.reshape(-1).to(torch.int32), sparse


def synthetic(cfg: RunnerConfig, batch_size: int, num_batches: int, rank: int, eval_split: bool,
              start_batch: int = 0) -> Any:
    """The synthetic source for ``cfg``'s model and data settings (batch ``i`` depends on seed, rank,
    split and ``i`` only)."""
    d, lay = cfg.data, layout(cfg)
    return SyntheticClicks(list(lay.features), list(lay.sizes), lay.num_dense, batch_size, num_batches,
                           cfg.train.seed, rank, eval_split, d.label_noise, start_batch=start_batch,
                           ids_per_feature=d.ids_per_feature, variable_lengths=d.variable_lengths,
                           zipf_alpha=d.zipf_alpha, tasks=len(lay.tasks))
