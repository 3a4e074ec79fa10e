"""Parquet: a folder of files, rows split over ranks and dataloader workers by the files' row counts.

Columns: one per task (label), ``dense_0..dense_{D-1}`` (float), one per sparse feature named as its
table (int64, or list<int64> for multi-hot). Shards differ by at most one row (TorchEasyRec's
rebalancing), so ranks end within one batch of each other; each shard reads only its row groups.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
from torchrec.datasets.utils import Batch

from runner.config.errors import DataError
from runner.data.files import DataFile, parquet_files
from runner.data.layout import make_batch, shard_range
from runner.data.sharded import ShardedSource
from runner.data.values import ValueCheck, normalized


def _row_range(files: List[Tuple[DataFile, int]], lo: int, hi: int, columns: List[str]
               ) -> Iterator[Tuple[DataFile, int, Any]]:
    """Tables holding global rows ``[lo, hi)`` of ``files`` in order, read row group by row group: (the file, the
    table's first row in that file, the table)."""
    import pyarrow.parquet as pq

    offset = 0
    for path, n in files:
        if offset + n <= lo or offset >= hi:
            offset += n
            continue
        pf = pq.ParquetFile(path.open())
        in_file = 0
        for g in range(pf.metadata.num_row_groups):
            size = pf.metadata.row_group(g).num_rows
            start, end = max(lo - offset, 0), min(hi - offset, size)
            if start < end:
                yield path, in_file + start, pf.read_row_group(g, columns=columns).slice(start, end - start)
            offset += size
            in_file += size
            if offset >= hi:
                return


_SEEN: Dict[str, List[str]] = {}  # data path -> the files this process first found there


class ParquetSource(ShardedSource):
    """Rows of a folder of Parquet files. Columns: one per task (label), ``dense_0..dense_{D-1}`` (float),
    one per sparse feature named as its table (int64, or list<int64> for multi-hot)."""

    def rows(self) -> List[Tuple[DataFile, int]]:
        import pyarrow.parquet as pq

        files = parquet_files(self.path)
        seen = _SEEN.setdefault(self.path, [str(f) for f in files])  # what this process found there first
        gone = sorted(set(seen) - {str(f) for f in files})
        if not files:  # the folder (or the one file data.path names) went as a whole
            raise self.removed("the file" if seen == [self.path] else "the folder")
        if gone:
            raise self.removed(gone[0])
        try:
            return [(f, pq.read_metadata(f.open()).num_rows) for f in files]
        except FileNotFoundError as exc:
            raise self.removed(exc.filename or "a file") from None

    def removed(self, what: str) -> DataError:
        """The one line of data that vanished while the job read it."""
        return DataError(f"{self.key}={self.path}: {what} was removed while the job read it; restore it, or point "
                         f"{self.key} at data that stays while the job runs")

    def __iter__(self) -> Iterator[Batch]:
        shard, shards = self._shard()
        files = self.rows()
        lo, hi = shard_range(sum(n for _, n in files), shard, shards)
        columns = list(self.lay.tasks) + self.lay.dense_columns + list(self.lay.features)
        self.values = ValueCheck(self.lay, self.key, self.path, self.hash_ids)

        def checked() -> Iterator[Any]:
            for path, first_row, table in _row_range(files, lo, hi, columns):
                self.values.check(table, path, first_row)  # the first bad value stops the job, named
                yield normalized(table, self.lay)

        try:
            yield from self._rebatch(checked())  # only the row groups of the range
        except FileNotFoundError as exc:
            raise self.removed(exc.filename or "a file") from None

    def _batch(self, t: Any) -> Batch:
        import pyarrow as pa

        labels = np.stack([t.column(c).to_numpy() for c in self.lay.tasks], axis=1)
        dense = np.stack([t.column(c).to_numpy() for c in self.lay.dense_columns], axis=1) if \
            self.lay.num_dense else np.zeros((t.num_rows, 0), np.float32)
        lengths, values = [], []
        for i, name in enumerate(self.lay.features):
            col = t.column(name).combine_chunks()
            if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
                offsets = col.offsets.to_numpy()
                lengths.append(np.diff(offsets))
                ids = col.values.to_numpy()[offsets[0]:offsets[-1]]
            else:
                lengths.append(np.ones(t.num_rows, np.int64))
                ids = col.to_numpy()
            values.append(self._ids(ids.astype(np.int64), i))
        return make_batch(self.lay, labels, dense, np.stack(lengths), np.concatenate(values))
