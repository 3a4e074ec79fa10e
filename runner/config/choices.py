"""Keys with a closed set of values. The schema states each set once, on the key's own field (:func:`one_of`,
:func:`some_of`); :func:`runner.config.validation.check_choices` checks every such key of a config against it, and
``--help`` shows it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

_ALLOWED = "allowed"
_NULL = "null"
_SAID = "said"


def one_of(default: Optional[str], allowed: Sequence[str], null: bool = False, said: Mapping[str, str] = {}) -> Any:
    """A field whose value is one of ``allowed`` (or null, with ``null=True``); ``said``: what some of them are, in
    a few words (a declaration's summaries, for ``--help``)."""
    return dataclasses.field(default=default, metadata={_ALLOWED: tuple(allowed), _NULL: null, _SAID: dict(said)})


def some_of(allowed: Sequence[str], null: bool = False) -> Any:
    """A list field whose items are each one of ``allowed``; empty by default, or null with ``null=True``."""
    metadata = {_ALLOWED: tuple(allowed), _NULL: null}
    if null:
        return dataclasses.field(default=None, metadata=metadata)
    return dataclasses.field(default_factory=list, metadata=metadata)


def allowed_values(f: dataclasses.Field) -> Optional[Tuple[Tuple[str, ...], bool]]:
    """``(values, null allowed)`` of a field made by :func:`one_of`/:func:`some_of`; None for any other."""
    if _ALLOWED not in f.metadata:
        return None
    return f.metadata[_ALLOWED], f.metadata[_NULL]


def said_of(f: dataclasses.Field) -> Dict[str, str]:
    """What each allowed value of a field made by :func:`one_of` is, where its declaration says."""
    return dict(f.metadata.get(_SAID, {}))


def describe(values: Sequence[str], null: bool, said: Mapping[str, str] = {}) -> str:
    joined = ("; " if said else ", ").join(f"{v}: {said[v]}" if v in said else v for v in values)  # "a: what a is; b"
    return ("null or " if null else "") + "one of " + joined
