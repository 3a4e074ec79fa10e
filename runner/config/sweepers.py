"""The runner's sweepers (runner/launch/plugins/hydra_plugins/runner_launcher/), each declared once, here, by its
class (``hydra.sweeper._target_``): the grid sweeper in place of Hydra's, for a sweep the pre-check composed and
validated point by point (the pre-check names it in ``hydra.sweeper._target_``; a sweep's recorded command leaves
that out); ``hydra/sweeper=optuna`` (conf/hydra/sweeper/optuna.yaml) names the runner's Optuna sweeper itself.
The pre-check, the preview and the sweep's parent read the declaration; nothing else names a sweeper. Adding one
is its plugin, its conf file, its declaration below and its test (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

from runner.config.errors import ConfigError


@dataclass(frozen=True)
class Sweeper:
    target: str
    """Its class, as ``hydra.sweeper._target_`` names it."""
    grid: bool
    """It runs every point of the swept values' product: the sweep's size is known as it starts, and the preview
    lists and checks its points; False: it draws its points as it runs."""
    previews: Optional[str] = None
    """``module:function`` that shows what it would run, for ``--dry-run``: ``(first, args) -> exit code``
    (``first``: the first point's config with Hydra's); None: its grid's points, each checked."""
    replaces: Optional[str] = None
    """Hydra's sweeper it stands in for, once the pre-check has checked every point (``hydra.sweeper._target_``)."""


CHECKED_SWEEPER = "hydra_plugins.runner_launcher.basic_sweeper.CheckedBasicSweeper"
OPTUNA_SWEEPER = "hydra_plugins.runner_launcher.optuna_sweeper.OptunaSweeper"
SWEEPERS: Dict[str, Sweeper] = {s.target: s for s in (
    Sweeper(CHECKED_SWEEPER, grid=True, replaces="hydra._internal.core_plugins.basic_sweeper.BasicSweeper"),
    Sweeper(OPTUNA_SWEEPER, grid=False, previews="runner.launch.sweep.preview:search_preview"),
)}
RUNNER_SWEEPERS = {s.replaces: t for t, s in SWEEPERS.items() if s.replaces}
"""Hydra's sweeper -> the runner's that stands in for it."""


def sweeper_of(target: str) -> Sweeper:
    """The declaration of the sweeper ``hydra.sweeper._target_`` names (Hydra's grid sweeper: the runner's)."""
    try:
        return SWEEPERS[RUNNER_SWEEPERS.get(target, target)]
    except KeyError:
        raise ConfigError("hydra.sweeper._target_", target, f"one of {sorted({*SWEEPERS, *RUNNER_SWEEPERS})} "
                          "(runner/config/sweepers.py)") from None
