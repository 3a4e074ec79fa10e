"""A calibration: the planner's cost model fitted to one machine, as a file.

``python -m runner mode=calibrate`` measures the job's own workers (:mod:`runner.train.calibrate`), fits the
measurements (:mod:`runner.plan.cost_fit`) and writes a :class:`Calibration`: a versioned YAML file with the
hardware's fingerprint (:mod:`runner.runtime.hardware`), the fitted constants, the spread of the repeats and the
measurements themselves. ``cluster.calibration`` chooses the one a plan uses (:func:`for_job`): ``auto`` the newest
in the cache folder whose fingerprint matches, ``none`` TorchRec's default constants, byte for byte, or a file.

What a calibration sets, and where: TorchRec's own knobs where it has them (:func:`topology_knobs`: the device's
memory bandwidth that FBGEMM's fused kernel reaches, the backward-to-forward ratio, and the bandwidths between
workers where the config leaves them null), so TorchRec's estimators, its planner and the runner's rate plans
with them; the runner's own terms where TorchRec has none (what a sharded lookup costs per call, per table and per
sample beyond TorchRec's bytes, the dense part, the optimizer, the input and the step's overhead), in the whole step
(:mod:`runner.plan.step_estimate`) and the plans' rating. FBGEMM's kernel's own fixed cost per call
(``kernel_call_*_ms``) is recorded beside them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

from runner.config.errors import config_error_line, first_line
from runner.config.schema import WORKER_MODES
from runner.plan.trust import PARTS, fallen_back, fell_back_note, value_faults
from runner.runtime.hardware import fingerprint, mismatch

if TYPE_CHECKING:
    import torch

    from runner.config.schema_model import ClusterSchema

FORMAT = 2  # the file format this runner writes and reads (2: trust per part, a digest); any other is refused
SUFFIX = ".calibration.yaml"
KEY = "cluster.calibration"
AUTO, NONE = "auto", "none"  # cluster.calibration's two words; anything else is a file
GIB = 1024**3


@dataclass
class Calibration:
    """One machine's fitted cost model (see the module doc). ``constants``: ``device_bw_gibps``,
    ``bwd_compute_multiplier``, ``kernel_call_fwd_ms``, ``kernel_call_bwd_ms``, ``intra_node_bandwidth`` and
    ``cross_node_bandwidth`` (GiB/s, None where not measured), ``collectives`` (``{name: {scope: {latency_ms,
    bandwidth_gibps}}}``), ``dense_fwd``/``dense_bwd`` (``fixed_ms``, ``ms_per_gflop``), ``optimizer``
    (``fixed_ms``, ``ms_per_mparam``), ``input`` (``fixed_ms``, ``ms_per_ksample``)."""

    fingerprint: Dict[str, Any]
    constants: Dict[str, Any]
    spread: Dict[str, float] = field(default_factory=dict)
    trusted: Dict[str, bool] = field(default_factory=lambda: {part: True for part in PARTS})
    """Each part's trust (:func:`runner.plan.trust.trust`)."""
    measurements: Dict[str, Any] = field(default_factory=dict)
    made: str = ""
    median_error: Dict[str, float] = field(default_factory=dict)  # each part's (:func:`runner.plan.trust.median_error`)
    learned: Dict[str, Any] = field(default_factory=dict)  # refitted from runs: how many, where (:mod:`.learn`)
    format: int = FORMAT
    path: Optional[str] = None  # where it was read from (not written)
    faults: Dict[str, str] = field(default_factory=dict)  # a part whose values fail their check: why (not written)

    def label(self) -> str:
        fp = self.fingerprint
        return (f"calibration {self.path or '(in memory)'} ({fp.get('device_name')}, {fp.get('nodes')} x "
                f"{fp.get('workers_per_node')} workers, made {self.made})")

    def with_constants(self, constants: Dict[str, Any]) -> Calibration:
        return dataclasses.replace(self, constants=constants)

    def untrusted(self) -> Dict[str, str]:
        """The parts that fall back, each with why: not trusted when measured, or a value failing its check."""
        out = {part: "its repeats scattered" for part in PARTS if not self.trusted.get(part, False)}
        out.update(self.faults)
        return out

def digest(data: Dict[str, Any]) -> str:
    """A calibration's content (everything it holds but the digest) as a hash: a file edited or cut short after it
    was written no longer matches, and never reaches a plan."""
    body = {k: v for k, v in data.items() if k not in ("digest", "path", "faults")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def save(cal: Calibration, path: Path) -> Path:
    """Write ``cal`` as YAML (whole: written aside, then moved into place)."""
    import yaml

    data = asdict(cal)
    data.pop("path")
    data.pop("faults")
    data["digest"] = digest(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(yaml.safe_dump(data, sort_keys=False))
    os.replace(part, path)
    return path


def _refused(path: Union[str, Path], why: str) -> Exception:
    return config_error_line(f"{KEY}={str(path)!r} cannot be used: {why}; make one on this machine with "
                             "python -m runner mode=calibrate, or plan with cluster.calibration=none", KEY)


def load_calibration(path: Union[str, Path]) -> Calibration:
    """The calibration at ``path``; a missing, damaged or newer-format file is a one-line ``ConfigError``."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise _refused(path, f"it cannot be read ({first_line(exc)})") from None
    if not isinstance(data, dict) or not isinstance(data.get("format"), int):
        raise _refused(path, "it is not a calibration file (no format number)")
    if data["format"] > FORMAT:
        raise _refused(path, f"its format {data['format']} is newer than this runner's ({FORMAT}): update the runner")
    if data["format"] < FORMAT:
        raise _refused(path, f"it was made by an older runner (format {data['format']}; this runner's is {FORMAT}): "
                             "measure again")
    if not isinstance(data.get("fingerprint"), dict) or not isinstance(data.get("constants"), dict):
        raise _refused(path, "it is damaged (no fingerprint or constants)")
    if data.get("digest") != digest(data):
        raise _refused(path, "it was changed after it was written (its digest does not match: edited or cut short)")
    trusted = data.get("trusted")
    if not isinstance(trusted, dict) or not all(isinstance(trusted.get(p), bool) for p in PARTS):
        raise _refused(path, f"it is damaged (trusted={trusted!r}, not true or false for each of {', '.join(PARTS)})")
    missing = [k for k in ("device_bw_gibps", "bwd_compute_multiplier", "kernel_call_fwd_ms", "kernel_call_bwd_ms")
               if not isinstance(data["constants"].get(k), (int, float))]
    missing += [k for k in FITS if not _is_fit(data["constants"].get(k), ("fixed_ms", "ms_per_unit"))]
    missing += [f"sharded.{k}" for k, fits in (data["constants"].get("sharded") or {}).items()
                if not all(_is_fit((fits or {}).get(p), LOOKUP_TERMS) for p in ("fwd", "bwd"))]
    if missing:
        raise _refused(path, f"it is damaged (no {', '.join(missing)})")
    known = {k: data[k] for k in ("fingerprint", "constants", "spread", "trusted", "measurements", "made",
                                  "median_error", "learned", "format") if k in data}
    return Calibration(**known, path=str(path), faults=value_faults(data["constants"]))


def whole_or_refused(cal: Calibration) -> Calibration:
    """``cal`` (given by path) when every value passes its check; else refused in one line naming the key and
    value (a file the user names is used whole or not at all: under ``auto`` a failing part falls back alone)."""
    if cal.faults:
        part, why = next(iter(cal.faults.items()))
        raise _refused(cal.path or "(in memory)", f"its {part} constant {why}")
    return cal


def check_file(setting: str) -> None:
    """``cluster.calibration`` naming a file: refused in one line (``ConfigError``) when it cannot be used as a
    calibration (whether it fits the hardware is asked where the job's hardware is known, :func:`for_job`)."""
    if str(setting) not in (AUTO, NONE):
        whole_or_refused(load_calibration(setting))


def check_folder(configured: Optional[str]) -> None:
    """The folder ``mode=calibrate`` keeps its calibration in (:func:`cache_dir`): a folder, or one that can be made,
    writable, with room for a file; else refused in one line before anything is measured."""
    import shutil

    where, key = cache_dir(configured), "cluster.calibration_dir"

    def refuse(why: str) -> Exception:
        return config_error_line(f"{key}={str(where)!r} {why}: name a writable folder (or calibrate.keep=false)", key)
    if where.exists() and not where.is_dir():
        raise refuse("is a file, not a folder")
    existing = next(p for p in (where, *where.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise refuse(f"cannot be written ({existing} is not writable)")
    if shutil.disk_usage(existing).free < 1024**2:
        raise refuse(f"has no room ({existing}'s disk has under 1 MiB free)")


FITS = ("dense_fwd", "dense_bwd", "optimizer", "input")  # each ``fixed_ms`` + ``ms_per_unit`` x size
LOOKUP_TERMS = ("fixed_ms", "per_table_ms", "ms_per_table_ksample")  # a family of sharded lookup's, per direction


def _is_fit(fit: Any, keys: Tuple[str, ...]) -> bool:
    return isinstance(fit, dict) and all(isinstance(fit.get(k), (int, float)) for k in keys)


def cache_dir(configured: Optional[str] = None) -> Path:
    """Where calibrations are kept: ``cluster.calibration_dir``, else ``$RUNNER_CALIBRATION_DIR``, else
    ``$XDG_CACHE_HOME/runner/calibrations`` (``~/.cache/...``)."""
    configured = configured or os.environ.get("RUNNER_CALIBRATION_DIR")
    if configured:
        return Path(configured).expanduser().absolute()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "runner" / "calibrations"


def file_name(fp: Dict[str, Any]) -> str:
    """A calibration's file name in the cache: its device, world and time (newest sorts last)."""
    name = "".join(c if c.isalnum() else "-" for c in str(fp.get("device_name", "device")))[:40].strip("-")
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{fp.get('device_kind')}-{name}-{fp.get('nodes')}x" \
           f"{fp.get('workers_per_node')}{SUFFIX}"


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
            cal = _cached_load(str(path), path.stat().st_mtime_ns)
        except (ValueError, OSError) as exc:
            if not fits:
                skipped.append(f"skipped {path.name}: {first_line(exc).split(' cannot be used: ', 1)[-1]}")
            continue
        if len(cal.untrusted()) < len(PARTS) and mismatch(cal.fingerprint, here, world_matters) is None:
            fits.append(cal)
    same = [c for c in fits if mismatch(c.fingerprint, here, True) is None]
    return ((same or fits)[0] if fits else None), skipped[:3]


@functools.lru_cache(maxsize=64)
def _cached_load(path: str, mtime_ns: int) -> Calibration:
    return load_calibration(path)


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
    cal = whole_or_refused(_cached_load(str(path), path.stat().st_mtime_ns) if path.is_file()
                           else load_calibration(setting))
    if here_is_job:
        differs = mismatch(cal.fingerprint, _fingerprint(device_kind, nodes, workers, device), True)
        if differs is not None:
            raise _refused(setting, f"it was made on other hardware ({differs})")
    elif cal.fingerprint.get("device_kind") != device_kind:
        raise _refused(setting, f"it was made on {cal.fingerprint.get('device_kind')}, the plan is for {device_kind}")
    fell = fell_back_note(cal)
    return Chosen(fallen_back(cal), cal.label() + (f"; {fell}" if fell else ""))


def for_config(cluster: ClusterSchema, mode: str, device_type: str) -> Chosen:
    """The calibration ``cluster.calibration`` chooses for a job of ``mode`` (:func:`for_job`): a training job's
    hardware is this process's (its GPU on CUDA); a plan-only job may be for a cluster that is not here."""
    here = mode in WORKER_MODES
    device = None
    if here and device_type == "cuda" and str(cluster.calibration) != NONE:
        import torch

        device = torch.cuda.current_device() if torch.cuda.is_available() else None
    return for_job(cluster, device_type, here, device)


def hashed(cluster: ClusterSchema, mode: str, config: Dict[str, Any]) -> Dict[str, Any]:
    """``config`` (a job's config resolved, as a dict; ``cluster`` and ``mode`` its own) as ``runner.config_hash`` and
    ``sweep.reuse`` compare it: for a plan-only job, ``cluster.calibration`` is the calibration it plans with (its file
    and when it was made), not the word, so that a new calibration is another answer. Other jobs: as it is."""
    if mode != "plan":
        return config
    from runner.runtime.device import device_type

    chosen = for_config(cluster, mode, device_type(cluster.device, planning=True))
    made = chosen.calibration.made if chosen.calibration is not None else ""
    return {**config, "cluster": {**config["cluster"], "calibration": f"{chosen.tag}@{made}"}}
