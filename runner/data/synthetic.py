"""Synthetic click data that a model can learn: labels come from a hidden logistic model over ids
and dense features, so a falling loss and an AUC above 0.5 mean something."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterator, List

import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

if TYPE_CHECKING:
    from runner.data.layout import JobData

# The hidden model is fixed (independent of train.seed): every seed samples the same task.
_TRUTH_SEED = 20240611
_EVAL_STREAM = 1_000_003
_SALT = 7919  # per-task offset of the id-weight hash
CHUNK_BATCHES, CHUNK_SAMPLES = 16, 4096  # one-hot batches drawn together: up to 16, up to 4,096 samples in all


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
        self.feature_names, self.num_embeddings = list(feature_names), list(num_embeddings)
        self.num_dense, self.batch_size, self.num_batches = num_dense, batch_size, num_batches
        self.start_batch, self.label_noise = start_batch, label_noise
        self.ids_per_feature, self.variable_lengths, self.zipf_alpha = ids_per_feature, variable_lengths, zipf_alpha
        self._seed = seed * 7919 + rank * 104729 + (_EVAL_STREAM if eval_split else 0)
        g = torch.Generator().manual_seed(_TRUTH_SEED)
        self.tasks = tasks
        # one hidden model per task: its own dense weights, its own id weights (a salt in the hash)
        self._dense_w = torch.randn(tasks, num_dense, generator=g) / math.sqrt(num_dense)
        self._sizes = torch.tensor(self.num_embeddings, dtype=torch.float64).unsqueeze(1)
        self._table_index = torch.arange(len(self.num_embeddings)).unsqueeze(1)
        tables = len(self.num_embeddings)
        self._lengths = torch.ones(batch_size * tables, dtype=torch.int32)
        self._offsets = torch.arange(batch_size * tables + 1, dtype=torch.int32)
        self._per_key = [batch_size] * tables
        self._offset_per_key = [batch_size * t for t in range(tables + 1)]
        self._chunk = max(1, min(CHUNK_BATCHES, CHUNK_SAMPLES // max(batch_size, 1)))

    def __len__(self) -> int:
        return max(self.num_batches - self.start_batch, 0)

    def __iter__(self) -> Iterator[Batch]:
        if self.ids_per_feature == 1 and not self.variable_lengths:
            yield from self._one_hot_batches()
            return
        g = torch.Generator()
        for i in range(self.start_batch, self.num_batches):
            g.manual_seed(self._seed * 1_000_003 + i)
            dense = torch.randn(self.batch_size, self.num_dense, generator=g)
            values, lengths, sparse = self._multi_hot(g, self.batch_size, len(self.num_embeddings))
            kjt = KeyedJaggedTensor.from_lengths_sync(keys=self.feature_names, values=values, lengths=lengths)
            yield Batch(dense_features=dense, sparse_features=kjt, labels=self._labels(g, dense, sparse))

    def _one_hot_batches(self) -> Iterator[Batch]:
        """One id per (table, sample): ``_chunk`` batches drawn at once (a few dozen tensor operations per
        chunk instead of per batch), each chunk from its own seed, so batch ``i`` is still a function of
        (seed, rank, split, i) alone, wherever a run starts."""
        b, tables, k = self.batch_size, len(self.num_embeddings), self._chunk
        g = torch.Generator()
        for c in range(self.start_batch // k, -(-self.num_batches // k)):
            g.manual_seed(self._seed * 1_000_003 + c)
            dense = torch.randn(k, b, self.num_dense, generator=g)
            # one draw per (batch, table, sample), scaled to each table's size
            ids = self._draw(torch.rand(k, tables, b, generator=g, dtype=torch.float64), self._sizes)
            sparse = torch.stack([_id_weight(ids, self._table_index + _SALT * t).sum(1)
                                  for t in range(self.tasks)], 1) / math.sqrt(tables)  # (k, tasks, b)
            labels = self._labels(g, dense, sparse)
            for j in range(max(self.start_batch - c * k, 0), min(k, self.num_batches - c * k)):
                # lengths and offsets are the same for every batch: given, not computed per batch
                kjt = KeyedJaggedTensor(keys=self.feature_names, values=ids[j].reshape(-1), lengths=self._lengths,
                                        offsets=self._offsets, stride=b, length_per_key=self._per_key,
                                        offset_per_key=self._offset_per_key)
                yield Batch(dense_features=dense[j], sparse_features=kjt, labels=labels[j])

    def _labels(self, g: torch.Generator, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """Clicks from the hidden model: ``dense`` (..., b, num_dense) and the ids' part ``sparse``
        (..., tasks, b) give labels (..., b), or (..., b, tasks) for several tasks."""
        score = self._dense_w @ dense.transpose(-1, -2) + sparse * math.sqrt(3.0)  # unit variance each part
        p = torch.sigmoid(score / self.label_noise)
        labels = (torch.rand(p.shape, generator=g) < p).float()
        return labels.select(-2, 0) if self.tasks == 1 else labels.transpose(-1, -2).contiguous()

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


def synthetic(data: JobData, batch_size: int, num_batches: int, rank: int, eval_split: bool,
              start_batch: int = 0) -> Any:
    """The synthetic source for a job's model and data settings (batch ``i`` depends on seed, rank,
    split and ``i`` only)."""
    d, lay = data.settings, data.layout
    return SyntheticClicks(list(lay.features), list(lay.sizes), lay.num_dense, batch_size, num_batches,
                           data.seed, rank, eval_split, d.label_noise, start_batch=start_batch,
                           ids_per_feature=d.ids_per_feature, variable_lengths=d.variable_lengths,
                           zipf_alpha=d.zipf_alpha, tasks=len(lay.tasks))
