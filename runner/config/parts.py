"""What a part's declaration names as ``module:name`` (a builder, a class, a check), imported when first used: how
every declared kind of part (model family, schedule, data source, proposer) is reached from its declaration."""

from __future__ import annotations

import functools
import importlib
from typing import Any


@functools.lru_cache(maxsize=None)
def part(target: str) -> Any:
    """The function or class ``target`` (``module:name``) declares."""
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)
