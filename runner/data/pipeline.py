"""The batches a rank trains on: built ahead in a background thread, and ended on every rank together.

File sources can end unevenly across ranks (Parquet within a batch, Criteo by a few). :class:`AllRanksIterator`
reads a chunk of batches ahead and asks every rank how many it has (one all-reduce of one number over a
gloo group of its own); every rank then takes the smallest count, so when any rank runs out, every rank
stops at the same step instead of the others hanging in the next collective. :class:`Prefetcher` builds
the next batches, and for training runs that agreement too, in a background thread while the training
thread runs.
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
from typing import TYPE_CHECKING, Any, Deque, Dict, Iterable, Iterator, Optional

import torch
import torch.distributed as dist
from torchrec.datasets.utils import Batch

from runner.data.sources import source
from runner.runtime.affinity import gloo_loops, lower_gloo_loops

if TYPE_CHECKING:
    from runner.data.layout import JobData

AGREE_EVERY = 16  # batches per all-reduce: one collective per step cost a Parquet job about a quarter of its speed
_GROUPS: Dict[str, Any] = {}  # for the process group in "world"


def _group(stream: str, low_loops: bool) -> Any:
    """The gloo group of a stream ("train": the prefetch thread's; "eval": the training thread's), made once
    per process for both, on every rank in the same order. Two groups: a collective of one thread must never
    meet another thread's on the same group, and an evaluation during training runs beside the prefetch.
    ``low_loops``: their event loops at low priority too (``cluster.gloo_loop_priority``)."""
    if _GROUPS.get("world") is not dist.group.WORLD:  # first use, or a new process group since
        loops = len(gloo_loops())
        _GROUPS.update(world=dist.group.WORLD, train=dist.new_group(backend="gloo"),
                       eval=dist.new_group(backend="gloo"))
        if low_loops:
            lower_gloo_loops(expect=loops + 2)
    return _GROUPS[stream]


class AllRanksIterator:
    """Yields this rank's batches while every rank has one; then stops on every rank together.

    Reads up to ``chunk`` batches ahead and all-reduces (MIN) how many it got: every rank yields that many,
    and stops after them when it is fewer than ``chunk``. The same steps as agreeing on every batch, with
    one collective per chunk.
    """

    def __init__(self, batches: Iterable[Batch], stream: str, chunk: int = AGREE_EVERY, low_loops: bool = True) -> None:
        self._it, self._group, self._chunk = iter(batches), _group(stream, low_loops), chunk
        self._ready: Deque[Batch] = collections.deque()
        self._ended = False

    def __iter__(self) -> "AllRanksIterator":
        return self

    def __next__(self) -> Batch:
        if not self._ready and not self._ended:
            got = list(itertools.islice(self._it, self._chunk))
            count = torch.tensor([len(got)], dtype=torch.int32)
            dist.all_reduce(count, op=dist.ReduceOp.MIN, group=self._group)
            agreed = int(count.item())
            self._ready.extend(got[:agreed])
            self._ended = agreed < self._chunk
        if not self._ready:
            raise StopIteration
        return self._ready.popleft()

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

    def __init__(self, batches: Iterable[Batch], depth: int) -> None:
        self._queue: Any = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._fill, args=(iter(batches),), name="runner-prefetch", daemon=True)
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
            if isinstance(item, BaseException):
                raise item
            raise StopIteration
        return item

    def close(self) -> None:
        self._done = True
        self._stop.set()
        self._thread.join(timeout=5)


def _pinned(batches: Iterable[Batch]) -> Iterator[Batch]:  # a generator: the loader starts at the first batch, in
    for batch in batches:  # the thread that takes it (the prefetch thread), not here
        yield batch.pin_memory()


def batches_for(data: JobData, rank: int, world: int, eval_split: bool, first: int = 0,
                num_batches: Optional[int] = None, pin: bool = False, low_loops: bool = True) -> Any:
    """This rank's batches ``first .. num_batches - 1``: training batches built ``data.prefetch_batches``
    ahead; file sources ended on every rank together (``low_loops``: gloo's loops at low priority,
    ``cluster.gloo_loop_priority``). ``pin``: in page-locked memory (CUDA workers: the copy to the GPU is then
    asynchronous; pinned in the prefetch thread when there is one)."""
    d = data.settings
    batches = source(data, rank, world, eval_split, first, num_batches)
    if pin:
        batches = _pinned(batches)
    if data.source.reads_files:  # generated sources have the same length on every rank; files may not
        batches = AllRanksIterator(batches, "eval" if eval_split else "train", low_loops=low_loops)
    if not eval_split and d.prefetch_batches > 0:  # the agreement then runs in the prefetch thread too
        batches = Prefetcher(batches, d.prefetch_batches)
    return batches
