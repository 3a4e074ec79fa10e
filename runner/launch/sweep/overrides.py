"""The command line's overrides as the pre-check reads them: which arguments are overrides, each sweep's
values (``glob()`` and ranges expanded, intervals by their ends, an experiment file's own sweeps), and the
combinations composed so that every value is composed once (:mod:`runner.launch.sweep.precheck`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Tuple, cast

if TYPE_CHECKING:
    from hydra.core.config_loader import ConfigLoader
    from hydra.core.override_parser.types import IntervalSweep

from runner.config import paired
from runner.config.errors import ConfigError

# Hydra flags that take a value; the value is not an override.
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-path", "-cp",
                     "--config-dir", "-cd", "--experimental-rerun"}
_FLAGS_WITHOUT_CHECK = {"--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion", "-sc",
                        "--version", "--experimental-rerun"}


def split_args(args: List[str]) -> tuple[List[str], Optional[str], bool]:
    """Overrides, the config name, and whether the arguments allow a pre-check at all."""
    overrides, config_name, checkable, skip = [], None, True, False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        flag = a.split("=", 1)[0]
        if flag in _FLAGS_WITHOUT_CHECK or flag in ("--config-path", "-cp", "--config-dir", "-cd"):
            checkable = False
        if flag in ("--config-name", "-cn"):
            config_name = a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else None)
        if a.startswith("-"):
            skip = flag in _FLAGS_WITH_VALUE and "=" not in a
            continue
        overrides.append(a)
    return overrides, config_name, checkable


def sweep_values(overrides: List[str], loader: Optional[ConfigLoader] = None) -> List[List[str]]:
    """Each override's values (one for a plain override). ``glob()`` is expanded over the group's options;
    a sampler's ``interval()`` is left to the sweeper."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    parsed = []
    for text in overrides:
        try:
            parsed.extend(parser.parse_overrides([text]))
        except Exception:  # noqa: BLE001 - Hydra's grammar error names the lexer, not the fix
            raise ConfigError(text.split("=", 1)[0], text.partition("=")[2],
                              "a value Hydra's override grammar can read: quote one with spaces or special "
                              f"characters, e.g. '{text.split('=', 1)[0]}=\"{text.partition('=')[2]}\"' (the "
                              "outer quotes keep the shell from splitting it)") from None
    values = []
    for text, o in zip(overrides, parsed, strict=True):
        if o.is_interval_sweep():  # the sampler draws inside it: both ends must be allowed
            key, ends = o.get_key_element(), cast("IntervalSweep", o.value())
            values.append([f"{key}={ends.start}", f"{key}={ends.end}"])
            continue
        if o.is_sweep_override():
            o.config_loader = loader  # glob() reads the group's options through it
            key = o.get_key_element()
            values.append([f"{key}={v}" for v in o.sweep_string_iterator()] or [text])
        else:
            values.append([text])
    return values


def sweep_axes(overrides: List[str], loader: Optional[ConfigLoader] = None) -> Tuple[List[List[str]], List[str]]:
    """The sweep's axes (:func:`sweep_values`, with paired overrides zipped into one axis:
    :mod:`runner.config.paired`) and the overrides' keys in the command's order (to put a point's overrides in)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    values = sweep_values(overrides, loader)
    order = [v[0].split("=", 1)[0] for v in values]
    parser = OverridesParser.create()
    flags = [paired.is_paired(parser.parse_overrides([text])[0]) for text in overrides]
    return paired.pair_axes(values, flags), order


def combinations(values: List[List[str]], order: Optional[List[str]] = None) -> List[List[str]]:
    """First value of every axis, then each other value of an axis once: every value is composed once (each
    combination as a point's overrides, in ``order``: :func:`runner.config.paired.point`)."""
    combos = [[v[0] for v in values]]
    for i, vs in enumerate(values):
        for v in vs[1:]:
            combos.append([c if j != i else v for j, c in enumerate(combos[0])])
    return [paired.point(c, order or []) for c in combos]


def file_sweeps(overrides: List[str], config_name: Optional[str], loader: ConfigLoader) -> List[str]:
    """Sweeps an experiment file sets in ``hydra.sweeper.params`` (not overridden on the command line)."""
    from hydra import compose

    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    first = combinations(sweep_values(overrides, loader))[0]
    cfg = compose(config_name=config_name or "config", overrides=first, return_hydra_config=True)
    params = cfg.hydra.sweeper.get("params") or {}
    return [f"{k}={v}" for k, v in params.items() if k not in keys]
