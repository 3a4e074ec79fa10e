"""The uniform shards of many proposals placed once: TorchRec's greedy partitioner, its first step shared.

TorchRec's ``GreedyPerfPartitioner`` starts every proposal by placing its uniform options (row-wise and
data-parallel: one shard per device, shard i on device i) in the proposal's order on fresh copies of the
reserved devices, subtracting each shard's storage and adding its perf device by device. The devices it
starts from are the same for every proposal of a search, and the dynamic-programming proposer's proposals
differ from one another in a few tables, so most of those placements repeat one another (docs/planning.md
gives the counts at 1000 tables on 128 GPUs).

:func:`shared_uniform_prefixes` keeps, while a search runs, the devices' storage and perf after each prefix
of uniform options already placed (a trie keyed by the options' identities) and places only the rest, with
TorchRec's own ``_uniform_partition``, option by option. The state reached is the same objects TorchRec
computes (the same subtractions and additions, in the same order, from the same start), every shard gets the rank
TorchRec gives it, and a shard that does not fit fails in TorchRec's own call with its own message. Calls from elsewhere
(a host's devices for a table-row-wise option) and starts that differ from the search's are TorchRec's call unchanged.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Tuple

from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.types import DeviceHardware, ShardingOption

State = List[Tuple[Any, Any]]  # each device's (storage, perf): dataclasses TorchRec never changes in place


class _Node:
    __slots__ = ("state", "children")

    def __init__(self, state: State) -> None:
        self.state = state
        self.children: Dict[int, "_Node"] = {}


def _state(devices: List[DeviceHardware]) -> State:
    return [(d.storage, d.perf) for d in devices]


class _UniformPrefixes:
    """TorchRec's ``_uniform_partition`` with the placements of earlier calls from the search's start kept. ``start``:
    the reserved devices, whose fresh copies (same ranks, equal storage and perf) every partition starts from."""

    def __init__(self, place: Callable[[List[ShardingOption], List[DeviceHardware]], None],
                 start: List[DeviceHardware]) -> None:
        self.place = place
        self.root = _Node(_state(start))
        self.ranks = [d.rank for d in start]
        self.reused = self.placed = 0  # uniform options whose placement was reused / placed from the start

    def _from_start(self, devices: List[DeviceHardware]) -> bool:
        return len(devices) == len(self.ranks) and all(
            d.rank == r and d.storage == s and d.perf == p
            for d, r, (s, p) in zip(devices, self.ranks, self.root.state, strict=True))

    def __call__(self, options: List[ShardingOption], devices: List[DeviceHardware]) -> None:
        if not options or not self._from_start(devices):
            self.place(options, devices)  # another start (a host's devices): TorchRec's call as it is
            return
        node, done = self.root, 0
        for option in options:
            child = node.children.get(id(option))
            if child is None:
                break
            node, done = child, done + 1
        self.reused, self.placed = self.reused + done, self.placed + len(options) - done
        if done:
            for option in options[:done]:
                for shard, rank in zip(option.shards, self.ranks, strict=True):
                    shard.rank = rank
            for device, (storage, perf) in zip(devices, node.state, strict=True):
                device.storage, device.perf = storage, perf
        for option in options[done:]:
            self.place([option], devices)  # raises as TorchRec does when a shard does not fit
            child = _Node(_state(devices))
            node.children[id(option)] = child
            node = child


@contextmanager
def shared_uniform_prefixes(start: List[DeviceHardware]) -> Iterator[_UniformPrefixes]:
    """While open (one search: its options stay alive, and their identities key the trie), TorchRec's partitioner places
    uniform options through :class:`_UniformPrefixes` from the reserved devices ``start`` (yielded: its counts)."""
    original = GreedyPerfPartitioner.__dict__["_uniform_partition"]
    prefixes = _UniformPrefixes(original.__func__, start)
    GreedyPerfPartitioner._uniform_partition = staticmethod(prefixes)
    try:
        yield prefixes
    finally:
        GreedyPerfPartitioner._uniform_partition = original
