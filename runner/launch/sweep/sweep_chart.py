"""The sweep report's chart: estimated step time (with its lower bound, dashed) and max memory per rank
against each swept key.

One line per combination of the other swept keys; infeasible points (no plan fits) are marked with a
red cross on the axis, so a reserve that leaves no plan is visible next to the ones that do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional


def _as_float(v: Any) -> Optional[float]:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def write_chart(path: Path, points: List[Dict[str, Any]], keys: List[str]) -> None:
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
            line, = axes[0][col].plot(xs, [p["est_step_ms"] for p in pts], marker="o", label=label or None)
            bounds = [p.get("lower_bound_ms", float("nan")) for p in pts]
            if any(b == b for b in bounds):  # the lower bound under each point, dashed in the line's colour
                axes[0][col].plot(xs, bounds, linestyle="--", color=line.get_color(), linewidth=0.8,
                                  label=f"{label}, lower bound" if label else "lower bound")
            axes[1][col].plot(xs, [p["max_mem_gib"] for p in pts], marker="o", label=label or None)
        bad = [_as_float(p["params"].get(key)) for p in points if p["status"] == "infeasible"]
        for ax in (axes[0][col], axes[1][col]) if bad else ():
            ax.plot(bad, [0.0] * len(bad), "x", color="red", markersize=9, label="infeasible")
        axes[0][col].set_title(f"estimated step (ms; dashed: lower bound) vs {key}", fontsize=8)
        axes[1][col].set_title(f"max memory per rank (GiB) vs {key}", fontsize=8)
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xlabel(key, fontsize=8)
            if len(groups) > 1 or ax.get_legend_handles_labels()[1]:
                ax.legend(fontsize=6)
            if len({x for x in (_as_float(p["params"].get(key)) for p in points) if x}) > 2:
                ax.set_xscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
