"""Where a job runs, learned once while it starts, kept apart from the config it was asked with.

A job's config is what the user composed; it is read-only once the job starts (:func:`freeze`). What the job
learns about where it runs is a :class:`Place`: the scheduler that runs it and, as one of a scheduler's tasks, its
node rank, rendezvous host and port and the checkpoint folder every node shares (taken from the scheduler by
:mod:`runner.launch.schedulers`); the host memory each worker may plan with (``cluster.ddr_cap_gib`` reconciled
with the host's, on CUDA hosts). The driver works it out once and writes it in the run folder
(``place.json``); the config its workers run is the composed one with the place's values
(:meth:`Place.applied`), and the workers read the rest of the place from that file.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional, cast

from runner.config.schema import freeze

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig

PLACE_FILE = "place.json"


@dataclass(frozen=True)
class Place:
    scheduler: str = "local"
    """The scheduler that runs the job (:mod:`runner.launch.schedulers`)."""
    node_rank: Optional[int] = None
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    """This node's rank and the rendezvous, as a scheduler's task was given them (None: the config's)."""
    checkpoint_dir: Optional[str] = None
    """The checkpoint folder every node writes one distributed checkpoint to (None: the config's)."""
    ddr_cap_gib: Optional[float] = None
    """Host memory per worker the planner may use, reconciled with this host's (None: the config's)."""

    def applied(self, cfg: RunnerConfig) -> RunnerConfig:
        """``cfg`` with this place's node, rendezvous and checkpoint folder (a new, read-only config; ``cfg``
        itself unchanged)."""
        from omegaconf import OmegaConf

        given = {key: getattr(self, key) for key in ("node_rank", "master_addr", "master_port")}
        changes: Dict[str, Any] = {"cluster": {"scheduler": self.scheduler,
                                               **{k: v for k, v in given.items() if v is not None}}}
        if self.checkpoint_dir is not None:
            changes["train"] = {"checkpoint": {"dir": self.checkpoint_dir}}
        return freeze(cast("RunnerConfig", OmegaConf.merge(cfg, changes)))

    def write(self, run_folder: Path) -> None:
        (run_folder / PLACE_FILE).write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")


def read_place(run_folder: Path) -> Optional[Place]:
    """The place the driver recorded in ``run_folder`` (None under a plain torchrun, where no driver records one)."""
    try:
        found = json.loads((run_folder / PLACE_FILE).read_text())
    except (OSError, ValueError):
        return None
    names = {f.name for f in dataclasses.fields(Place)}
    return Place(**{k: v for k, v in found.items() if k in names}) if isinstance(found, dict) else None
