"""What of a calibration a plan may use: each part's trust, judged by how well its repeats know their medians
(:func:`median_error`, :func:`trust`), each constant's value checked when a file is read (:func:`value_faults`), and
what a part that cannot be used falls back to (:func:`fallen_back`, :data:`FALLBACK`).

A calibration is never taken or dropped whole for one part: a scattered collective leaves the kernels, the sharded
lookups and the dense part in use, and the plan line names what fell back.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, Optional, Protocol, Sequence, TypeVar

Cal = TypeVar("Cal", bound="Trusting")


class Trusting(Protocol):
    """What this module asks of a calibration (:class:`runner.plan.cost.calibration.Calibration`)."""

    constants: Dict[str, Any]
    faults: Dict[str, str]  # a part whose values fail their check: why

    def untrusted(self) -> Dict[str, str]: ...

    def with_constants(self: Cal, constants: Dict[str, Any]) -> Cal: ...

GIB = 1024**3


def spread(samples: Sequence[float]) -> float:
    """How far repeats of one measurement scatter: the median absolute deviation over the median (a relative
    standard deviation that one stray repeat does not move)."""
    med = statistics.median(samples)
    return 1.4826 * statistics.median(abs(s - med) for s in samples) / med if med > 0 else 0.0


def median_error(samples: Sequence[float]) -> float:
    """How well repeats know their median: its relative standard error, ``1.2533 x spread / sqrt(n)`` (the median's
    asymptotic error is 1.2533 times the mean's). A scattered measurement is known as well as a steady one once it
    has enough repeats: what a fit uses is the median, not any one repeat."""
    return 1.2533 * spread(samples) / math.sqrt(len(samples)) if samples else float("inf")


def allowed_median_error(max_spread: float, repeats: int) -> float:
    """The median's error that ``calibrate.max_spread`` allows: that of ``repeats`` repeats scattered by
    ``max_spread`` (so a part measured ``repeats`` times is trusted exactly when its spread is within
    ``max_spread``; one measured more often may scatter more and be known as well)."""
    return 1.2533 * max_spread / math.sqrt(max(repeats, 1))


PARTS = ("collectives", "kernels", "sharded", "dense")
"""The parts a calibration trusts one by one: a part whose median is not known well enough falls back alone
(:func:`runner.plan.cost.calibration.fallen_back`)."""


def trust(errors: Dict[str, float], constants: Dict[str, Any], allowed: float) -> Dict[str, bool]:
    """Each part's trust: its points' median error (the median over them of :func:`median_error`) within
    ``allowed``; the kernels also need a bandwidth to read off, the collectives one bandwidth per collective (a time
    that does not grow with the bytes measured none)."""
    out = {part: errors.get(part, 0.0) <= allowed for part in PARTS}
    out["kernels"] = out["kernels"] and not constants.get("kernel_fit_failed")
    out["collectives"] = out["collectives"] and all(
        fit.get("bandwidth_gibps") is not None for by_scope in constants.get("collectives", {}).values()
        for fit in by_scope.values())
    for by_scope in constants.get("collectives", {}).values():  # each collective's own trust, marked in its fit
        for fit in by_scope.values():
            if "median_error" in fit:
                fit["trusted"] = fit["median_error"] <= allowed and fit.get("bandwidth_gibps") is not None
    return out


def kept_collectives(constants: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """The collectives (by scope) a calibration whose collectives part is not trusted still gives a plan: each that
    its own repeats knew well enough (``trusted`` in its fit, marked by :func:`trust`). On 2 x 2 CPU ranks the part
    (the median over every collective's points) was known to 13% where 12% was allowed, its reduce-scatter to 8-10%
    and its all-gather to 17-28%: dropping the whole part put the all-reduce and the reduce-scatter at TorchRec's
    bandwidths too (12.5 GiB/s across nodes, 600 within), and a data-parallel DCN's step at a third of its time."""
    return {name: kept for name, by_scope in (constants.get("collectives") or {}).items()
            if (kept := {s: f for s, f in (by_scope or {}).items() if f.get("trusted") is True})}


def node_bandwidths(collectives: Dict[str, Any]) -> Dict[str, Optional[float]]:
    """``intra_node_bandwidth`` and ``cross_node_bandwidth``: the all-to-all's measured bandwidth in each scope
    (None where not measured), from a calibration's ``collectives``."""
    a2a = collectives.get("all_to_all") or {}
    return {f"{s}_node_bandwidth": (a2a.get(s) or {}).get("bandwidth_gibps") for s in ("intra", "cross")}


def collectives_note(constants: Dict[str, Any]) -> str:
    """What an untrusted collectives part leaves the plan: ``; reduce_scatter (intra, cross) kept, each known well
    enough alone`` (empty where none is)."""
    kept = kept_collectives(constants)
    return ("; " + ", ".join(f"{n} ({', '.join(sorted(s))})" for n, s in sorted(kept.items()))
            + " kept, each known well enough alone") if kept else ""


PART_OF = {"device_bw_gibps": "kernels", "bwd_compute_multiplier": "kernels", "kernel_call_fwd_ms": "kernels",
           "kernel_call_bwd_ms": "kernels", "fit_error_fwd": "kernels", "fit_error_bwd": "kernels",
           "uvm_caching": "kernels", "bwd_row_share": "kernels", "kernel_fit_failed": "kernels",
           "table_size": "kernels", "collectives": "collectives", "intra_node_bandwidth": "collectives",
           "cross_node_bandwidth": "collectives", "sharded": "sharded"}
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
    if key.startswith("table_size.") and isinstance(value, (int, float)) and not isinstance(value, bool):
        # the kernel's multiple by the tables' bytes (:mod:`.table_size`): a level and sizes above 0
        if leaf in ("level", "from_mib", "up_to_mib") and not (math.isfinite(value) and 0 < value <= MAX_MS):
            return f"is not a positive number up to {MAX_MS:g}"
    if leaf in ("kernel_fit_failed", "trusted"):
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
    if leaf == "bwd_row_share":
        return None if 0 <= value <= 1 else "is not a share in [0, 1]"
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
        if key != "probe_ms":  # the speed probe's times: read only to say how far the machine moved (checked there)
            walk(key, value, PART_OF.get(key, "dense"))
    return out


def fallen_back(cal: Cal) -> Cal:
    """``cal`` with every part it does not trust taken out (``cal.untrusted()``): the plan then uses TorchRec's
    constants for it where TorchRec has the term (:func:`runner.plan.cost.topology.topology_knobs` sets no knob that is
    absent), and no term where it has none (:mod:`.step_estimate` names the parts it did not estimate)."""
    gone = cal.untrusted()
    if not gone:
        return cal
    kept = {k: v for k, v in cal.constants.items() if PART_OF.get(k, "dense") not in gone}
    alone = kept_collectives(cal.constants) if "collectives" in gone and "collectives" not in cal.faults else {}
    if alone:  # the collectives known well enough alone (:func:`kept_collectives`); the rest are TorchRec's
        kept["collectives"] = alone
        kept.update({k: v for k, v in node_bandwidths(alone).items() if v is not None})
    return cal.with_constants(kept)


def fell_back_why(cal: Trusting) -> Dict[str, str]:
    """The parts of ``cal`` that fall back, each with why; an untrusted collectives part also names the collectives
    it still gives (:func:`kept_collectives`)."""
    return {part: why + (collectives_note(cal.constants) if part == "collectives" else "")
            for part, why in cal.untrusted().items()}


def fell_back_note(cal: Trusting) -> str:
    """The parts of ``cal`` that fall back, and to what (empty when it trusts every part)."""
    return "; ".join(f"{part} not used ({why}): {FALLBACK[part]}"
                     + (collectives_note(cal.constants) if part == "collectives" else "")
                     for part, why in cal.untrusted().items())

