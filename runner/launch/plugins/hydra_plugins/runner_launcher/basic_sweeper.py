"""Hydra's grid sweeper for a sweep whose every point the runner's pre-check has composed and validated
(:func:`runner.launch.sweep.precheck.precheck` names this class in ``hydra.sweeper._target_`` then): the same
sweeper, without composing each point once more in the sweep's process before launching it (the launcher
composes it again for the job; docs/architecture.md says what each composition costs), and ending in one
line on a full disk."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper


class CheckedBasicSweeper(BasicSweeper):
    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        return None  # every point was composed and validated by the runner's pre-check

    @staticmethod
    def split_arguments(overrides: List[Any], max_batch_size: Optional[int]) -> List[List[List[str]]]:
        """Hydra's grid, with paired axes (``pair(...)``: :mod:`runner.config.paired`) taken position by
        position: the same points, in the same order and overrides, as the pre-check composed."""
        import itertools

        from runner.config.paired import is_paired, pair_axes, point

        lists: Dict[str, List[str]] = {}
        flags: Dict[str, bool] = {}
        for override in overrides:  # as Hydra's: a key given twice takes its last value
            key = override.get_key_element()
            lists[key] = ([f"{key}={v}" for v in override.sweep_string_iterator()] if override.is_sweep_override()
                          else [f"{key}={override.get_value_element_as_str()}"])
            flags[key] = is_paired(override)
        axes = pair_axes(list(lists.values()), list(flags.values()))
        points = [point(combo, list(lists)) for combo in itertools.product(*axes)]
        size = max_batch_size or len(points) or 1
        return [points[i:i + size] for i in range(0, len(points), size)] or [[]]

    def sweep(self, arguments: List[str]) -> Any:
        """Hydra's grid sweep; a full disk where Hydra writes (``multirun.yaml``, a point's ``.hydra/``) ends
        the sweep in one line naming the path: its runs FAILED with it, the points answered so far kept for
        ``python -m runner resume`` (exit 1)."""
        from runner.config.errors import disk_full
        from runner.launch.sweep.parent import end_failed_sweep

        try:
            return super().sweep(arguments)
        except OSError as exc:
            line = disk_full(exc)
            if line is None:
                raise
            assert self.config is not None  # Hydra set it up before sweeping
            line = end_failed_sweep(f"disk full: {line}", Path(self.config.hydra.sweep.dir).resolve())
            print(f"error: {line}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None
