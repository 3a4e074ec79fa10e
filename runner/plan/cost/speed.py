"""How far the machine moved since its calibration: a job's speed probe
(:func:`runner.train.calibrate.speed_probe`) against the calibration's, and what the plan line says of it."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

SPEED_SAID = 1.25  # a probe this many times slower or faster than its calibration's is said beside the estimate


def speed_now(c: Dict[str, Any], measured: Optional[Dict[str, float]]) -> Dict[str, float]:
    """The job's speed probe (``measured``'s ``probe_<kind>_ms``, :func:`runner.train.calibrate.speed_probe`) over
    its calibration's (``c['probe_ms']``), per kind (``compute``, ``memory``): 1.5, this machine takes half again as
    long now as when it was calibrated. Every part but the job's own dense part is the calibration's, so an estimate
    reads low by about as much (on 2 CPU ranks, a DLRM step estimated from a calibration made 70 minutes earlier read
    31% low, and 5% low from one made that minute). Empty where either has no probe (a calibration made before the
    probe, a job that timed no dense part)."""
    got = measured or {}
    pairs = {k: (_time(got.get(f"probe_{k}_ms")), _time(v)) for k, v in sorted((c.get("probe_ms") or {}).items())}
    return {k: now / then for k, (now, then) in pairs.items() if now and then}


def _time(v: Any) -> float:
    """``v`` as a probe's time: a positive, finite number, else 0 (not measured, or damaged)."""
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else 0.0


def speed_words(step: Dict[str, Any]) -> str:
    """``; this machine now takes 1.52x the time of its compute probe ...`` where a probe takes :data:`SPEED_SAID`
    times longer or shorter than when the calibration was measured (:func:`speed_now`); else empty."""
    moved = {k: v for k, v in (step.get("speed_now") or {}).items() if max(v, 1.0 / v) > SPEED_SAID}
    if not moved:
        return ""
    side = "low" if min(moved.values()) > 1.0 else "high" if max(moved.values()) < 1.0 else "low or high"
    return (f"; this machine now takes {', '.join(f'{v:.2f}x the time of its {k} probe' for k, v in moved.items())}"
            f" as calibrated{' at ' + step['calibrated_at'] if step.get('calibrated_at') else ''}: the parts from the "
            f"calibration may read {side}, python -m runner mode=calibrate measures them again")
