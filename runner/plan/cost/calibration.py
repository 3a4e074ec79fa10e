"""A calibration: the planner's cost model fitted to one machine, as a file.

``python -m runner mode=calibrate`` measures the job's own workers (:mod:`runner.train.calibrate`), fits the
measurements (:mod:`runner.plan.cost.fit`) and writes a :class:`Calibration`: a versioned YAML file with the
hardware's fingerprint (:mod:`runner.runtime.hardware`), the fitted constants, the spread of the repeats and the
measurements themselves. ``cluster.calibration`` chooses the one a plan uses (:func:`for_job`): ``auto`` the newest
in the cache folder whose fingerprint matches, ``none`` TorchRec's default constants, byte for byte, or a file.

What a calibration sets, and where: TorchRec's own knobs where it has them (:func:`topology_knobs`: the device's
memory bandwidth that FBGEMM's fused kernel reaches, the backward-to-forward ratio, and the bandwidths between
workers where the config leaves them null), so TorchRec's estimators, its planner and the runner's rate plans
with them; the runner's own terms where TorchRec has none (what a sharded lookup costs per call, per table and per
sample beyond TorchRec's bytes, the dense part, the optimizer, the input and the step's overhead), in the whole step
(:mod:`runner.plan.cost.step_estimate`) and the plans' rating. FBGEMM's kernel's own fixed cost per call
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
from typing import Any, Dict, Optional, Tuple, Union

from runner.config.errors import config_error_line, first_line
from runner.plan.cost.trust import PARTS, value_faults

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
    """Each part's trust (:func:`runner.plan.cost.trust.trust`)."""
    measurements: Dict[str, Any] = field(default_factory=dict)
    made: str = ""
    median_error: Dict[str, float] = field(default_factory=dict)  # each part's (:func:`.trust.median_error`)
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


def refused(path: Union[str, Path], why: str) -> Exception:
    return config_error_line(f"{KEY}={str(path)!r} cannot be used: {why}; make one on this machine with "
                             "python -m runner mode=calibrate, or plan with cluster.calibration=none", KEY)


def load_calibration(path: Union[str, Path]) -> Calibration:
    """The calibration at ``path``; a missing, damaged or newer-format file is a one-line ``ConfigError``."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise refused(path, f"it cannot be read ({first_line(exc)})") from None
    if not isinstance(data, dict) or not isinstance(data.get("format"), int):
        raise refused(path, "it is not a calibration file (no format number)")
    if data["format"] != FORMAT:
        raise refused(path, f"its format {data['format']} is newer than this runner's ({FORMAT}): update the runner"
                       if data["format"] > FORMAT else f"it was made by an older runner (format {data['format']}; "
                       f"this runner's is {FORMAT}): measure again")
    if not isinstance(data.get("fingerprint"), dict) or not isinstance(data.get("constants"), dict):
        raise refused(path, "it is damaged (no fingerprint or constants)")
    if data.get("digest") != digest(data):
        raise refused(path, "it was changed after it was written (its digest does not match: edited or cut short)")
    trusted = data.get("trusted")
    if not isinstance(trusted, dict) or not all(isinstance(trusted.get(p), bool) for p in PARTS):
        raise refused(path, f"it is damaged (trusted={trusted!r}, not true or false for each of {', '.join(PARTS)})")
    missing = [k for k in ("device_bw_gibps", "bwd_compute_multiplier", "kernel_call_fwd_ms", "kernel_call_bwd_ms")
               if not isinstance(data["constants"].get(k), (int, float))]
    missing += [k for k in FITS if not _is_fit(data["constants"].get(k), ("fixed_ms", "ms_per_unit"))]
    missing += [f"sharded.{k}" for k, fits in (data["constants"].get("sharded") or {}).items()
                if not all(_is_fit((fits or {}).get(p), LOOKUP_TERMS) for p in ("fwd", "bwd"))]
    fp, measured = data["fingerprint"], data["constants"].get("collectives") or {}
    scopes = [s for s, n in (("intra", fp.get("workers_per_node")), ("cross", fp.get("nodes"))) if _count(n) > 1]
    missing += [f"collectives.{c}.{s}" for c in COLLECTIVES for s in scopes if not _is_fit(
        (measured.get(c) or {}).get(s), ("latency_ms",))]  # each collective in each scope its world has
    if missing:
        raise refused(path, f"it is damaged (no {', '.join(missing)})")
    known = {k: data[k] for k in ("fingerprint", "constants", "spread", "trusted", "measurements", "made",
                                  "median_error", "learned", "format") if k in data}
    return Calibration(**known, path=str(path), faults=value_faults(data["constants"]))


def whole_or_refused(cal: Calibration) -> Calibration:
    """``cal`` (given by path) when every value passes its check; else refused in one line naming the key and
    value (a file the user names is used whole or not at all: under ``auto`` a failing part falls back alone)."""
    if cal.faults:
        part, why = next(iter(cal.faults.items()))
        raise refused(cal.path or "(in memory)", f"its {part} constant {why}")
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


COLLECTIVES = ("all_to_all", "all_reduce", "reduce_scatter")  # what every calibration holds in each scope; the
# all-gather (measured since 2026-11-29) is optional: a file without it plans its all-gathers with TorchRec's bandwidth


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


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


@functools.lru_cache(maxsize=64)
def cached_load(path: str, mtime_ns: int) -> Calibration:
    """:func:`load_calibration`, read again only when the file changes (its modification time)."""
    return load_calibration(path)
