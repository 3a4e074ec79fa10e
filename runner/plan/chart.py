"""The plan's chart (``plan.png``): estimated memory, step time by component and traffic, per rank up to
:data:`PER_RANK_UP_TO` ranks, per node beyond (each node's largest memory and traffic, and its busiest rank's
step, so that 1,024 or 2,048 ranks read as 128 or 256 bars), with at most :data:`MAX_TICKS` ticks an axis."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from runner.plan.analysis import CHART, ESTIMATES

MAX_CHART_INCHES = 24  # a 128-rank chart 24 in wide, not 70 (an 8,000-pixel PNG took a second to write)
PER_RANK_UP_TO = 64
MAX_TICKS = 8
PARTS = (("fwd_compute_ms", "tab:green"), ("fwd_comms_ms", "tab:orange"), ("bwd_compute_ms", "tab:olive"),
         ("bwd_comms_ms", "tab:red"))


def ticks(count: int, most: int = MAX_TICKS) -> List[int]:
    """Positions 0..count-1 at a round step (1, 2 or 5 times a power of ten), at most ``most`` of them."""
    if count <= 0:
        return []
    step = next((m * 10**p for p in range(12) for m in (1, 2, 5) if math.ceil(count / (m * 10**p)) <= most), 0)
    return list(range(0, count, step))


def by_node(ranks: List[Dict[str, float]], comms: Dict[str, List[float]], local: int,
            mem_key: str) -> Tuple[List[Dict[str, float]], Dict[str, List[float]]]:
    """Each node as one bar: its largest memory and traffic, and its busiest rank's step components."""
    nodes: List[Dict[str, float]] = []
    traffic: Dict[str, List[float]] = {k: [] for k in ("intra_node_bytes", "cross_node_bytes")}
    for start in range(0, len(ranks), local):
        members = ranks[start:start + local]
        busiest = max(members, key=lambda r: r["total_ms"])
        nodes.append({**{k: busiest[k] for k, _ in PARTS}, mem_key: max(r[mem_key] for r in members)})
        for k in traffic:
            traffic[k].append(max(comms[k][start:start + local]))
    return nodes, traffic


def _bars(count: int) -> Any:
    """Draws one series of (stacked) bars: a bar per position up to :data:`PER_RANK_UP_TO`; beyond, touching bars
    as one filled outline (one artist instead of one per bar: a 128-node chart in a third of the time)."""
    def per_bar(ax: Any, values: List[float], bottom: List[float], **style: Any) -> None:
        ax.bar(range(count), values, bottom=bottom, width=0.8, **style)

    def outline(ax: Any, values: List[float], bottom: List[float], **style: Any) -> None:
        import numpy as np

        low = np.asarray(bottom, dtype=float)
        ax.stairs(low + np.asarray(values, dtype=float), np.arange(count + 1) - 0.5, baseline=low, fill=True, **style)
    return per_bar if count <= PER_RANK_UP_TO else outline


def load_matplotlib() -> None:
    """What :func:`chart` imports, imported (about a second)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    from matplotlib.figure import Figure  # noqa: F401


def chart(ranks: List[Dict[str, float]], comms: Dict[str, List[float]], device_type: str, path: Path,
          title: str, local: int = 0) -> None:
    """PNG: estimated memory, step time (by component) and traffic side by side; per node when there are more
    than :data:`PER_RANK_UP_TO` ranks and ``local`` (ranks per node) is known. Drawn on a bare Agg figure with a
    fixed layout (no pyplot state, no layout search: a sweep draws one per point)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    mem_key = "hbm_bytes" if device_type == "cuda" else "ddr_bytes"
    unit = "rank"
    if len(ranks) > PER_RANK_UP_TO and local > 0:
        ranks, comms = by_node(ranks, comms, local, mem_key)
        unit = f"node ({local} ranks; its largest memory and traffic, its busiest rank's step)"
    xs = list(range(len(ranks)))
    fig = Figure(figsize=(max(9.0, min(0.5 * len(xs) + 6, MAX_CHART_INCHES)), 3.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    bars = _bars(len(xs))
    axes[0].set_title(f"estimated {mem_key.split('_')[0].upper()} (GiB)")
    bars(axes[0], [r[mem_key] / 2**30 for r in ranks], [0.0] * len(xs), color="tab:blue")
    bottom = [0.0] * len(xs)
    for key, color in PARTS:
        vals = [r[key] for r in ranks]
        bars(axes[1], vals, bottom, color=color, label=key.replace("_ms", ""))
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    axes[1].set_title("estimated step time (ms)")
    axes[1].legend(fontsize=7, loc="lower right")
    intra = [b / 2**20 for b in comms["intra_node_bytes"]]
    bars(axes[2], intra, [0.0] * len(xs), label="within node", color="tab:cyan")
    bars(axes[2], [b / 2**20 for b in comms["cross_node_bytes"]], intra, label="across nodes", color="tab:purple")
    axes[2].set_title("estimated bytes sent per step (MiB)")
    axes[2].legend(fontsize=7, loc="lower right")
    for ax in axes:
        ax.set_xlabel(unit if len(unit) < 10 else unit.split(" (")[0], fontsize=8)
        ax.set_xticks(ticks(len(xs)))
        ax.tick_params(labelsize=7)
    if unit != "rank":
        title = f"{title}\nper {unit}"
    fig.suptitle(title, fontsize=9)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.16, top=0.78, wspace=0.25)
    fig.savefig(path, dpi=110)


def draw_plan_chart(folder: Path) -> Optional[Path]:
    """Render ``plan.png`` from the report's ``estimates.json`` in ``folder`` (matplotlib: about a second,
    so the driver draws it while the workers train, never a rank); None when there are no estimates (no
    plan, or a pinned plan without the planner's)."""
    try:
        found = json.loads((folder / ESTIMATES).read_text())
    except (OSError, ValueError):
        return None
    if not found.get("estimated", True):  # a pinned plan: no estimates of the planner's to draw
        return None
    chart(found["per_rank"], found["comms_bytes_per_step"], found["device"], folder / CHART, found.get("title", ""),
          int(found.get("local_world_size") or 0))
    return folder / CHART
