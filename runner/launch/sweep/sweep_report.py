"""The report a sweep's parent run gets: every point's plan and estimates, side by side.

Reads each point's folder (``resolved.yaml``, ``results.json``, ``plan/``) and writes ``points.csv``,
``report.md`` (every point, infeasible ones with their reason, the bytes its storage reservation kept free on
each rank, what differs from the first point; per swept key the tables whose sharding changed and at which value)
and ``estimates.png`` (:mod:`.sweep_chart`). Returns what the sweep found, for the parent run: the best estimated
step and its run, infeasible points, distinct plans.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from runner.config.modes import DEFAULT, MODES
from runner.runtime import run_files
from runner.track.store import flatten
from runner.track.sweep_points import SWEEP_FILE


def _load_point(job_dir: Path) -> Optional[Dict[str, Any]]:
    results = run_files.read_json(job_dir / run_files.RESULTS)
    planned = results is not None and MODES[results.get("mode", DEFAULT)].answer_is_plan
    if results is None or not planned and not (job_dir / run_files.PLAN / "plan.json").exists():
        return None
    run = run_files.read_json(job_dir / run_files.RUN_INFO) or {}  # the point's MLflow run, as its owner recorded it
    point = {"job": int(job_dir.name), "params": flatten(yaml.safe_load((job_dir / run_files.RESOLVED).read_text())),
             "run_id": run.get("run_id"), "status": results.get("plan_status", "feasible"),
             "reason": results.get("reason", ""), "reused_from": results.get("reused_from", ""),
             "types": {}, "shapes": {},
             "est_step_ms": float("nan"), "max_mem_gib": float("nan"), "est_whole_step_ms": float("nan"),
             "measured_step_ms": float("nan"), "reserved_bytes": float("nan"),
             "lower_bound_ms": float(results.get("lower_bound_ms") or "nan")}
    if point["status"] == "infeasible":
        return point
    plan = json.loads((job_dir / run_files.PLAN / "plan.json").read_text())
    estimates = json.loads((job_dir / run_files.PLAN / "estimates.json").read_text())
    ranks = estimates.get("per_rank", [])
    device = estimates.get("device", point["params"].get("cluster.device"))  # what it planned for (auto resolved)
    mem_key = "hbm_bytes" if device == "cuda" else "ddr_bytes"
    point.update(
        types={t: p["sharding_type"] for tables in plan.values() for t, p in tables.items()},
        shapes={t: f"{p.get('rows')} x {p.get('dim')}" for tables in plan.values() for t, p in tables.items()},
        est_step_ms=max((r["total_ms"] for r in ranks), default=float("nan")),
        max_mem_gib=max((r[mem_key] for r in ranks), default=float("nan")) / 2**30,
        est_whole_step_ms=float((estimates.get("step") or {}).get("step_ms") or "nan"),
        reserved_bytes=float(estimates.get("reserved_bytes_per_rank") or "nan"),  # what the reservation kept free
        measured_step_ms=float((run_files.read_json(job_dir / run_files.MEASURED) or {}).get("measured/step_ms")
                               or "nan"))
    return point


def estimate_error(p: Dict[str, Any]) -> float:
    """A trained point's estimated step (the whole step with a calibration, else the embeddings') over its
    measured step, less one (nan where it did not train)."""
    est = p["est_whole_step_ms"] if p["est_whole_step_ms"] == p["est_whole_step_ms"] else p["est_step_ms"]
    return est / p["measured_step_ms"] - 1 if p["measured_step_ms"] > 0 else float("nan")


def load_points(sweep_folder: Path) -> List[Dict[str, Any]]:
    """Every point of the sweep that has a plan or a plan-only answer (infeasible included), in job order."""
    return [p for p in (_load_point(d) for d in run_files.point_dirs(sweep_folder)) if p is not None]


def swept_keys(points: List[Dict[str, Any]]) -> List[str]:
    """Config keys whose value differs between points (excluding per-run bookkeeping)."""
    keys = sorted({k for p in points for k in p["params"]})
    return [k for k in keys if not k.startswith("tracking.") and len({p["params"].get(k) for p in points}) > 1]


def changed_tables(points: List[Dict[str, Any]]) -> Dict[str, List[str]]:
    """Tables whose sharding type differs between feasible points -> the type at each point."""
    feasible = [p for p in points if p["status"] == "feasible"]
    seqs = {t: [p["types"].get(t, "-") for p in feasible] for t in sorted({t for p in feasible for t in p["types"]})}
    return {t: seq for t, seq in seqs.items() if len(set(seq)) > 1}


def _sort_value(v: Any) -> tuple:
    try:
        return (0, float(v), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(v))


def axes_of(keys: List[str], paired: List[str]) -> List[List[str]]:
    """The sweep's axes: the paired keys together (where the first of them stands), every other key alone."""
    together = [p for p in keys if p in paired]
    return [list(together) if k in paired else [k] for k in keys if k not in paired or k == together[0]]


def flips(points: List[Dict[str, Any]], keys: List[str], paired: Optional[List[str]] = None) -> Dict[str, List[str]]:
    """Per axis (a swept key, or the paired keys together, named ``a + b``): each table whose sharding changes
    as only that axis moves, and between which values."""
    out: Dict[str, List[str]] = {}
    for axis in axes_of(keys, paired or []):
        others = [k for k in keys if k not in axis]
        groups: Dict[tuple, List[Dict[str, Any]]] = {}
        for p in points:
            groups.setdefault(tuple(p["params"].get(k) for k in others), []).append(p)
        lines = []
        for fixed, pts in groups.items():
            pts = sorted(pts, key=lambda p: _sort_value(p["params"].get(axis[0])))
            at = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(others, fixed, strict=True))
            for a, b in zip(pts, pts[1:], strict=False):
                step = ", ".join(f"{k.split('.')[-1]} {a['params'].get(k)} -> {b['params'].get(k)}" for k in axis)
                step += f" ({at})" if at else ""
                if a["status"] != b["status"]:
                    lines.append(f"{step}: plan {a['status']} -> {b['status']}")
                    continue
                for t in sorted(set(a["types"]) | set(b["types"])):
                    if a["types"].get(t) != b["types"].get(t):
                        shape = a["shapes"].get(t, "")
                        lines.append(f"{step}: {t} ({shape}) {a['types'].get(t)} -> {b['types'].get(t)}")
        out[" + ".join(axis) + (" (paired)" if len(axis) > 1 else "")] = lines
    return out


def findings(points: List[Dict[str, Any]]) -> Dict[str, Any]:
    """What the sweep found, for the parent run's metrics and tags."""
    feasible = [p for p in points if p["status"] == "feasible" and p["est_step_ms"] == p["est_step_ms"]]
    metrics = {"sweep/infeasible_points": float(sum(p["status"] == "infeasible" for p in points)),
               "sweep/distinct_plans": float(len({tuple(sorted(p["types"].items())) for p in feasible}))}
    tags = {}
    if feasible:
        best = min(feasible, key=lambda p: p["est_step_ms"])
        metrics["sweep/best_est_step_ms"] = best["est_step_ms"]
        tags = {"runner.best_run_id": best["run_id"] or "", "runner.best_job": best["job"]}
    return {"metrics": metrics, "tags": tags, "run_ids": [p["run_id"] for p in points if p["run_id"]]}


def vs_first(p: Dict[str, Any], first: Dict[str, Any], keys: List[str]) -> str:
    """What differs between point ``p`` and the sweep's first point: its config values (of the swept keys),
    then how many tables it shards another way."""
    if p is first:
        return "(the first point)"
    values = [f"{k}={p['params'].get(k)}" for k in keys if p["params"].get(k) != first["params"].get(k)]
    tables = sum(p["types"].get(t) != v for t, v in first["types"].items()) if p["types"] and first["types"] else 0
    return ", ".join(values or ["the same config"]) + (f"; {tables} tables sharded another way" if tables else "")


def _write_csv(path: Path, points: List[Dict[str, Any]], keys: List[str]) -> None:
    tables = sorted({t for p in points for t in p["types"]})
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job", *keys, "plan_status", "est_step_ms", "lower_bound_ms", "gap_to_bound", "max_mem_gib",
                    "reserved_bytes_per_rank", "est_whole_step_ms", "measured_step_ms", "estimate_error", *tables,
                    "run_id", "reason", "reused_from", "vs_first"])
        for p in points:
            w.writerow([p["job"], *(p["params"].get(k) for k in keys), p["status"], f"{p['est_step_ms']:.6f}",
                        f"{p['lower_bound_ms']:.6f}", f"{gap(p):.6f}", f"{p['max_mem_gib']:.6f}",
                        "" if p["reserved_bytes"] != p["reserved_bytes"] else int(p["reserved_bytes"]),
                        f"{p['est_whole_step_ms']:.6f}", f"{p['measured_step_ms']:.6f}", f"{estimate_error(p):.6f}",
                        *(p["types"].get(t, "") for t in tables), p["run_id"], p["reason"], p["reused_from"],
                        vs_first(p, points[0], keys)])


def gap(p: Dict[str, Any]) -> float:
    """A point's estimated step over its lower bound, less one (nan where either is unknown)."""
    return p["est_step_ms"] / p["lower_bound_ms"] - 1 if p["lower_bound_ms"] > 0 else float("nan")


def _ms(v: float) -> str:
    return "-" if v != v else f"{v:.3f}"


def _pct(v: float) -> str:
    return "-" if v != v else f"{v:+.0%}"


def _summary(p: Dict[str, Any]) -> str:
    reused = f" (reused: run {p['reused_from']})" if p["reused_from"] else ""
    if p["status"] == "infeasible":
        return f"**infeasible**: {p['reason']}{reused}"
    counts = Counter(p["types"].values())
    return ", ".join(f"{n} {t}" for t, n in sorted(counts.items())) + reused


def _write_markdown(path: Path, points: List[Dict[str, Any]], keys: List[str], changed: Dict[str, List[str]],
                    moved: Dict[str, List[str]]) -> None:
    infeasible = sum(p["status"] == "infeasible" for p in points)
    lines = [f"# Sweep report: {len(points)} points ({infeasible} infeasible)", "",
             "Swept: " + (", ".join(moved) or ", ".join(keys) or "(nothing)"), "",
             "| job | " + " | ".join(keys) + " | est. step ms | lower bound ms | gap | max memory GiB "
             "| kept free per rank GiB | est. whole step ms | measured step ms | estimate error | sharding types "
             "| vs the first point |",
             "|---" * (len(keys) + 11) + "|"]
    for p in points:
        vals = " | ".join(str(p["params"].get(k)) for k in keys)
        lines.append(f"| {p['job']} | {vals} | {p['est_step_ms']:.4f} | {p['lower_bound_ms']:.4f} | {gap(p):+.2%} | "
                     f"{p['max_mem_gib']:.3f} | {_ms(p['reserved_bytes'] / 2**30)} | {_ms(p['est_whole_step_ms'])} | "
                     f"{_ms(p['measured_step_ms'])} | "
                     f"{_pct(estimate_error(p))} | {_summary(p)} | {vs_first(p, points[0], keys)} |")
    for key, found in moved.items():
        lines += ["", f"## What changes with {key} ({len(found)})", ""]
        lines += [f"- {line}" for line in found[:60]] or ["Nothing: the plan is the same at every value."]
        if len(found) > 60:
            lines.append(f"- ... {len(found) - 60} more (points.csv has every table at every point)")
    feasible = [p for p in points if p["status"] == "feasible"]
    lines += ["", f"## Tables whose sharding changed between feasible points ({len(changed)})", ""]
    if changed:
        lines += ["| table | rows x dim | " + " | ".join(f"job {p['job']}" for p in feasible) + " |",
                  "|---" * (len(feasible) + 2) + "|"]
        lines += [f"| {t} | {feasible[0]['shapes'].get(t, '')} | " + " | ".join(seq) + " |"
                  for t, seq in changed.items()]
    else:
        lines.append("None: every feasible point chose the same sharding type for every table.")
    path.write_text("\n".join(lines) + "\n")


def write_sweep_report(sweep_folder: Path) -> Tuple[Optional[Path], Dict[str, Any]]:
    """Write the report into ``<sweep_folder>/report/``; (None, {}) when no point has a plan or an answer."""
    from runner.launch.sweep.sweep_chart import write_chart

    points = load_points(sweep_folder)
    if not points:
        return None, {}
    out = sweep_folder / "report"
    out.mkdir(exist_ok=True)
    keys = swept_keys(points)
    info = run_files.read_json(sweep_folder / SWEEP_FILE)
    paired = [k for k in (info.get("paired") or [] if isinstance(info, dict) else []) if k in keys]
    _write_csv(out / "points.csv", points, keys)
    _write_markdown(out / "report.md", points, keys, changed_tables(points), flips(points, keys, paired))
    write_chart(out / "estimates.png", points, keys)
    return out, findings(points)
