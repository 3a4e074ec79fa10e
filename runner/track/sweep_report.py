"""The report a sweep's parent run gets: every point's plan and estimates, side by side.

Reads each job folder of the sweep (``resolved.yaml``, ``results.json``, ``plan/plan.json``) and writes
``points.csv``, ``report.md`` (with the tables whose sharding changed between points) and
``estimates.png`` (estimated step time and max memory against each swept key).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

from runner.config import rundir
from runner.track.store import flatten


def _load_point(job_dir: Path) -> Optional[Dict[str, Any]]:
    plan_file, results_file = job_dir / rundir.PLAN / "plan.json", job_dir / rundir.RESULTS
    if not plan_file.exists() or not results_file.exists():
        return None
    params = flatten(yaml.safe_load((job_dir / rundir.RESOLVED).read_text()))
    plan = json.loads(plan_file.read_text())
    estimates = json.loads((job_dir / rundir.PLAN / "estimates.json").read_text())
    ranks = estimates.get("per_rank", [])
    mem_key = "hbm_bytes" if params.get("cluster.device") == "cuda" else "ddr_bytes"
    return {
        "job": int(job_dir.name),
        "params": params,
        "types": {t: p["sharding_type"] for tables in plan.values() for t, p in tables.items()},
        "shapes": {t: f"{p.get('rows')} x {p.get('dim')}" for tables in plan.values() for t, p in tables.items()},
        "est_step_ms": max((r["total_ms"] for r in ranks), default=float("nan")),
        "max_mem_gib": max((r[mem_key] for r in ranks), default=float("nan")) / 2**30,
        "run_id": json.loads(results_file.read_text()).get("run_id"),
    }


def load_points(sweep_dir: Path) -> List[Dict[str, Any]]:
    """Every finished job of the sweep, in job order."""
    return [p for p in (_load_point(d) for d in rundir.point_dirs(sweep_dir)) if p is not None]


def swept_keys(points: List[Dict[str, Any]]) -> List[str]:
    """Config keys whose value differs between points (excluding per-run bookkeeping)."""
    keys = sorted({k for p in points for k in p["params"]})
    return [k for k in keys if not k.startswith("tracking.") and len({p["params"].get(k) for p in points}) > 1]


def changed_tables(points: List[Dict[str, Any]]) -> Dict[str, List[str]]:
    """Tables whose sharding type differs between points -> the type at each point."""
    tables = sorted({t for p in points for t in p["types"]})
    out = {}
    for t in tables:
        seq = [p["types"].get(t, "-") for p in points]
        if len(set(seq)) > 1:
            out[t] = seq
    return out


def _write_csv(path: Path, points: List[Dict[str, Any]], keys: List[str]) -> None:
    tables = sorted({t for p in points for t in p["types"]})
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job", *keys, "est_step_ms", "max_mem_gib", *tables, "run_id"])
        for p in points:
            w.writerow([p["job"], *(p["params"].get(k) for k in keys), f"{p['est_step_ms']:.6f}",
                        f"{p['max_mem_gib']:.6f}", *(p["types"].get(t, "") for t in tables), p["run_id"]])


def _summary(types: Dict[str, str]) -> str:
    counts: Dict[str, int] = {}
    for v in types.values():
        counts[v] = counts.get(v, 0) + 1
    return ", ".join(f"{n} {t}" for t, n in sorted(counts.items()))


def _write_markdown(path: Path, points: List[Dict[str, Any]], keys: List[str], changed: Dict[str, List[str]]) -> None:
    lines = [f"# Sweep report: {len(points)} points", "", "Swept: " + (", ".join(keys) or "(nothing)"), "",
             "| job | " + " | ".join(keys) + " | est. step ms | max memory GiB | sharding types |",
             "|---" * (len(keys) + 4) + "|"]
    for p in points:
        vals = " | ".join(str(p["params"].get(k)) for k in keys)
        lines.append(f"| {p['job']} | {vals} | {p['est_step_ms']:.4f} | {p['max_mem_gib']:.3f} | "
                     f"{_summary(p['types'])} |")
    lines += ["", f"## Tables whose sharding changed between points ({len(changed)})", ""]
    if changed:
        lines += ["| table | rows x dim | " + " | ".join(f"job {p['job']}" for p in points) + " |",
                  "|---" * (len(points) + 2) + "|"]
        lines += [f"| {t} | {points[0]['shapes'].get(t, '')} | " + " | ".join(seq) + " |" for t, seq in changed.items()]
    else:
        lines.append("None: every point chose the same sharding type for every table.")
    path.write_text("\n".join(lines) + "\n")


def _as_float(v: Any) -> Optional[float]:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _write_chart(path: Path, points: List[Dict[str, Any]], keys: List[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    numeric = [k for k in keys if all(_as_float(p["params"].get(k)) is not None for p in points)] or keys[:1]
    if not numeric:
        return
    fig, axes = plt.subplots(2, len(numeric), figsize=(4.2 * len(numeric), 6.4), squeeze=False)
    for col, key in enumerate(numeric):
        others = [k for k in keys if k != key]
        groups: Dict[str, List[Dict[str, Any]]] = {}
        for p in points:
            groups.setdefault(", ".join(f"{k.split('.')[-1]}={p['params'].get(k)}" for k in others), []).append(p)
        for label, pts in groups.items():
            pts = sorted(pts, key=lambda p: _as_float(p["params"].get(key)) or 0.0)
            xs = [_as_float(p["params"].get(key)) for p in pts]
            axes[0][col].plot(xs, [p["est_step_ms"] for p in pts], marker="o", label=label or None)
            axes[1][col].plot(xs, [p["max_mem_gib"] for p in pts], marker="o", label=label or None)
        axes[0][col].set_title(f"estimated step (ms) vs {key}", fontsize=8)
        axes[1][col].set_title(f"max memory per rank (GiB) vs {key}", fontsize=8)
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xlabel(key, fontsize=8)
            if len(groups) > 1:
                ax.legend(fontsize=6)
            if len({x for x in (_as_float(p["params"].get(key)) for p in points) if x}) > 2:
                ax.set_xscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_sweep_report(sweep_dir: Path) -> Optional[Path]:
    """Write the report into ``<sweep_dir>/report/``; None when no job finished with a plan."""
    points = load_points(sweep_dir)
    if not points:
        return None
    out = sweep_dir / "report"
    out.mkdir(exist_ok=True)
    keys = swept_keys(points)
    changed = changed_tables(points)
    _write_csv(out / "points.csv", points, keys)
    _write_markdown(out / "report.md", points, keys, changed)
    _write_chart(out / "estimates.png", points, keys)
    return out
