"""Hydra's grid sweeper for a sweep whose every point the runner's pre-check has composed and validated
(:func:`runner.launch.precheck.precheck` names this class in ``hydra.sweeper._target_`` then): the same
sweeper, without composing each point once more in the sweep's process before launching it (the launcher
composes it again for the job; docs/architecture.md says what each composition costs), and ending in one
line on a full disk."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, List, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper


class CheckedBasicSweeper(BasicSweeper):
    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        return None  # every point was composed and validated by the runner's pre-check

    def sweep(self, arguments: List[str]) -> Any:
        """Hydra's grid sweep; a full disk where Hydra writes (``multirun.yaml``, a point's ``.hydra/``) ends
        the sweep in one line naming the path: its runs FAILED with it, the points answered so far kept for
        ``python -m runner resume`` (exit 1)."""
        from runner.config.errors import disk_full
        from runner.track.sweep import end_failed_sweep

        try:
            return super().sweep(arguments)
        except OSError as exc:
            line = disk_full(exc)
            if line is None:
                raise
            line = end_failed_sweep(f"disk full: {line}", Path(self.config.hydra.sweep.dir).resolve())
            print(f"error: {line}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None
