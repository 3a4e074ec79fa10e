"""Paired sweep axes: keys whose values are taken position by position instead of crossed.

``cluster.cross_node_bandwidth=pair(3,12.5,50) sharding.storage_reserve_percent=pair(0.05,0.15,0.3)`` is three
points, (3, 0.05), (12.5, 0.15), (50, 0.3); an ordinary sweep axis crosses them as usual. On the command line
:func:`rewrite` turns ``pair(...)`` into Hydra's own grammar, a tagged choice (``tag(pair,choice(...))``, which
may also be written directly), so that every part of the runner that reads a sweep (the pre-check, Hydra's grid
sweeper, resume, the sweep's records) parses it as Hydra does; :func:`pair_axes` and :func:`point` make the
points, the same in the pre-check and in the sweeper.
"""

from __future__ import annotations

import re
from typing import Dict, List, Sequence

from runner.config.errors import ConfigError

PAIR_TAG = "pair"
_JOIN = "\x1e"  # between the overrides of one paired value (never in an override Hydra parses)
_PAIR = re.compile(r"^([^=()\s]+)=pair\((.*)\)$")


def rewrite(args: Sequence[str]) -> List[str]:
    """``key=pair(a,b,c)`` as ``key=tag(pair,choice(a,b,c))``; every other argument as it is."""
    return [f"{m.group(1)}=tag({PAIR_TAG},choice({m.group(2)}))" if (m := _PAIR.match(a)) else a for a in args]


def is_paired(override: object) -> bool:
    """Whether a parsed Hydra override is a paired axis (a choice sweep tagged ``pair``)."""
    is_sweep = getattr(override, "is_sweep_override", lambda: False)()
    value = getattr(override, "value", lambda: None)()
    return bool(is_sweep and PAIR_TAG in (getattr(value, "tags", None) or ()))


def _key(text: str) -> str:
    return text.split("=", 1)[0]


def pair_axes(values: List[List[str]], paired: List[bool]) -> List[List[str]]:
    """Each override's values (one list per override, ``key=value`` strings) as the sweep's axes: the paired
    overrides' lists zipped into one axis (where the first of them stands), the others as they are. Lists of
    unequal lengths are one :class:`ConfigError` naming both keys and lengths."""
    group = [v for v, p in zip(values, paired, strict=True) if p]
    if not group:
        return values
    first = group[0]
    for other in group[1:]:
        if len(other) != len(first):
            a, b = _key(first[0]), _key(other[0])
            raise ConfigError(f"{a}, {b}", f"pair() of {len(first)} and of {len(other)} values",
                              f"paired axes of the same length (pair() takes values position by position: give "
                              f"{a} and {b} as many values each)")
    zipped = [_JOIN.join(parts) for parts in zip(*group, strict=True)]
    return [zipped if p else v for v, p in zip(values, paired, strict=True) if not p or v is first]


def point(combo: Sequence[str], order: Sequence[str]) -> List[str]:
    """One point's overrides from one value of each axis, in the command line's order of keys (``order``)."""
    parts = [p for entry in combo for p in entry.split(_JOIN)]
    rank: Dict[str, int] = {k: i for i, k in enumerate(order)}
    return sorted(parts, key=lambda p: rank.get(_key(p), len(rank)))
