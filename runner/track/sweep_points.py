"""A sweep's points as the runner names them: the swept keys and their values, the paired ones, a point's
name (``xbw=6 reserve=0.15``) and the parent's, and ``sweep.json``, where each point's driver finds its sweep.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from omegaconf import DictConfig, OmegaConf

from runner.runtime import run_files

SWEEP_FILE = "sweep.json"
SHORT_NAMES = {"cross_node_bandwidth": "xbw", "intra_node_bandwidth": "ibw", "storage_reserve_percent": "reserve"}


def _parsed(texts: Iterable[str]) -> Iterator[Tuple[str, Any]]:
    """Each override text that Hydra parses, with its parsed override (the others passed over)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for text in texts:
        try:
            (override,) = OverridesParser.create().parse_overrides([text])
        except Exception:  # noqa: BLE001
            continue
        yield text, override


def swept_params(config: DictConfig) -> Dict[str, List[str]]:
    """Swept key -> its values, from the command line's sweep overrides and ``hydra.sweeper.params``."""
    texts = list(config.hydra.overrides.task)
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    texts += [f"{k}={v}" for k, v in params.items()]
    out: Dict[str, List[str]] = {}
    for text, override in _parsed(texts):
        if not override.is_sweep_override():
            continue
        key = override.get_key_element().lstrip("+~")
        try:
            out[key] = [str(v) for v in override.sweep_string_iterator()]
        except Exception:  # glob() and samplers' ranges: shown as written
            out[key] = [text.split("=", 1)[1]]
    return out


def paired_keys(config: DictConfig) -> List[str]:
    """The swept keys taken position by position (``pair(...)``: :mod:`runner.config.paired`)."""
    from runner.config.paired import is_paired

    return [o.get_key_element().lstrip("+~") for _, o in _parsed(config.hydra.overrides.task) if is_paired(o)]


def grid_size(swept: Dict[str, List[str]], paired: List[str]) -> int:
    """How many points a grid of ``swept`` keys has, the ``paired`` ones counted as one axis."""
    crossed = math.prod(len(v) for k, v in swept.items() if k not in paired)
    return crossed * (len(swept[paired[0]]) if paired else 1)


def sweep_of(run_folder: Path) -> Optional[Path]:
    """The sweep folder ``run_folder`` is a point of (its parent holds ``sweep.json``), or None for a single job."""
    return run_folder.parent if (run_folder.parent / SWEEP_FILE).exists() else None


def sweep_info(sweep_folder: Optional[str]) -> Dict[str, Any]:
    """``sweep.json`` of a sweep folder: ``parent_run_id`` and ``swept`` keys ({} outside a sweep)."""
    found = run_files.read_json(Path(sweep_folder) / SWEEP_FILE) if sweep_folder else None
    return found if isinstance(found, dict) else {}


def parent_run_id(sweep_folder: Optional[str]) -> Optional[str]:
    """The sweep's parent run id, written by :class:`SweepParentRun` into the sweep folder."""
    return sweep_info(sweep_folder).get("parent_run_id")


def point_values(swept: List[str], config: Mapping[str, Any], choices: Mapping[str, Any]) -> Dict[str, str]:
    """This point's value of each swept key (a group's chosen option, or its value in ``config``: the job's, as
    its run records it)."""
    out, tree = {}, OmegaConf.create(dict(config))
    for key in swept:
        value = choices.get(key) if key in choices else OmegaConf.select(tree, key, default=None)
        out[key] = "null" if value is None else str(value)
    return out


def point_name(values: Mapping[str, str]) -> str:
    """A run name that says which point it is: ``xbw=6 reserve=0.15`` (short names of the swept keys)."""
    return " ".join(f"{SHORT_NAMES.get(k.split('.')[-1], k.split('.')[-1])}={v}" for k, v in values.items())


def sweep_name(swept: List[str], sweep_folder: Path) -> str:
    """The parent run's name: what the sweep varies and its folder, e.g. ``sweep xbw x reserve (10-03-12)``."""
    keys = " x ".join(SHORT_NAMES.get(k.split(".")[-1], k.split(".")[-1]) for k in swept)
    return f"sweep {keys} ({sweep_folder.name})" if keys else f"sweep {sweep_folder.name}"
