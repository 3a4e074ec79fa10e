"""The batches a rank trains on: built ahead in a background thread, and ended on every rank together.

File sources can end unevenly across ranks (Parquet within a batch, Criteo by a few). Before each
batch :class:`AllRanksIterator` asks every rank whether it has one (one all-reduce of one number over a
gloo group); when any rank has none, every rank stops at the same step instead of the others hanging in
the next collective. :class:`Prefetcher` builds the next batches while the training thread runs.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist
from torchrec.datasets.utils import Batch

from runner.data.sources import source


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


def _pinned(batches: Any) -> Iterator[Batch]:
    for batch in batches:
        yield batch.pin_memory()


def batches_for(cfg: Any, rank: int, world: int, eval_split: bool, first: int = 0,
                num_batches: Optional[int] = None, pin: bool = False) -> Any:
    """This rank's batches ``first .. num_batches - 1``: training batches built ``data.prefetch_batches``
    ahead; file sources ended on every rank together. ``pin``: in page-locked memory (CUDA workers: the
    copy to the GPU is then asynchronous; pinned in the prefetch thread when there is one)."""
    batches = source(cfg, rank, world, eval_split, first, num_batches)
    if pin:
        batches = _pinned(batches)
    if not eval_split and cfg.data.prefetch_batches > 0:
        batches = Prefetcher(batches, cfg.data.prefetch_batches)
    # synthetic sources have the same length on every rank; files may end unevenly
    return batches if cfg.data.name == "synthetic" else AllRanksIterator(batches)
