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
    module = inspect.getmodule(cls)
    assert module is not None  # a schema class is defined in a module
    tree = ast.parse(inspect.getsource(module))
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
    factory = getattr(f, "default_factory", dataclasses.MISSING)
    if factory is not dataclasses.MISSING:
        value = factory()
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
            doc, allowed = docs.get(f.name, ""), allowed_values(f)
            if allowed is not None:  # the schema's own list (the one validation checks)
                doc = f"{doc} [{describe(*allowed, said_of(f))}]".strip()
            if note := ROLE_NOTES.get(role(prefix + f.name)):
                doc = f"{doc} ({note})".strip()
            if readers := [n for n, p in PROPOSERS.items() if prefix == "sharding." and f.name in p.knobs]:
                doc = f"{doc} (read by sharding.proposer={', '.join(readers)})"
            out.append((f"{prefix}{f.name}", _default(f), doc))
    return out


def nearest_keys(key: str, limit: int = 3) -> List[str]:
    """The schema's keys nearest to ``key`` (a typo's likely meaning): close matches of the whole dotted key, else
    of its last part among the keys of its group."""
    import difflib

    from runner.config.schema import RunnerConfig

    keys = [k for k, _, _ in key_docs(RunnerConfig)]
    keys += sorted({k.split(".")[0] for k in keys if "." in k})  # the groups, for a mistyped group name
    found = difflib.get_close_matches(key, keys, limit, cutoff=0.75)
    if not found and "." in key:
        group, last = key.rsplit(".", 1)
        siblings = {k.rsplit(".", 1)[1]: k for k in keys if "." in k and k.rsplit(".", 1)[0] == group}
        found = [siblings[s] for s in difflib.get_close_matches(last, list(siblings), limit, cutoff=0.6)]
    return found


RETIRED = {
    "sharding.balanced_budget_s": "the balanced search is counted in work, not seconds, so that a config gives the "
    "same plan on any machine: sharding.balanced_work (evaluations), sharding.balanced_patience, "
    "sharding.balanced_gap; sharding.planner_timeout_s is the wall-clock safety stop",
}
"""Keys the runner had and has no more: what replaces each."""


def unknown_key_line(key: str, where: str) -> str:
    """One line for a key the schema does not have: where it came from and the nearest real keys (or, for a
    retired key, what replaces it)."""
    if key in RETIRED:
        return f"{key}: no longer a key ({where}): {RETIRED[key]}"
    near = nearest_keys(key)
    hint = f"did you mean {' or '.join(near)}?" if near else "python -m runner --help lists every key"
    return f"{key}: no such key ({where}); {hint}"


def check_known_keys(cfg: Any, combo: List[str]) -> None:
    """Every key of the composed config is the schema's: one added with ``+`` or by an experiment or config-dir
    file that the schema does not have is one line naming it, where it came from and the nearest real keys."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError

    from runner.config.errors import config_error_line
    from runner.config.schema import RunnerConfig

    try:
        OmegaConf.merge(OmegaConf.structured(RunnerConfig), OmegaConf.to_container(cfg, resolve=False))
    except ConfigKeyError as exc:
        key = str(exc.full_key)
        added = next((o for o in combo if o.lstrip("+").split("=", 1)[0] == key and o.startswith("+")), None)
        where = (f"added with {added.split('=', 1)[0]}" if added
                 else "in a config file: an experiment or --config-dir file")
        raise config_error_line(unknown_key_line(key, where), key) from None
