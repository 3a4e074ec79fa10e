"""What a part's declaration names as ``module:name`` (a builder, a class, a check), imported when first used: how
every declared kind of part (model family, schedule, data source, proposer) is reached from its declaration."""

from __future__ import annotations

import functools
import importlib
from typing import Any


@functools.lru_cache(maxsize=None)
def part(spec: str) -> Any:
    """The function or class ``spec`` (``module:name``) declares."""
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)
