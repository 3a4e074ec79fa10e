"""Learning from runs: every training job planned with a calibration measures its step beside the plan's whole-step
estimate (``measured.json`` and ``plan/estimates.json`` in its run folder). What a job's step took beyond every
estimated part but the step's overhead is that job's overhead as the hardware gave it; over many jobs of one
machine (other batches, other table counts) it is the term the calibration's tiny-table job cannot see alone.

``python -m runner learn-calibration <runs folder> [calibration.yaml]`` refits two parts of the calibration from
those residuals (:func:`fit_runs`): the step's overhead (fixed, and per table with enough runs) and the share by
which the step's compute waits for the slowest rank (``rank_wait``'s factor, which ``mode=calibrate`` reads off a
few seconds of the dense part in lockstep, and which a job's whole training shows at scale: on 2 CPU ranks, what
runs took beyond their parts grew with their compute, 1.9 ms at 2.5 ms of compute, 9.7 at 31, 42 at 240). The
overhead per sample stays as the tiny-table job measured it. It writes the result as a new calibration in the folder
it came from, which ``cluster.calibration=auto`` then takes (the newest), with ``learned`` saying from how many
runs, but only where the runs' errors lean to one side beyond chance and the refit estimates each run left out of it
better than the calibration as measured does (:func:`choose`); else it says so and writes nothing. It is a command,
not automatic: a run's step holds whatever else its machine was doing, so the user says when runs are
representative. Only runs planned with a calibration of the same hardware and world count.
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from runner.plan.cost.calibration import Calibration, cache_dir, file_name, load_calibration, save
from runner.plan.cost.fit import fit_residual
from runner.plan.cost.step_estimate import compute_ms, family_overhead_ms, fitted_ms, wait_factor
from runner.runtime.hardware import mismatch

MIN_RUNS = 5  # the fewest on which a side the errors keep is told from chance (5 of 5: 0.06 <= LEAN_P)
PER_TABLE_RUNS = 6  # ... and for the per-table term


def overhead_ms(constants: Dict[str, Any], batch: int, tables: int) -> float:
    """The step's overhead by ``constants``' ``step_overhead`` at a per-rank ``batch`` with ``tables`` tables."""
    fit = constants.get("step_overhead")
    return fitted_ms(fit, batch / 1000.0) + (fit or {}).get("per_table_ms", 0.0) * tables


def _read(path: Path) -> Optional[Dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_points(runs: Iterable[Path], cal: Calibration) -> List[Dict[str, float]]:
    """One point per finished training run of ``runs`` (run folders, e.g. :func:`runs_under`) planned with a
    calibration of ``cal``'s hardware and world: its per-rank batch and table count, the slowest rank's measured
    step, what that rank's estimate gave every part but the overhead (its families and its compute's wait for the
    slowest rank by ``cal``: ``compute_ms``, ``wait_ms``), and the overhead it gave."""
    import yaml

    points = []
    for run in runs:
        est, measured = _read(run / "plan" / "estimates.json"), _read(run / "measured.json")
        if not est or not measured or not est.get("step") or not measured.get("per_rank"):
            continue
        if set(est["step"].get("fell_back") or {}) & {"dense", "sharded"}:
            continue  # its estimate left a part out: the residual would be that part, not the step's overhead
        try:
            planned_with = load_calibration(str(est.get("calibration")))
            resolved = yaml.safe_load((run / "resolved.yaml").read_text())
            batch = int(resolved["train"]["batch_size"]) * int(resolved["train"].get("grad_accumulation_steps", 1))
        except (ValueError, OSError, KeyError, TypeError, yaml.YAMLError):
            continue  # its calibration is gone or damaged, or its config unreadable: not this hardware's evidence
        if mismatch(planned_with.fingerprint, cal.fingerprint, True) is not None:
            continue
        plan = _read(run / "plan" / "plan.json") or {}
        ranks = measured["per_rank"]
        slowest = max(range(len(ranks)), key=lambda r: ranks[r].get("step_ms") or 0.0)
        part = est["step"]["per_rank"][slowest] if slowest < len(est["step"]["per_rank"]) else None
        if not part or not ranks[slowest].get("step_ms"):
            continue
        if cal.constants.get("bwd_row_share") and "row_reuse" not in part:
            continue  # planned before the backward's saving on repeated rows: its parts would hold it in the rest
        if cal.constants.get("table_size") and "table_size" not in part:
            continue  # planned before the kernel's cost by its tables' bytes: likewise
        overhead = float(part.get("step_overhead", 0.0))
        ran = float(part.get("family_overhead_ms", 0.0))  # the families' part of it, by the run's calibration
        # the families' part by this calibration stays in the parts (the plan pays it beside the overhead): the
        # refit is of the rest
        families = family_overhead_ms(cal.constants, [(str(t.get("sharding_type")), 1) for m in plan.values()
                                                      for t in m.values()])
        torchrec = (est.get("per_rank") or [])[slowest] if slowest < len(est.get("per_rank") or []) else {}
        # the rank's compute, which waits for the slowest rank, charged, as the families, by this calibration's
        # factor: the refit is of the rest
        compute = compute_ms(part, torchrec)
        wait = (wait_factor(cal.constants) - 1.0) * compute
        points.append({"batch": batch, "tables": sum(len(t) for t in plan.values()),
                       "measured_ms": float(ranks[slowest]["step_ms"]), "overhead_ms": overhead - ran,
                       "parts_ms": float(part["step_ms"]) - overhead + families - float(part.get("rank_wait", 0.0))
                       + wait, "compute_ms": compute, "wait_ms": wait})
    return points


def estimate_ms(constants: Dict[str, Any], point: Dict[str, float]) -> float:
    """A run's (:func:`run_points`) whole step by ``constants``: its parts with the compute's wait for the slowest
    rank and the step's overhead by ``constants``, the rest as the run estimated them."""
    wait = (wait_factor(constants) - 1.0) * point.get("compute_ms", 0.0)
    return (point["parts_ms"] - point.get("wait_ms", 0.0) + wait
            + overhead_ms(constants, int(point["batch"]), int(point["tables"])))


def runs_under(folder: Path) -> List[Path]:
    """The run folders under ``folder`` (each holding ``plan/estimates.json``)."""
    return [estimates.parent.parent for estimates in sorted(folder.rglob("plan/estimates.json"))]


def fit_runs(constants: Dict[str, Any], points: List[Dict[str, float]], per_table: bool) -> Dict[str, float]:
    """What ``points`` (:func:`run_points`) took beyond their parts but the overhead and the compute's wait, less the
    overhead per sample by ``constants``, as ``fixed + share x compute`` (``per_table``: ``+ per table x tables``):
    non-negative least squares, each run's residual weighed relative to its step. ``fit_error``: the largest
    relative error over the runs."""
    per_ksample = float((constants.get("step_overhead") or {}).get("ms_per_ksample", 0.0))
    base = [p["parts_ms"] - p.get("wait_ms", 0.0) + per_ksample * p["batch"] / 1000.0 for p in points]
    fixed, share, tables = (fit_residual([[1.0, p.get("compute_ms", 0.0), float(p["tables"])][:3 if per_table else 2]
                                          for p in points],
                                         [p["measured_ms"] - b for p, b in zip(points, base, strict=True)],
                                         [p["measured_ms"] for p in points]) + [0.0])[:3]
    error = max((abs(b + fixed + share * p.get("compute_ms", 0.0) + tables * p["tables"] - p["measured_ms"])
                 / p["measured_ms"] for p, b in zip(points, base, strict=True)), default=0.0)
    return {"fixed_ms": fixed, "share": share, "per_table_ms": tables, "fit_error": float(error)}


def refit(cal: Calibration, points: List[Dict[str, float]], source: str, per_table: Optional[bool] = None
          ) -> Calibration:
    """``cal`` with its step's overhead and its compute's wait refitted from ``points`` (:func:`fit_runs`): the
    overhead's fixed and per-table terms and ``rank_wait``'s factor (``1 + share``) replaced, the rest as measured."""
    # at least two runs per term: fewer runs than that fit their own noise (a run's step scatters 5-40% here), so
    # the per-table term waits for PER_TABLE_RUNS runs
    fit = fit_runs(cal.constants, points, len(points) >= PER_TABLE_RUNS if per_table is None else per_table)
    overhead = {**(cal.constants.get("step_overhead") or {"ms_per_unit": 0.0, "ms_per_ksample": 0.0}),
                "fixed_ms": fit["fixed_ms"], "per_table_ms": fit["per_table_ms"], "fit_error": fit["fit_error"]}
    measured = cal.constants.get("rank_wait") or {"per_call_ms": 0.0}
    # the calibration's own factor (that of the one a learned calibration refined, when it is refined again)
    wait = {**measured, "factor": 1.0 + fit["share"],
            "measured_factor": measured.get("measured_factor", wait_factor(cal.constants))}
    return Calibration(cal.fingerprint, {**cal.constants, "step_overhead": overhead, "rank_wait": wait}, cal.spread,
                       cal.trusted, cal.measurements,
                       datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                       cal.median_error, learned={"runs": len(points), "from": source, "refined": cal.path or "",
                                                  # when its measurements (the speed probe's among them) were made
                                                  "measured_at": (cal.learned or {}).get("measured_at") or cal.made})


def held_out_errors(cal: Calibration, points: List[Dict[str, float]]) -> Dict[str, List[float]]:
    """Each run's relative error (estimate over measured step, less one) by ``cal`` as measured, and by ``cal``
    refitted (:func:`refit`) from every other run, with the terms the refit from all of them has: how the refit
    does on a run it has not seen."""
    out: Dict[str, List[float]] = {"measured": [], "refitted": []}
    per_table = len(points) >= PER_TABLE_RUNS
    for i, point in enumerate(points):
        others = points[:i] + points[i + 1:]
        out["measured"].append(estimate_ms(cal.constants, point) / point["measured_ms"] - 1.0)
        out["refitted"].append(estimate_ms(refit(cal, others, "", per_table).constants, point)
                               / point["measured_ms"] - 1.0)
    return out


LEAN_P = 0.1  # how unlikely, were the runs' errors as likely low as high, the side they lean to must be


def lean(errors: List[float]) -> Tuple[int, int, float]:
    """How many of ``errors`` are low and high, and the chance (two-sided sign test) of leaning at least as far to
    one side were each as likely low as high: a term the calibration lacks keeps its side, noise does not."""
    from math import comb

    low, high = sum(e < 0 for e in errors), sum(e > 0 for e in errors)
    n, k = low + high, max(low, high)
    return low, high, min(1.0, 2.0 * sum(comb(n, i) for i in range(k, n + 1)) / 2.0 ** n) if n else 1.0


def choose(cal: Calibration, points: List[Dict[str, float]], source: str) -> Tuple[Optional[Calibration], str]:
    """``cal`` refitted from ``points`` (:func:`refit`) where the runs show a bias to learn and the refit learns it;
    else None; and one line saying which and by how much. A run's step holds whatever else its machine did (its
    steps scatter 5-40% here), so a refit is taken only where (1) ``cal`` as measured estimates the runs on one side
    beyond chance (:func:`lean`: at most :data:`LEAN_P`; 5 of 5 runs, 9 of 10) and (2) it estimates a run left out
    of it better than ``cal`` does (the median over the runs of :func:`held_out_errors`). On the benchmark, refits
    taken on (2) alone, from runs whose errors lay on both sides, followed those runs' scatter and estimated the
    held-out configs worse (10.1% -> 12.9%, 6.0% -> 12.7%)."""
    errors = held_out_errors(cal, points)
    measured, refitted = (statistics.median(abs(e) for e in errors[k]) for k in ("measured", "refitted"))
    low, high, chance = lean(errors["measured"])
    figures = (f"a run left out of the refit estimated within {refitted:.1%} (median), by the calibration as "
               f"measured within {measured:.1%}; the runs {low} low, {high} high")
    if chance > LEAN_P:
        return None, (f"kept as measured: no bias to learn ({figures}, as likely as not by chance: "
                      f"{chance:.2f} > {LEAN_P})")
    if refitted >= measured:
        return None, f"kept as measured: {figures}"
    learned = refit(cal, points, source)
    learned.learned.update(held_out_error=round(refitted, 6), measured_error=round(measured, 6))
    return learned, f"learned: {figures}"


def learn_command(args: List[str]) -> int:
    """``python -m runner learn-calibration <runs folder> [calibration.yaml]``: the newest calibration of this
    machine in ``cluster.calibration_dir``'s default folder (or the file given) refitted from the runs, written as
    a new calibration there; one line, and exit 2, where it cannot be."""
    if len(args) not in (1, 2) or not Path(args[0]).is_dir():
        print("error: python -m runner learn-calibration <runs folder> [calibration.yaml]: a folder of run folders "
              "(e.g. outputs/runs) and, optionally, the calibration to refine", file=sys.stderr)
        return 2
    folder = Path(args[0])
    try:
        candidates = [load_calibration(args[1])] if len(args) == 2 else _kept(cache_dir())
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # the given calibration, else the newest kept one with enough runs of its hardware and world
    runs = runs_under(folder)
    found = next(((c, p) for c in candidates if len(p := run_points(runs, c)) >= MIN_RUNS), None)
    if found is None:
        print(f"error: fewer than {MIN_RUNS} finished training runs under {folder} were planned with "
              + (candidates[0].label() if len(args) == 2 else f"a calibration in {cache_dir()}")
              + " or one of its hardware and world (python -m runner mode=calibrate makes one)", file=sys.stderr)
        return 2
    cal, points = found
    learned, how = choose(cal, points, str(folder.absolute()))
    if learned is None:
        print(f"[runner] calibration {how}: nothing written ({cal.label()} stays what cluster.calibration=auto "
              f"takes; {len(points)} runs)", flush=True)
        return 0
    where = Path(cal.path).parent if cal.path else cache_dir()
    path = save(learned, where / file_name(cal.fingerprint))
    fit, wait = learned.constants["step_overhead"], learned.constants["rank_wait"]
    print(f"[runner] calibration learned from {len(points)} runs: step overhead {fit['fixed_ms']:.3f} ms + "
          f"{fit['per_table_ms']:.4f} ms per table (+ {fit.get('ms_per_ksample', 0.0):.3f} ms per 1,000 samples, as "
          f"measured), the compute waits x{wait['factor']:.3f} for the slowest rank (measured x"
          f"{wait['measured_factor']:.3f}); largest error over the runs {fit['fit_error']:.0%}; {how}; written to "
          f"{path}, which cluster.calibration=auto takes", flush=True)
    return 0


def _kept(folder: Path) -> List[Calibration]:
    """The calibrations kept in ``folder``, newest first (files that cannot be read passed over)."""
    from runner.plan.cost.calibration import SUFFIX

    out = []
    for path in sorted(folder.glob(f"*{SUFFIX}"), reverse=True) if folder.is_dir() else []:
        try:
            out.append(load_calibration(path))
        except ValueError:
            continue
    return out
