"""Deep copies of the planner's small dataclasses (shards, storage, perf, devices), done faster and the same.

TorchRec's planner deep-copies its search space (every option's shards) and, for every table-row-wise
option of every proposal, the devices of each host it tries: at a thousand tables that is a fifth of a
plan's time, most of it in ``copy``'s generic path for dataclass instances (``__reduce_ex__``, then the
state rebuilt). :func:`quick_copies` registers, while a plan is made, a copier for those exact classes
that does what the generic path does (a new instance, each field deep-copied through the same memo,
numbers, strings and None kept, lists of them copied once per list) without the detour; the copies are
the same objects field by field, shared parts still shared.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Any, Dict, Iterator

from torchrec.distributed.planner.types import DeviceHardware, Perf, Shard, Storage

_ATOMIC = (int, float, str, bool, type(None))
_COPIED = (Storage, Perf, Shard, DeviceHardware)
_PLAIN: Dict[type, bool] = {}  # class -> a plain dataclass (:func:`_plain`), as first asked


def _copy_fields(instance: Any, memo: Dict[int, Any]) -> Any:
    cls = type(instance)
    out = object.__new__(cls)  # TorchRec's: plain dataclasses
    fields = out.__dict__
    for name, value in instance.__dict__.items():
        kind = type(value)
        if kind in _ATOMIC:
            fields[name] = value
        elif kind is list and all(type(item) in _ATOMIC for item in value):
            copied = memo.get(id(value))
            if copied is None:
                copied = memo[id(value)] = list(value)
                memo.setdefault(id(memo), []).append(value)  # as copy keeps originals alive while it copies
            fields[name] = copied
        else:
            fields[name] = copy.deepcopy(value, memo)
    return out


def _plain(cls: type) -> bool:
    """Copied by ``copy``'s generic path: no copy hooks of its own, no slots."""
    return all(name not in vars(cls) for name in ("__deepcopy__", "__reduce__", "__reduce_ex__", "__setstate__",
                                                  "__getstate__", "__slots__"))


def shallow_copy(instance: Any) -> Any:
    """``copy.copy(instance)`` for the planner's dataclasses, without ``copy``'s generic detour: a new instance with
    the same fields (other objects: ``copy.copy``)."""
    cls = type(instance)
    plain = _PLAIN.get(cls)
    if plain is None:
        plain = _PLAIN[cls] = cls in _COPIED and _plain(cls)
    if not plain:
        return copy.copy(instance)
    out = object.__new__(cls)
    out.__dict__.update(instance.__dict__)
    return out


@contextmanager
def quick_copies() -> Iterator[None]:
    """While open, deep copies of the planner's dataclasses take :func:`_copy_fields`."""
    dispatch = copy._deepcopy_dispatch  # type: ignore[attr-defined]
    added = [cls for cls in _COPIED if cls not in dispatch and _plain(cls)]
    for cls in added:
        dispatch[cls] = _copy_fields
    try:
        yield
    finally:
        for cls in added:
            dispatch.pop(cls, None)
