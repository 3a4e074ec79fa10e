"""Which constants a job plans with: ``cluster.calibration`` chooses a calibration (:mod:`.calibration`) or TorchRec's
defaults, for the hardware the job runs on (:func:`for_config`): ``auto`` the newest kept calibration of this
hardware that trusts a part, its untrusted parts fallen back (:mod:`.trust`); ``none`` TorchRec's constants, byte for
byte; a file, used whole or refused in one line. Each choice comes with the line that says so.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from runner.config.errors import first_line
from runner.config.modes import MODES
from runner.plan.cost.calibration import (
    AUTO,
    NONE,
    SUFFIX,
    Calibration,
    cache_dir,
    cached_load,
    load_calibration,
    refused,
    whole_or_refused,
)
from runner.plan.cost.trust import PARTS, fallen_back, fell_back_note
from runner.runtime.hardware import fingerprint, mismatch

if TYPE_CHECKING:
    import torch

    from runner.config.schema import ClusterSchema


@dataclass(frozen=True)
class Chosen:
    """The calibration a job plans with (None: TorchRec's default constants) and the line that says so."""

    calibration: Optional[Calibration]
    note: str

    @property
    def tag(self) -> str:
        return (self.calibration.path or "in memory") if self.calibration is not None else NONE


def newest_matching(folder: Path, here: Dict[str, Any], world_matters: bool
                    ) -> Tuple[Optional[Calibration], List[str]]:
    """The newest calibration in ``folder`` whose fingerprint matches ``here`` and that trusts at least one part
    (where the world does not have to match, one of the same world first), and why each newer file that cannot be
    read was passed over (``auto`` only takes what fits, and says what it skipped)."""
    fits: List[Calibration] = []
    skipped: List[str] = []
    for path in sorted(folder.glob(f"*{SUFFIX}"), reverse=True):
        try:
            cal = cached_load(str(path), path.stat().st_mtime_ns)
        except (ValueError, OSError) as exc:
            if not fits:
                skipped.append(f"skipped {path.name}: {first_line(exc).split(' cannot be used: ', 1)[-1]}")
            continue
        if len(cal.untrusted()) < len(PARTS) and mismatch(cal.fingerprint, here, world_matters) is None:
            fits.append(cal)
    same = [c for c in fits if mismatch(c.fingerprint, here, True) is None]
    return ((same or fits)[0] if fits else None), skipped[:3]


_fingerprint = functools.lru_cache(maxsize=8)(fingerprint)


def for_job(cluster: ClusterSchema, device_kind: str, here_is_job: bool,
            device: Optional[torch.device] = None) -> Chosen:
    """The calibration ``cluster.calibration`` chooses for a plan on ``device_kind``; ``here_is_job``: the job runs
    on this machine (training: the fingerprint, world shape included, must match), else a plan for a cluster that
    may not be here (a file is taken when its device kind is the plan's; ``auto`` takes this machine's when the plan
    is for its kind of device, one of the plan's world first). Files are read again when they change."""
    setting, default = str(cluster.calibration), "TorchRec's default constants"
    if setting == NONE:
        return Chosen(None, f"{default} (cluster.calibration=none)")
    nodes, workers = int(cluster.nodes), int(cluster.workers_per_node)
    if setting == AUTO:
        where = cache_dir(cluster.calibration_dir)
        found: Optional[Calibration] = None
        skipped: List[str] = []
        if (here_is_job or device_kind == "cpu") and where.is_dir() and any(where.glob(f"*{SUFFIX}")):
            # the hardware is here (a training job, or a plan for this machine's kind of device): its fingerprint
            found, skipped = newest_matching(where, _fingerprint(device_kind, nodes, workers, device), here_is_job)
        passed = f" ({'; '.join(skipped)})" if skipped else ""
        if found is None:
            return Chosen(None, f"{default}: no calibration of this hardware in {where} (python -m runner "
                                f"mode=calibrate makes one){passed}")
        fell = fell_back_note(found)
        return Chosen(fallen_back(found), f"this machine's {found.label()}" + (f"; {fell}" if fell else "") + passed)
    path = Path(setting)
    cal = whole_or_refused(cached_load(str(path), path.stat().st_mtime_ns) if path.is_file()
                           else load_calibration(setting))
    if here_is_job:
        differs = mismatch(cal.fingerprint, _fingerprint(device_kind, nodes, workers, device), True)
        if differs is not None:
            raise refused(setting, f"it was made on other hardware ({differs})")
    elif cal.fingerprint.get("device_kind") != device_kind:
        raise refused(setting, f"it was made on {cal.fingerprint.get('device_kind')}, the plan is for {device_kind}")
    fell = fell_back_note(cal)
    return Chosen(fallen_back(cal), cal.label() + (f"; {fell}" if fell else ""))


def for_config(cluster: ClusterSchema, mode: str, device_type: str) -> Chosen:
    """The calibration ``cluster.calibration`` chooses for a job of ``mode`` (:func:`for_job`): a training job's
    hardware is this process's (its GPU on CUDA); a plan-only job may be for a cluster that is not here."""
    here = MODES[mode].on_workers
    device = None
    if here and device_type == "cuda" and str(cluster.calibration) != NONE:
        import torch

        device = torch.cuda.current_device() if torch.cuda.is_available() else None
    return for_job(cluster, device_type, here, device)


def hashed(cluster: ClusterSchema, mode: str, config: Dict[str, Any]) -> Dict[str, Any]:
    """``config`` (a job's config resolved, as a dict; ``cluster`` and ``mode`` its own) as ``runner.config_hash`` and
    ``sweep.reuse`` compare it: for a plan-only job, ``cluster.calibration`` is the calibration it plans with (its file
    and when it was made), not the word, so that a new calibration is another answer. Other jobs: as it is."""
    if not MODES[mode].answer_is_plan:
        return config
    from runner.runtime.device import device_type

    chosen = for_config(cluster, mode, device_type(cluster.device, planning=True))
    made = chosen.calibration.made if chosen.calibration is not None else ""
    return {**config, "cluster": {**config["cluster"], "calibration": f"{chosen.tag}@{made}"}}
