"""Which source a config names: checked before launch (one line when it cannot be read), opened per rank.

Every source yields TorchRec ``Batch`` objects of ``samples_per_step`` rows for one rank: synthetic
clicks (:mod:`.synthetic`), a folder of Parquet files (:mod:`.parquet`), Criteo click logs (:mod:`.criteo`).
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator, Optional

import torch
from torchrec.datasets.utils import Batch

from runner.config.errors import ConfigError, DataError, first_line
from runner.config.schema import samples_per_step
from runner.data.criteo import CRITEO_DENSE, CRITEO_LAYOUT, CRITEO_SPARSE, CriteoSource, criteo_files
from runner.data.layout import layout
from runner.data.parquet import ParquetSource, parquet_files
from runner.data.synthetic import synthetic
from runner.runtime.logfile import thread_errors_to_log


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
    for key in ("path", "eval_path"):
        if getattr(d, key) is not None:
            _check_files(d.name, f"data.{key}", getattr(d, key))
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
        schema = pq.read_schema(parquet_files(d.path)[0].open())
        missing = [c for c in list(lay.tasks) + lay.dense_columns + list(lay.features) if c not in schema.names]
        if missing:
            raise ConfigError("data.path", d.path, f"Parquet files with columns {', '.join(missing[:5])}"
                              f"{' ...' if len(missing) > 5 else ''} (missing; see README: Data)")


def _check_files(kind: str, key: str, value: str) -> None:
    """Every file non-empty and of its format (a Parquet footer; a Criteo first line of 40 fields)."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        for f in parquet_files(value):
            try:
                pq.read_metadata(f.open())
            except Exception as exc:  # ArrowInvalid, OSError
                raise DataError(f"{key}={value}: {f} is not a Parquet file ({first_line(exc)})") from None
        return
    files = criteo_files(value)
    if all(f.stat().st_size == 0 for f in files):
        raise DataError(f"{key}={value}: {'the file is' if len(files) == 1 else 'every file is'} empty; "
                        f"Criteo files have lines of {CRITEO_LAYOUT}")
    with files[0].open("rb") as fh:
        first = fh.readline().rstrip(b"\r\n")
    fields = first.count(b"\t") + 1
    if fields != 1 + CRITEO_DENSE + CRITEO_SPARSE:
        raise DataError(f"{files[0]} line 1 has {fields} fields; Criteo lines have {CRITEO_LAYOUT} ({key}={value})")


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
                                         prefetch_factor=4, multiprocessing_context="fork",
                                         worker_init_fn=_loader_worker_init)
    # workers' batches interleave round-robin: batch k of this rank is the same in every run
    return _Slice(loader, start_batch, num_batches)


def _loader_worker_init(worker_id: int) -> None:
    thread_errors_to_log(f"data-worker{worker_id}")


class _Slice:
    """Batches ``start .. stop - 1`` of a loader, each time it is iterated."""

    def __init__(self, loader: Any, start: int, stop: Optional[int]) -> None:
        self.loader, self.start, self.stop = loader, start, stop

    def __iter__(self) -> Iterator[Batch]:
        return itertools.islice(iter(self.loader), self.start, self.stop)
