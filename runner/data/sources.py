"""Which source a config names: checked before launch (one line when it cannot be read), opened per rank.

Every source yields TorchRec ``Batch`` objects of ``samples_per_step`` rows for one rank, opened as its declaration
says (:mod:`runner.config.data_sources`): synthetic clicks (:mod:`.synthetic`), a folder of Parquet files
(:mod:`.parquet`), Criteo click logs (:mod:`.criteo`).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Iterator, Optional

import torch
from torchrec.datasets.utils import Batch

from runner.config.parts import part
from runner.runtime.logfile import thread_errors_to_log

if TYPE_CHECKING:
    from runner.data.layout import JobData


def source(data: JobData, rank: int, world: int, eval_split: bool, start_batch: int = 0,
           num_batches: Optional[int] = None) -> Any:
    """An iterable of this rank's batches: ``start_batch`` .. ``num_batches - 1`` (file sources: until
    the shard ends, at most ``num_batches``)."""
    d, lay, size, declared = data.settings, data.layout, data.rows, data.source
    if not declared.reads_files:
        return part(declared.opens)(data, size, num_batches or 0, rank, eval_split, start_batch)
    path = d.eval_path if eval_split and d.eval_path else d.path
    assert path is not None  # the pre-launch check refuses file data without data.path
    cls = part(declared.opens)
    workers = 0 if eval_split else d.num_workers
    ds = cls(path, lay, size, rank, world, workers, d.hash_ids, skip_batches=start_batch if workers == 0 else 0,
             max_batches=num_batches if workers == 0 else None,
             key="data.eval_path" if eval_split and d.eval_path else "data.path")
    if workers == 0:
        return ds
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=False,
                                         prefetch_factor=4, multiprocessing_context="fork",
                                         worker_init_fn=lambda n: thread_errors_to_log(f"data-worker{n}"))
    # workers' batches interleave round-robin: batch k of this rank is the same in every run
    return _Slice(loader, start_batch, num_batches)


class _Slice:
    """Batches ``start .. stop - 1`` of a loader, each time it is iterated."""

    def __init__(self, loader: torch.utils.data.DataLoader, start: int, stop: Optional[int]) -> None:
        self.loader, self.start, self.stop = loader, start, stop

    def __iter__(self) -> Iterator[Batch]:
        return itertools.islice(iter(self.loader), self.start, self.stop)
