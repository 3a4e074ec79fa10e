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

import functools
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple, Union

from runner.config.errors import config_error_line, first_line
from runner.config.schema import WORKER_MODES
from runner.runtime.hardware import fingerprint, mismatch

if TYPE_CHECKING:
    import torch

    from runner.config.schema_model import ClusterSchema

FORMAT = 1  # the file format this runner writes and reads; a newer one is refused in one line
SUFFIX = ".calibration.yaml"
KEY = "cluster.calibration"
AUTO, NONE = "auto", "none"  # cluster.calibration's two words; anything else is a file
TORCHREC_INTRA_GIBPS, TORCHREC_CROSS_GIBPS = 600.0, 12.5  # TorchRec's defaults, the cluster keys' defaults too
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
    trusted: bool = True
    measurements: Dict[str, Any] = field(default_factory=dict)
    made: str = ""
    format: int = FORMAT
    path: Optional[str] = None  # where it was read from (not written)

    def label(self) -> str:
        fp = self.fingerprint
        return (f"calibration {self.path or '(in memory)'} ({fp.get('device_name')}, {fp.get('nodes')} x "
                f"{fp.get('workers_per_node')} workers, made {self.made})")


def save(cal: Calibration, path: Path) -> Path:
    """Write ``cal`` as YAML (whole: written aside, then moved into place)."""
    import yaml

    data = asdict(cal)
    data.pop("path")
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
    if not isinstance(data.get("fingerprint"), dict) or not isinstance(data.get("constants"), dict):
        raise _refused(path, "it is damaged (no fingerprint or constants)")
    missing = [k for k in ("device_bw_gibps", "bwd_compute_multiplier", "kernel_call_fwd_ms", "kernel_call_bwd_ms")
               if not isinstance(data["constants"].get(k), (int, float))]
    missing += [k for k in FITS if not _is_fit(data["constants"].get(k), ("fixed_ms", "ms_per_unit"))]
    missing += [f"sharded.{k}" for k, fits in (data["constants"].get("sharded") or {}).items()
                if not all(_is_fit((fits or {}).get(p), LOOKUP_TERMS) for p in ("fwd", "bwd"))]
    if missing:
        raise _refused(path, f"it is damaged (no {', '.join(missing)})")
    known = {k: data[k] for k in ("fingerprint", "constants", "spread", "trusted", "measurements", "made", "format")
             if k in data}
    return Calibration(**known, path=str(path))


def check_file(setting: str) -> None:
    """``cluster.calibration`` naming a file: refused in one line (``ConfigError``) when it cannot be used as a
    calibration (whether it fits the hardware is asked where the job's hardware is known, :func:`for_job`)."""
    if str(setting) not in (AUTO, NONE):
        load_calibration(setting)


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


def newest_matching(folder: Path, here: Dict[str, Any], world_matters: bool) -> Optional[Calibration]:
    """The newest trusted calibration in ``folder`` whose fingerprint matches ``here`` (files that cannot be read are
    passed over: ``auto`` only takes what fits); where the world does not have to match, one of the same world first."""
    fits = []
    for path in sorted(folder.glob(f"*{SUFFIX}"), reverse=True):
        try:
            cal = _cached_load(str(path), path.stat().st_mtime_ns)
        except (ValueError, OSError):
            continue
        if cal.trusted and mismatch(cal.fingerprint, here, world_matters) is None:
            fits.append(cal)
    same = [c for c in fits if mismatch(c.fingerprint, here, True) is None]
    return (same or fits)[0] if fits else None


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
        found = None
        if (here_is_job or device_kind == "cpu") and where.is_dir() and any(where.glob(f"*{SUFFIX}")):
            # the hardware is here (a training job, or a plan for this machine's kind of device): its fingerprint
            found = newest_matching(where, _fingerprint(device_kind, nodes, workers, device), here_is_job)
        if found is None:
            return Chosen(None, f"{default}: no calibration of this hardware in {where} (python -m runner "
                                "mode=calibrate makes one)")
        return Chosen(found, f"this machine's {found.label()}")
    path = Path(setting)
    cal = _cached_load(str(path), path.stat().st_mtime_ns) if path.is_file() else load_calibration(setting)
    if here_is_job:
        differs = mismatch(cal.fingerprint, _fingerprint(device_kind, nodes, workers, device), True)
        if differs is not None:
            raise _refused(setting, f"it was made on other hardware ({differs})")
    elif cal.fingerprint.get("device_kind") != device_kind:
        raise _refused(setting, f"it was made on {cal.fingerprint.get('device_kind')}, the plan is for {device_kind}")
    return Chosen(cal, cal.label())


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


def topology_knobs(cal: Optional[Calibration], device_kind: str, intra_gibps: Optional[float],
                   cross_gibps: Optional[float], world: int = 1, local: int = 1
                   ) -> Tuple[Dict[str, float], Dict[str, float]]:
    """TorchRec ``Topology`` arguments (its units: bytes per ms) that ``cal`` sets, and the bandwidths (GiB/s) in
    effect. A bandwidth the config sets wins (a sweep over it with a calibration asks "what if"); null is the
    calibration's measured one, else TorchRec's default. On one node TorchRec reads ``inter_host_bw`` only for
    all-reduces (as ``inter_host_bw`` x workers per node): it is set so that those take the measured all-reduce's
    bandwidth."""
    bandwidths = {"intra": TORCHREC_INTRA_GIBPS if intra_gibps is None else float(intra_gibps),
                  "cross": TORCHREC_CROSS_GIBPS if cross_gibps is None else float(cross_gibps)}
    if cal is None:
        return {}, bandwidths
    c = cal.constants
    per_ms = c["device_bw_gibps"] * GIB / 1000.0
    knobs = {"hbm_mem_bw" if device_kind == "cuda" else "ddr_mem_bw": per_ms,
             "bwd_compute_multiplier": float(c["bwd_compute_multiplier"])}
    h2d = (c.get("uvm_caching") or {}).get("hbm_to_ddr_gibps")
    if device_kind == "cuda" and h2d:  # the UVM-caching kernel, measured on a GPU
        knobs["hbm_to_ddr_mem_bw"] = float(h2d) * GIB / 1000.0
    for side, configured in (("intra", intra_gibps), ("cross", cross_gibps)):
        if configured is None and c.get(f"{side}_node_bandwidth"):
            bandwidths[side] = float(c[f"{side}_node_bandwidth"])
    reduce = c.get("collectives", {}).get("all_reduce", {}).get("intra")
    if cross_gibps is None and world <= local and reduce:
        bandwidths["cross"] = float(reduce["bandwidth_gibps"]) / max(local, 1)
    return knobs, bandwidths
