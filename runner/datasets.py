"""Data sources: synthetic clicks, a folder of Parquet files, Criteo click logs; and the all-ranks end check.

Every source yields TorchRec ``Batch`` objects of ``samples_per_step`` rows for one rank. File sources
split their rows over ``world_size * data.num_workers`` shards (one per rank and dataloader worker):

- ``parquet``: by row count, read from the files' metadata; shards differ by at most one row
  (TorchEasyRec's rebalancing), so ranks end within one batch of each other;
- ``criteo``: by byte range over the concatenated files, each line read by the shard its first byte
  falls in (no pass over the data to count lines); ends differ by a few batches.

Either way one rank can run out first. :class:`AllRanksIterator` asks every rank, before each batch,
whether it has one (one all-reduce of one number over a gloo group); when any rank has none, every rank
stops at the same step instead of the others hanging in the next collective.
"""

from __future__ import annotations

import io
import itertools
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from runner.schema import samples_per_step
from runner.validation import ConfigError

CRITEO_DENSE, CRITEO_SPARSE = 13, 26
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


def layout(cfg: Any) -> Layout:
    from runner.tables import table_specs

    specs = table_specs(cfg.model)
    return Layout(tuple(cfg.model.tasks), int(cfg.data.num_dense_features), tuple(t.name for t in specs),
                  tuple(int(t.num_embeddings) for t in specs))


def _make_batch(lay: Layout, labels: np.ndarray, dense: np.ndarray, lengths: np.ndarray,
                values: np.ndarray) -> Batch:
    """``lengths``: (features, rows); ``values``: ids in feature-major order (KJT's layout)."""
    lab = torch.from_numpy(np.array(labels, dtype=np.float32))  # a copy: Arrow's buffers are read-only
    if lab.dim() == 2 and lab.shape[1] == 1:
        lab = lab[:, 0]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=list(lay.features), values=torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)),
        lengths=torch.from_numpy(np.ascontiguousarray(lengths.reshape(-1), dtype=np.int32)))
    return Batch(dense_features=torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32)),
                 sparse_features=kjt, labels=lab)


# ---------------------------------------------------------------------------------------------- parquet


def parquet_files(path: str) -> List[Path]:
    p = Path(path)
    return sorted(p.rglob("*.parquet")) if p.is_dir() else ([p] if p.is_file() else [])


def _shard_range(total: int, shard: int, shards: int) -> Tuple[int, int]:
    return total * shard // shards, total * (shard + 1) // shards


class _ShardedSource(torch.utils.data.IterableDataset):
    """Base of the file sources: shard = rank * workers + dataloader worker id."""

    def __init__(self, path: str, lay: Layout, batch_size: int, rank: int, world: int, workers: int,
                 hash_ids: bool, skip_batches: int = 0, max_batches: Optional[int] = None) -> None:
        super().__init__()
        self.path, self.lay, self.batch_size = path, lay, batch_size
        self.rank, self.world, self.workers, self.hash_ids = rank, world, max(workers, 1), hash_ids
        self.skip_batches, self.max_batches = skip_batches, max_batches

    def _shard(self) -> Tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        return self.rank * self.workers + worker, self.world * self.workers

    def _batch(self, table: Any) -> Batch:
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


def _row_range(files: List[Tuple[Path, int]], lo: int, hi: int, columns: List[str]) -> Iterator[Any]:
    """Tables holding global rows ``[lo, hi)`` of ``files`` in order, read row group by row group."""
    import pyarrow.parquet as pq

    offset = 0
    for path, n in files:
        if offset + n <= lo or offset >= hi:
            offset += n
            continue
        pf = pq.ParquetFile(path)
        for g in range(pf.metadata.num_row_groups):
            size = pf.metadata.row_group(g).num_rows
            start, end = max(lo - offset, 0), min(hi - offset, size)
            if start < end:
                yield pf.read_row_group(g, columns=columns).slice(start, end - start)
            offset += size
            if offset >= hi:
                return


class ParquetSource(_ShardedSource):
    """Rows of a folder of Parquet files. Columns: one per task (label), ``dense_0..dense_{D-1}`` (float),
    one per sparse feature named as its table (int64, or list<int64> for multi-hot)."""

    def rows(self) -> List[Tuple[Path, int]]:
        import pyarrow.parquet as pq

        return [(f, pq.ParquetFile(f).metadata.num_rows) for f in parquet_files(self.path)]

    def __iter__(self) -> Iterator[Batch]:
        shard, shards = self._shard()
        files = self.rows()
        lo, hi = _shard_range(sum(n for _, n in files), shard, shards)
        columns = list(self.lay.tasks) + self.lay.dense_columns + list(self.lay.features)
        yield from self._rebatch(_row_range(files, lo, hi, columns))  # only the row groups of the range

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
        return _make_batch(self.lay, labels, dense, np.stack(lengths), np.concatenate(values))


# ----------------------------------------------------------------------------------------------- criteo

_HEX = np.zeros(256, dtype=np.uint64)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i


_POWERS = np.array([16 ** (15 - i) for i in range(16)], dtype=np.uint64)


def hex_to_int(strings: Any) -> np.ndarray:
    """Hex strings (up to 16 digits; empty = 0) to unsigned integers, vectorised: a Python sequence or an
    Arrow string array (read from its buffers, no Python objects)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = strings if isinstance(strings, (pa.Array, pa.ChunkedArray)) else pa.array(list(strings), pa.string())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    padded = pc.utf8_lpad(arr.fill_null(""), width=16, padding="0")
    if len(padded) and pc.max(pc.utf8_length(padded)).as_py() > 16:
        raise ValueError("a categorical value has more than 16 hex digits")
    padded = padded.cast(pa.string())
    offsets = np.frombuffer(padded.buffers()[1], dtype=np.int32)[padded.offset:padded.offset + len(padded) + 1]
    data = np.frombuffer(padded.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]]
    digits = _HEX[data.reshape(-1, 16)]
    return (digits * _POWERS).sum(axis=1, dtype=np.uint64)


def criteo_files(path: str) -> List[Path]:
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        return []
    return sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))


class CriteoSource(_ShardedSource):
    """Criteo click logs: ``label \\t I1..I13 \\t C1..C26`` per line (TSV, missing values empty).
    Dense: ``log(1 + max(x, 0))``; categorical: hex value modulo the feature's table size."""

    block_bytes = 4 << 20

    def __iter__(self) -> Iterator[Batch]:
        yield from self._rebatch(self._parse(block) for block in self._blocks())

    def _blocks(self) -> Iterator[bytes]:
        """This shard's byte range of the concatenated files, as blocks of whole lines."""
        shard, shards = self._shard()
        files = criteo_files(self.path)
        sizes = [f.stat().st_size for f in files]
        lo, hi = _shard_range(sum(sizes), shard, shards)
        offset = 0
        for path, size in zip(files, sizes, strict=True):
            start, end = max(lo - offset, 0), min(hi - offset, size)
            offset += size
            if start < end:
                yield from _blocks_starting_in(path, start, end, self.block_bytes)

    def _parse(self, block: bytes) -> Any:
        """Whole lines, parsed by Arrow's CSV reader (C++): label, 13 numbers, 26 strings."""
        import pyarrow as pa
        import pyarrow.csv as pcsv

        names = (["label"] + [f"I{j}" for j in range(1, CRITEO_DENSE + 1)]
                 + [f"C{j}" for j in range(1, CRITEO_SPARSE + 1)])
        types = {"label": pa.float32(), **{f"I{j}": pa.float64() for j in range(1, CRITEO_DENSE + 1)},
                 **{f"C{j}": pa.string() for j in range(1, CRITEO_SPARSE + 1)}}
        try:
            return pcsv.read_csv(io.BytesIO(block),
                                 read_options=pcsv.ReadOptions(column_names=names, use_threads=False,
                                                               block_size=len(block) + 1),
                                 parse_options=pcsv.ParseOptions(delimiter="\t", quote_char=False),
                                 convert_options=pcsv.ConvertOptions(column_types=types,
                                                                     strings_can_be_null=False))
        except pa.ArrowInvalid as exc:
            raise ValueError(f"{self.path}: not the Criteo layout (label, 13 integer, 26 categorical, "
                             f"tab-separated): {str(exc).splitlines()[0]}") from None

    def _batch(self, t: Any) -> Batch:
        def numbers(name: str) -> np.ndarray:  # missing values (null) -> NaN -> 0
            return np.nan_to_num(t.column(name).to_numpy(zero_copy_only=False), nan=0.0)

        labels = numbers("label")[:, None]
        dense = np.stack([numbers(f"I{j}") for j in range(1, CRITEO_DENSE + 1)], axis=1)
        dense = np.log1p(np.maximum(dense, 0.0))
        values = [self._ids((hex_to_int(t.column(f"C{j + 1}")) % np.uint64(self.lay.sizes[j])).astype(np.int64), j)
                  for j in range(CRITEO_SPARSE)]
        return _make_batch(self.lay, labels, dense, np.ones((CRITEO_SPARSE, t.num_rows), np.int64),
                           np.concatenate(values))


def _blocks_starting_in(path: Path, start: int, end: int, block: int) -> Iterator[bytes]:
    """Blocks of whole lines of ``path``: every line whose first byte lies in ``[start, end)``, once."""
    with open(path, "rb") as f:
        if start > 0:
            f.seek(start - 1)
            if f.read(1) != b"\n":
                f.readline()  # the line in progress belongs to the previous shard
        pos = f.tell()  # file offset of buf[0]
        buf = b""
        while pos < end:
            chunk = f.read(block)
            buf += chunk
            cut = len(buf) if not chunk else buf.rfind(b"\n") + 1  # whole lines only (all of it at EOF)
            keep = end - pos  # lines starting at buf[keep] or later belong to the next shard
            if cut > keep:
                line_end = buf.find(b"\n", keep - 1) if keep > 0 else -1
                cut = line_end + 1 if line_end >= 0 else (len(buf) if keep > 0 else 0)
                if cut:
                    yield buf[:cut]
                return
            if cut:
                yield buf[:cut]
            buf, pos = buf[cut:], pos + cut
            if not chunk:
                return


# ---------------------------------------------------------------------------------------------- sources


def check_data(cfg: Any) -> None:
    """One line, before launch, for a data config that cannot be read."""
    d = cfg.data
    if d.name == "synthetic":
        return
    for key in ("path", "eval_path"):
        value = getattr(d, key)
        if value is None:
            if key == "path":
                raise ConfigError("data.path", None, f"a {d.name} file or folder")
            continue
        found = parquet_files(value) if d.name == "parquet" else criteo_files(value)
        if not found:
            kind = "*.parquet files" if d.name == "parquet" else "files"
            raise ConfigError(f"data.{key}", value, f"a file or folder with {kind} (none found)")
    if d.name == "criteo":
        lay = layout(cfg)
        if len(lay.features) != CRITEO_SPARSE or lay.num_dense != CRITEO_DENSE or len(lay.tasks) != 1:
            raise ConfigError("data.name", "criteo", f"a model with {CRITEO_SPARSE} tables, "
                              f"data.num_dense_features={CRITEO_DENSE} and one task (e.g. model=dlrm_criteo); "
                              f"this one has {len(lay.features)} tables, {lay.num_dense} dense, "
                              f"{len(lay.tasks)} tasks")
    if d.name == "parquet":
        import pyarrow.parquet as pq

        lay = layout(cfg)
        schema = pq.read_schema(parquet_files(d.path)[0])
        missing = [c for c in list(lay.tasks) + lay.dense_columns + list(lay.features) if c not in schema.names]
        if missing:
            raise ConfigError("data.path", d.path, f"Parquet files with columns {', '.join(missing[:5])}"
                              f"{' ...' if len(missing) > 5 else ''} (missing; see README: Data)")


def synthetic(cfg: Any, batch_size: int, num_batches: int, rank: int, eval_split: bool,
              start_batch: int = 0) -> Any:
    """The synthetic source for ``cfg``'s model and data settings (batch ``i`` depends on seed, rank,
    split and ``i`` only)."""
    from runner.data import SyntheticClicks

    d, lay = cfg.data, layout(cfg)
    return SyntheticClicks(list(lay.features), list(lay.sizes), lay.num_dense, batch_size, num_batches,
                           cfg.train.seed, rank, eval_split, d.label_noise, start_batch=start_batch,
                           ids_per_feature=d.ids_per_feature, variable_lengths=d.variable_lengths,
                           zipf_alpha=d.zipf_alpha, tasks=len(lay.tasks))


def source(cfg: Any, rank: int, world: int, eval_split: bool, start_batch: int = 0,
           num_batches: Optional[int] = None) -> Any:
    """An iterable of this rank's batches: ``start_batch`` .. ``num_batches - 1`` (file sources: until
    the shard ends, at most ``num_batches``)."""
    d, lay, size = cfg.data, layout(cfg), samples_per_step(cfg)
    if d.name == "synthetic":
        return synthetic(cfg, size, num_batches or 0, rank, eval_split, start_batch)
    path = d.eval_path if eval_split and d.eval_path else d.path
    cls = ParquetSource if d.name == "parquet" else CriteoSource
    workers = 0 if eval_split else d.num_workers
    ds = cls(path, lay, size, rank, world, workers, d.hash_ids, skip_batches=start_batch if workers == 0 else 0,
             max_batches=num_batches if workers == 0 else None)
    if workers == 0:
        return ds
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=False,
                                         prefetch_factor=4, multiprocessing_context="fork")
    # workers' batches interleave round-robin: batch k of this rank is the same in every run
    return _Slice(loader, start_batch, num_batches)


class _Slice:
    """Batches ``start .. stop - 1`` of a loader, each time it is iterated."""

    def __init__(self, loader: Any, start: int, stop: Optional[int]) -> None:
        self.loader, self.start, self.stop = loader, start, stop

    def __iter__(self) -> Iterator[Batch]:
        return itertools.islice(iter(self.loader), self.start, self.stop)


class AllRanksIterator:
    """Yields this rank's batches while every rank has one; then stops on every rank together."""

    _group: Any = None

    def __init__(self, batches: Any) -> None:
        self._it = iter(batches)
        if AllRanksIterator._group is None:  # a CPU flag, whatever the training backend
            gloo = dist.get_backend() == "gloo"
            AllRanksIterator._group = dist.group.WORLD if gloo else dist.new_group(backend="gloo")
        self._ended = False

    def __iter__(self) -> "AllRanksIterator":
        return self

    def __next__(self) -> Batch:
        if self._ended:
            raise StopIteration
        batch = next(self._it, None)
        flag = torch.tensor([0 if batch is None else 1], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._group)
        if flag.item() == 0:
            self._ended = True
            raise StopIteration
        return batch

    def close(self) -> None:
        getattr(self._it, "close", lambda: None)()


def _arrow_table(lay: Layout, b: Batch, rows: int) -> Any:
    import pyarrow as pa

    cols = {}
    labels = b.labels.reshape(b.labels.shape[0], -1)[:rows]
    for t, task in enumerate(lay.tasks):
        cols[task] = pa.array(labels[:, t].numpy())
    for j, name in enumerate(lay.dense_columns):
        cols[name] = pa.array(b.dense_features[:rows, j].numpy())
    for name, jt in b.sparse_features.to_dict().items():
        lengths = jt.lengths()[:rows].numpy()
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        cols[name] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(jt.values()[:offsets[-1]].numpy()))
    return pa.table(cols)


def write_parquet(cfg: Any, out: Path, rows: int, files: int, eval_rows: int,
                  chunk_rows: int = 65536) -> List[Path]:
    """The synthetic source, written as Parquet (``train/`` and ``eval/`` folders) for ``data=parquet``;
    one row group per ``chunk_rows`` rows, so memory stays flat whatever the size."""
    import pyarrow.parquet as pq

    lay = layout(cfg)
    written = []
    for split, total, nfiles in (("train", rows, files), ("eval", eval_rows, 1)):
        folder = out / split
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(nfiles):
            lo, hi = _shard_range(total, i, nfiles)
            n, chunk = hi - lo, min(chunk_rows, max(hi - lo, 1))
            gen = synthetic(cfg, chunk, -(-n // chunk), i, split == "eval")  # file i: the stream of "rank" i
            path = folder / f"part-{i:05d}.parquet"
            tmp = path.with_suffix(".parquet.tmp")
            writer = None
            left = n
            for b in gen:
                table = _arrow_table(lay, b, min(left, chunk))
                writer = writer or pq.ParquetWriter(tmp, table.schema)
                writer.write_table(table)
                left -= table.num_rows
            if writer is not None:
                writer.close()
                os.replace(tmp, path)
                written.append(path)
    return written


def criteo_lines(rows: int, seed: int = 0, missing: float = 0.1) -> str:
    """Criteo-layout TSV text with random values (for tests and trying the reader)."""
    rng = np.random.default_rng(seed)
    out = io.StringIO()
    for _ in range(rows):
        ints = rng.integers(-1, 1000, CRITEO_DENSE)
        cats = rng.integers(0, 2**32, CRITEO_SPARSE)
        label = int(rng.random() < 1 / (1 + np.exp(-(np.log1p(max(ints[0], 0)) - 3 + (cats[0] % 7) / 3))))
        fields = [str(label)] + ["" if rng.random() < missing else str(v) for v in ints] + [
            "" if rng.random() < missing else f"{v:08x}" for v in cats]
        out.write("\t".join(fields) + "\n")
    return out.getvalue()


class Prefetcher:
    """Iterates ``batches`` in a background thread, ``depth`` batches ahead of the training loop.

    Building a batch (drawing ids, or turning Arrow columns into a KeyedJaggedTensor) then runs while
    the training thread waits on a collective, instead of between steps. Batches come in the source's
    order; an error in the source is raised in the consumer at the batch where it happened. The thread
    stops when the source ends, when the consumer calls :meth:`close`, or at exit (daemon).
    """

    _END = object()

    def __init__(self, batches: Any, depth: int) -> None:
        self._queue: Any = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._fill, args=(iter(batches),), name="runner-prefetch",
                                        daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self, it: Iterator[Batch]) -> None:
        try:
            for batch in it:
                if not self._put(batch):
                    return
            self._put(self._END)
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(exc)

    def __iter__(self) -> "Prefetcher":
        return self

    def __next__(self) -> Batch:
        if self._done:
            raise StopIteration
        item = self._queue.get()
        if item is self._END or isinstance(item, BaseException):
            self._done = True
            self._stop.set()
            if item is self._END:
                raise StopIteration
            raise item
        return item

    def close(self) -> None:
        self._done = True
        self._stop.set()
        self._thread.join(timeout=5)
