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
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

from runner.config.errors import config_error_line, first_line
from runner.config.schema import WORKER_MODES
from runner.plan.cost_fit import PARTS
from runner.runtime.hardware import fingerprint, mismatch

if TYPE_CHECKING:
    import torch

    from runner.config.schema_model import ClusterSchema

FORMAT = 2  # the file format this runner writes and reads (2: trust per part, a digest); any other is refused
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
    trusted: Dict[str, bool] = field(default_factory=lambda: {part: True for part in PARTS})
    """Each part's trust (:data:`runner.plan.cost_fit.PARTS`): its medians known within what
    ``calibrate.max_spread`` allows (:func:`runner.plan.cost_fit.trust`)."""
    measurements: Dict[str, Any] = field(default_factory=dict)
    made: str = ""
    median_error: Dict[str, float] = field(default_factory=dict)
    """Each part's median relative standard error of its medians (:func:`runner.plan.cost_fit.median_error`)."""
    format: int = FORMAT
    path: Optional[str] = None  # where it was read from (not written)
    faults: Dict[str, str] = field(default_factory=dict)  # a part whose values fail their check: why (not written)

    def label(self) -> str:
        fp = self.fingerprint
        return (f"calibration {self.path or '(in memory)'} ({fp.get('device_name')}, {fp.get('nodes')} x "
                f"{fp.get('workers_per_node')} workers, made {self.made})")

    def untrusted(self) -> Dict[str, str]:
        """The parts that fall back, each with why: not trusted when measured, or a value failing its check."""
        out = {part: "its repeats scattered" for part in PARTS if not self.trusted.get(part, False)}
        out.update(self.faults)
        return out


PART_OF = {"device_bw_gibps": "kernels", "bwd_compute_multiplier": "kernels", "kernel_call_fwd_ms": "kernels",
           "kernel_call_bwd_ms": "kernels", "fit_error_fwd": "kernels", "fit_error_bwd": "kernels",
           "uvm_caching": "kernels", "kernel_fit_failed": "kernels", "collectives": "collectives",
           "intra_node_bandwidth": "collectives", "cross_node_bandwidth": "collectives", "sharded": "sharded"}
"""Which part each constant belongs to; every other constant (the dense fits, ``linear_*``, ``dense_rest_*``, the
optimizer, the input, the step's overhead) is the dense part's."""
FALLBACK = {"collectives": "TorchRec's bandwidths", "kernels": "TorchRec's device bandwidth and backward multiplier",
            "sharded": "no cost per sharded lookup, as TorchRec", "dense": "the dense part, optimizer, input and "
            "the step's overhead not estimated"}
"""What a part that falls back leaves the plan: TorchRec's constants where it has the term, else none."""
MAX_GIBPS = 1e14 / GIB  # no link or memory moves more than 100 TB/s: a bandwidth above it measured nothing
MAX_MS = 1e6  # no kernel call, collective or step term of a calibration takes 1,000 s
MAX_MULTIPLIER = 1e4  # the backward at most 10,000 times the forward's bandwidth term


def _value_fault(key: str, value: Any) -> Optional[str]:
    """Why one constant's value cannot be the machine's (None: it can); ``key`` its dotted name. Bandwidths and
    multipliers are positive, times and slopes at least 0 (a fit may end at 0), all finite and within what a machine
    can be; a fit's error may be infinite (the runner writes so where a fit failed)."""
    leaf = key.rsplit(".", 1)[-1]
    if leaf == "kernel_fit_failed":
        return None if isinstance(value, bool) else "is not true or false"
    if value is None and (leaf.endswith("bandwidth") or leaf.endswith("_gibps")):
        return None  # not measured (one node's cross bandwidth, a collective whose time did not grow with bytes)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "is not a number"
    if leaf.startswith("fit_error"):
        return None if value >= 0 else "is below 0"  # nan fails >= 0 too
    if not math.isfinite(value):
        return "is not finite"
    if leaf.endswith("bandwidth") or leaf.endswith("_gibps"):
        return None if 0 < value <= MAX_GIBPS else f"is not a bandwidth in (0, {MAX_GIBPS:.0f}] GiB/s"
    if leaf == "bwd_compute_multiplier":
        return None if 0 < value <= MAX_MULTIPLIER else f"is not a multiplier in (0, {MAX_MULTIPLIER:g}]"
    return None if 0 <= value <= MAX_MS else f"is not a time or slope in [0, {MAX_MS:g}]"


def value_faults(constants: Dict[str, Any]) -> Dict[str, str]:
    """Each part's first constant whose value fails its check (:func:`_value_fault`), as ``key=value is ...``."""
    out: Dict[str, str] = {}

    def walk(key: str, value: Any, part: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{key}.{k}", v, part)
        elif part not in out and (why := _value_fault(key, value)) is not None:
            out[part] = f"{key}={value!r} {why}"
    for key, value in constants.items():
        walk(key, value, PART_OF.get(key, "dense"))
    return out


def fallen_back(cal: Calibration) -> Calibration:
    """``cal`` with every part it does not trust taken out (:meth:`Calibration.untrusted`): the plan then uses
    TorchRec's constants for it where TorchRec has the term (:func:`topology_knobs` sets no knob that is absent), and
    no term where it has none (:mod:`runner.plan.step_estimate` names the parts it did not estimate)."""
    gone = cal.untrusted()
    if not gone:
        return cal
    kept = {k: v for k, v in cal.constants.items() if PART_OF.get(k, "dense") not in gone}
    return dataclasses.replace(cal, constants=kept)


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
                                  "median_error", "format") if k in data}
    return Calibration(**known, path=str(path), faults=value_faults(data["constants"]))


def checked(cal: Calibration) -> Calibration:
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
        checked(load_calibration(setting))


def check_folder(configured: Optional[str]) -> None:
    """The folder ``mode=calibrate`` keeps its calibration in (:func:`cache_dir`): a folder, or one that can be made,
    writable, with room for a file; else refused in one line before anything is measured."""
    import shutil

    where = cache_dir(configured)
    key = "cluster.calibration_dir"

    def refuse(why: str) -> Exception:
        return config_error_line(f"{key}={str(where)!r} {why}: name a writable folder (or calibrate.keep=false)",
                                 key)
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


def fell_back_note(cal: Calibration) -> str:
    """The parts of ``cal`` that fall back, and to what (empty when it trusts every part)."""
    gone = cal.untrusted()
    return "; ".join(f"{part} not used ({why}): {FALLBACK[part]}" for part, why in gone.items())


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
    cal = checked(_cached_load(str(path), path.stat().st_mtime_ns) if path.is_file() else load_calibration(setting))
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
    knobs: Dict[str, float] = {}
    if "device_bw_gibps" in c:  # the kernels' part (absent where it fell back: TorchRec's, untouched)
        knobs = {"hbm_mem_bw" if device_kind == "cuda" else "ddr_mem_bw": c["device_bw_gibps"] * GIB / 1000.0,
                 "bwd_compute_multiplier": float(c["bwd_compute_multiplier"])}
    h2d = (c.get("uvm_caching") or {}).get("hbm_to_ddr_gibps")
    if device_kind == "cuda" and h2d:  # the UVM-caching kernel, measured on a GPU
        knobs["hbm_to_ddr_mem_bw"] = float(h2d) * GIB / 1000.0
    for side, configured in (("intra", intra_gibps), ("cross", cross_gibps)):
        if configured is None and c.get(f"{side}_node_bandwidth"):
            bandwidths[side] = float(c[f"{side}_node_bandwidth"])
    reduce = c.get("collectives", {}).get("all_reduce", {}).get("intra")
    if cross_gibps is None and world <= local and reduce and reduce.get("bandwidth_gibps"):
        bandwidths["cross"] = float(reduce["bandwidth_gibps"]) / max(local, 1)
    return knobs, bandwidths
