"""TorchRec's enumeration with each sharding option's identical shards held once: planning at a thousand GPUs.

TorchRec's enumerator builds one ``Shard`` (with its own ``Perf`` and ``Storage``) per shard of every option:
a row-wise or data-parallel option over 1,024 GPUs has 1,024 of them, nearly all the same size. At 5,384
tables on 1,024 GPUs that is 11 million shards, 13 minutes of estimates and 8.8 GiB before a plan is looked
for. TorchRec's estimators give a shard's storage and perf from its size and its option alone (the perf
estimator builds one context per shard size, its default config's ``post_process_perfs`` returns the perfs
unchanged, and the storage estimator's per-shard lists depend only on each shard's size), so shards of the
same size get the same numbers.

:class:`CompactEnumerator` is TorchRec's ``EmbeddingEnumerator`` (its own loop over modules, constraints,
sharding types and kernels, and its own estimators) whose options hold only their *distinct* shard sizes, in
the order they first occur, each estimated once by TorchRec's estimators; every option carries a
:class:`Layout` saying which distinct shard each real shard is. The numbers are TorchRec's by construction,
and ``tests/plan/test_compact_enumeration.py`` compares every option, shard by shard, with TorchRec's own
enumeration. :func:`shard_arrays` gives the search its per-shard arrays, :func:`expand` gives the chosen
plan TorchRec's full options (real sizes and offsets, each shard with its own copies of the estimates).
Estimates are made in chunks, with progress, so a long enumeration says how far it is.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
from torchrec.distributed.planner import enumerators as _enumerators
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.types import Shard, ShardingOption, Storage

from runner.plan.torchrec_adapter import parallel_estimates
from runner.plan.torchrec_adapter.dataclass_copies import shallow_copy

if TYPE_CHECKING:
    from torch import nn
    from torchrec.distributed.types import ModuleSharder

LAYOUT = "runner_layout"  # the attribute of a compact option that holds its Layout

_calculate = _enumerators.calculate_shard_sizes_and_offsets  # TorchRec's own; the enumerator calls it by this name


@dataclass
class Layout:
    """Which distinct shard each of an option's real shards is (``index``, one entry per real shard), and the
    arguments TorchRec's ``calculate_shard_sizes_and_offsets`` gave the real sizes and offsets from."""

    index: np.ndarray  # (real shards,) integers (a broadcast view where all are 0)
    arguments: Dict[str, Any]

    def __deepcopy__(self, memo: Dict[int, Any]) -> Layout:
        return self  # never changed after enumeration: copies of an option share it

    @property
    def count(self) -> int:
        return len(self.index)


def _compacting(layouts: List[Layout], progress: Optional[Callable[[Dict[str, Any]], None]]
                ) -> Callable[..., Tuple[List[List[int]], List[List[int]]]]:
    last = [time.perf_counter()]

    def compact(**arguments: Any) -> Tuple[List[List[int]], List[List[int]]]:
        found = even_row_wise(arguments)
        if found is None:
            sizes, offsets = _calculate(**arguments)
            found = _all_alike(sizes, offsets)
        if found is None:
            keys = list(map(tuple, sizes))
            ids = {k: i for i, k in enumerate(dict.fromkeys(keys))}  # distinct sizes, in order of first occurrence
            index = np.fromiter(map(ids.__getitem__, keys), dtype=np.int32, count=len(keys))
            at = [keys.index(k) for k in ids]  # each distinct size's first real shard
            found = [list(sizes[p]) for p in at], [list(offsets[p]) for p in at], index
        layouts.append(Layout(found[2], arguments))
        if progress is not None and time.perf_counter() - last[0] >= 1.0:
            last[0] = time.perf_counter()
            progress({"phase": "enumerating", "done": len(layouts)})
        return found[0], found[1]
    return compact


def _all_alike(sizes: List[List[int]], offsets: List[List[int]]
               ) -> Optional[Tuple[List[List[int]], List[List[int]], np.ndarray]]:
    """The compact form where every shard has one size (a data-parallel option: one list repeated per rank, 8,192
    at 8,192 GPUs), as the general path gives it (the size, its first offset, index 0 for every shard) without a
    tuple and a dict entry per shard; its index a read-only broadcast view (no bytes per shard). None otherwise."""
    if not sizes or sizes.count(sizes[0]) != len(sizes):  # the same list object: compared by identity first
        return None
    return [list(sizes[0])], [list(offsets[0])], np.broadcast_to(np.int32(0), (len(sizes),))


def even_row_wise(arguments: Dict[str, Any]) -> Optional[Tuple[List[List[int]], List[List[int]], np.ndarray]]:
    """The compact form of TorchRec's even row-wise split (``calculate_shard_sizes_and_offsets`` for
    ``row_wise`` without buckets or device memory sizes: ``ceil(rows / world)`` rows on each rank up to the
    last full one, the rest on the next, none after), without building its list per rank (1,024 at 1,024
    GPUs: most of an enumeration's time otherwise): distinct sizes and their first offsets in order of first
    occurrence, and each rank's index into them. None for every other split (TorchRec's own call then).
    ``tests/plan/test_compact_enumeration.py`` compares it with TorchRec's call at many sizes."""
    if (arguments.get("sharding_type") != "row_wise" or arguments.get("device_memory_sizes")
            or arguments.get("num_buckets")):
        return None
    rows, columns = (int(n) for n in arguments["tensor"].shape)
    world = int(arguments["world_size"])
    if rows <= 0 or world <= 0:
        return None  # TorchRec's own call says what is wrong
    block = math.ceil(rows / world)  # as TorchRec computes it
    last = rows // block
    tail = rows - block * last  # rows on rank ``last`` (where it exists); none on the ranks after it
    sizes, offsets = [[block, columns]], [[0, 0]]
    index = np.zeros(world, dtype=np.int8)  # at most 3 distinct sizes: a byte a shard (8,192 an option at 8,192 GPUs)
    if last < world:
        if tail:
            sizes.append([tail, columns])
            offsets.append([last * block, 0])
            index[last] = 1
        if last + 1 < world or not tail:
            sizes.append([0, columns])
            offsets.append([rows, 0])
            index[last + (1 if tail else 0):] = len(sizes) - 1
    return sizes, offsets, index


@contextlib.contextmanager
def _compact_sizes(layouts: List[Layout], progress: Optional[Callable[[Dict[str, Any]], None]]) -> Iterator[None]:
    _enumerators.calculate_shard_sizes_and_offsets = _compacting(layouts, progress)
    try:
        yield
    finally:
        _enumerators.calculate_shard_sizes_and_offsets = _calculate


class _SearchSpaceKept:
    """``copy`` as TorchRec's enumerator module sees it while :func:`search_space_kept` is open: a list of
    sharding options is "deep-copied" as itself; everything else is copied as ``copy`` copies it."""

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)

    @staticmethod
    def deepcopy(value: Any, memo: Optional[Dict[int, Any]] = None) -> Any:
        if type(value) is list and value and isinstance(value[0], ShardingOption):
            return value
        return copy.deepcopy(value, memo)


@contextlib.contextmanager
def search_space_kept() -> Iterator[None]:
    """While open, TorchRec's ``enumerate`` keeps the options it returns as its last search space instead of a
    deep copy of them (1.2 s and a second copy of every option at 5,384 tables on 1,024 GPUs). For an
    enumerator whose options are handed out as they are anyway (:mod:`.enumeration_reuse`)."""
    _enumerators.copy = _SearchSpaceKept()  # type: ignore[attr-defined]
    try:
        yield
    finally:
        _enumerators.copy = copy  # type: ignore[attr-defined]


class CompactEnumerator(EmbeddingEnumerator):
    """TorchRec's enumerator whose options hold their distinct shards once (see the module doc); with
    ``compact=False`` TorchRec's full options. ``progress`` is called with ``{"phase": "estimating", "done",
    "of", "seconds"}`` between chunks of estimates."""

    def __init__(self, *args: Any, compact: bool = True,
                 progress: Optional[Callable[[Dict[str, Any]], None]] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.compact, self.progress = compact, progress
        self._layouts: List[Layout] = []
        self._by_name: Optional[Tuple[Any, int, Dict[str, Any], Dict[str, Any]]] = None

    def enumerate(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]]) -> List[ShardingOption]:
        self._layouts = []
        if not self.compact:
            return super().enumerate(module, sharders)
        with _compact_sizes(self._layouts, self.progress):
            return super().enumerate(module, sharders)

    # TorchRec looks a table's config up by walking its module's list of configs, once per table and once per
    # option (:meth:`_get_num_buckets`, :meth:`_get_stash_weights`): 20,000 tables make that 140,000 walks of
    # 20,000. The same first match, from a map made once per list of configs.
    def _get_num_buckets(self, parameter: str, module: nn.Module) -> Optional[int]:
        found = self._configs(module)
        if found is None:
            return super()._get_num_buckets(parameter, module)
        config = found[1].get(parameter)
        return None if config is None else config.total_num_buckets

    def _get_stash_weights(self, parameter: str, module: nn.Module) -> bool:
        found = self._configs(module)
        if found is None:
            return super()._get_stash_weights(parameter, module)
        config = found[0].get(parameter)
        return config is not None and bool(getattr(config, "stash_weights", False))

    def _configs(self, module: nn.Module) -> Optional[Tuple[Dict[str, Any], Dict[str, Any]]]:
        """For an EmbeddingBagCollection or EmbeddingCollection exactly (others: None, TorchRec's own walk):
        its configs by name, and by name those that are virtual tables (the first of each name)."""
        from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

        if type(module) is EmbeddingBagCollection:
            configs = module.embedding_bag_configs()
        elif type(module) is EmbeddingCollection:
            configs = module.embedding_configs()
        else:
            return None
        if self._by_name is None or self._by_name[0] is not configs or self._by_name[1] != len(configs):
            named: Dict[str, Any] = {}
            virtual: Dict[str, Any] = {}
            for config in configs:
                named.setdefault(config.name, config)
                if getattr(config, "use_virtual_table", False):
                    virtual.setdefault(config.name, config)
            self._by_name = (configs, len(configs), named, virtual)
        return self._by_name[2], self._by_name[3]

    def populate_estimates(self, sharding_options: List[ShardingOption]) -> None:
        if len(self._layouts) == len(sharding_options):  # this enumeration's options, in the order made
            for option, layout in zip(sharding_options, self._layouts, strict=True):
                setattr(option, LAYOUT, layout)
        self._layouts = []
        parallel_estimates.estimate(self._estimators, sharding_options, estimator_input(self), self.progress)


def estimator_input(enumerator: EmbeddingEnumerator) -> Dict[str, Any]:
    """What TorchRec's enumerator hands its estimators after an enumeration, as keyword arguments: the sharders'
    data (TorchRec 1.7 on) or the sharders themselves (1.6, whose enumerator has no ``_sharder_data_map``)."""
    data = getattr(enumerator, "_sharder_data_map", None)
    return {"sharder_data_map": data} if data is not None else {"sharder_map": enumerator._sharder_map}


def layout_of(option: ShardingOption) -> Optional[Layout]:
    return getattr(option, LAYOUT, None)


def shard_count(option: ShardingOption) -> int:
    """The option's real number of shards."""
    layout = layout_of(option)
    return len(option.shards) if layout is None else layout.count


def shard_arrays(option: ShardingOption) -> Tuple[np.ndarray, np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """Each real shard's total perf (ms) and storage (hbm, ddr, ssd bytes): ``(shards,)`` float64 and
    ``(shards, 3)`` int64; the distinct shards' storage (every row of the second is one of its rows); and, where
    it is cheaper to sum from them, the second's column sums (None otherwise). Where every shard is the same,
    read-only broadcast views of one shard's numbers."""
    perf = np.array([s.perf.total for s in option.shards], dtype=np.float64)  # type: ignore[union-attr]
    mem = np.array([(s.storage.hbm, s.storage.ddr, s.storage.ssd) for s in option.shards],  # type: ignore[union-attr]
                   dtype=np.int64).reshape(-1, 3)
    layout = layout_of(option)
    if layout is None or len(option.shards) == layout.count:
        return perf, mem, mem, None
    if len(option.shards) == 1:
        return np.broadcast_to(perf, (layout.count,)), np.broadcast_to(mem, (layout.count, 3)), mem, None
    counts = np.bincount(layout.index, minlength=len(option.shards))  # each distinct shard's count: whole bytes
    return perf[layout.index], mem[layout.index], mem, (mem * counts[:, None]).sum(0)


def shard_storages(option: ShardingOption) -> List[Storage]:
    """Each real shard's ``Storage`` (shared objects for identical shards: read, do not change)."""
    layout = layout_of(option)
    if layout is None:
        return [s.storage for s in option.shards]
    return [option.shards[i].storage for i in layout.index.tolist()]


def expand(option: ShardingOption) -> ShardingOption:
    """TorchRec's full option for a compact one, as a private copy: every real shard with its size, offset and
    estimates, as TorchRec's enumerator and estimators give them (a full option: a deep copy). The copies of
    the estimates are the plan's own, one per distinct shard, read by the shards of its size (a data-parallel
    option at 1,024 GPUs: 2 copies, not 2,048; nothing changes a plan's estimates once planned)."""
    layout = layout_of(option)
    if layout is None:
        return copy.deepcopy(option)
    bare = copy.copy(option)
    del bare.__dict__[LAYOUT]
    bare.shards = []
    full = copy.deepcopy(bare)  # the option's own fields (TorchRec's copy shares the tensor and module)
    sizes, offsets = _calculate(**layout.arguments)
    storages = [shallow_copy(s.storage) for s in option.shards]  # the plan's own, one per distinct shard
    perfs = [shallow_copy(s.perf) for s in option.shards]
    # TorchRec's lists of sizes and offsets, as its enumerator keeps them (one list for every data-parallel shard)
    full.shards = [Shard(size=size, offset=offset, storage=storages[i], perf=perfs[i])
                   for size, offset, i in zip(sizes, offsets, layout.index.tolist(), strict=True)]
    return full


def expand_all(options: List[ShardingOption]) -> List[ShardingOption]:
    return [expand(o) for o in options]
