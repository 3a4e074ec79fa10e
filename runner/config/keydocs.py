"""Every config key's one-line doc, read from the schema's attribute docstrings (the source of truth),
for ``python -m runner --help``."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from typing import Any, Dict, List, Tuple

from runner.config.choices import allowed_values, describe, said_of
from runner.config.proposers import PROPOSERS
from runner.config.roles import ROLE_NOTES, role


def _attribute_docs(cls: type) -> Dict[str, str]:
    """``field -> first sentence-line of the string literal under it`` in ``cls``'s source."""
    tree = ast.parse(inspect.getsource(inspect.getmodule(cls)))  # type: ignore[arg-type]
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    docs, body = {}, node.body
    for a, b in zip(body, body[1:], strict=False):
        if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr) \
                and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str):
            docs[a.target.id] = " ".join(b.value.value.split()).replace("``", "`")
    return docs


def _default(f: Any) -> str:
    if f.default is not dataclasses.MISSING:
        if f.default is None or isinstance(f.default, bool):
            return str(f.default).lower().replace("none", "null")
        return str(f.default)
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        return "" if dataclasses.is_dataclass(value) else str(value)
    return "???"


def key_docs(cls: type, prefix: str = "") -> List[Tuple[str, str, str]]:
    """``(key, default, doc)`` of every leaf key of the dataclass ``cls``, in schema order; a key that is not part
    of a job's answer says so (:mod:`runner.config.roles`)."""
    out: List[Tuple[str, str, str]] = []
    docs = _attribute_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints.get(f.name)
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            out.extend(key_docs(kind, f"{prefix}{f.name}."))
        else:
            doc, spec = docs.get(f.name, ""), allowed_values(f)
            if spec is not None:  # the schema's own list (the one validation checks)
                doc = f"{doc} [{describe(*spec, said_of(f))}]".strip()
            if note := ROLE_NOTES.get(role(prefix + f.name)):
                doc = f"{doc} ({note})".strip()
            if readers := [n for n, p in PROPOSERS.items() if prefix == "sharding." and f.name in p.knobs]:
                doc = f"{doc} (read by sharding.proposer={', '.join(readers)})"
            out.append((f"{prefix}{f.name}", _default(f), doc))
    return out
