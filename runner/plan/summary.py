"""A plan's summary, read before its per-rank table: the estimated step and what bounds it (the critical rank and
its compute, forward and backward all-to-alls), min / median / max of memory and of each time column, and the
busiest ranks and nodes. The same figures become MLflow metrics (``plan/summary/...``), so a sweep's points can
be charted against each other in MLflow's compare view."""

from __future__ import annotations

import statistics
from typing import Dict, List

COLUMNS = ("hbm_bytes", "ddr_bytes", "fwd_compute_ms", "fwd_comms_ms", "bwd_compute_ms", "bwd_comms_ms", "total_ms")
PARTS = {"compute": ("fwd_compute_ms", "bwd_compute_ms"), "forward all-to-all": ("fwd_comms_ms",),
         "backward all-to-all": ("bwd_comms_ms",)}
BUSIEST = 5


def summary_metrics(ranks: List[Dict[str, float]], local: int) -> Dict[str, float]:
    """``plan/summary/<column>_{min,median,max}`` over ranks, the critical rank (the one with the largest
    estimated step) and its parts, the busiest node's summed step; empty without per-rank estimates."""
    if not ranks:
        return {}
    m: Dict[str, float] = {}
    for col in COLUMNS:
        values = [r[col] for r in ranks]
        m[f"plan/summary/{col}_min"] = min(values)
        m[f"plan/summary/{col}_median"] = float(statistics.median(values))
        m[f"plan/summary/{col}_max"] = max(values)
    critical = max(range(len(ranks)), key=lambda r: ranks[r]["total_ms"])
    m["plan/summary/critical_rank"] = float(critical)
    for part, cols in PARTS.items():
        m[f"plan/summary/critical_{part.replace(' ', '_').replace('-', '_')}_ms"] = sum(ranks[critical][c]
                                                                                      for c in cols)
    nodes = _node_totals(ranks, local)
    m["plan/summary/busiest_node"] = float(max(range(len(nodes)), key=nodes.__getitem__))
    return m


def _node_totals(ranks: List[Dict[str, float]], local: int) -> List[float]:
    local = max(local, 1)
    return [sum(r["total_ms"] for r in ranks[n * local:(n + 1) * local]) for n in range(-(-len(ranks) // local))]


def _fmt(col: str, value: float) -> str:
    return f"{value / 2**30:.3f}" if col.endswith("_bytes") else f"{value:.3f}"


def summary_markdown(ranks: List[Dict[str, float]], local: int) -> List[str]:
    """The report's opening section: one sentence on what bounds the step, then a table of min / median / max,
    then the busiest ranks and nodes."""
    if not ranks:
        return ["## Summary", "", "No per-rank estimates (a pinned plan): the planner's figures are not known.", ""]
    m = summary_metrics(ranks, local)
    critical = int(m["plan/summary/critical_rank"])
    parts = {part: sum(ranks[critical][c] for c in cols) for part, cols in PARTS.items()}
    top = max(parts, key=parts.__getitem__)
    step = ranks[critical]["total_ms"]
    share = parts[top] / step if step > 0 else 0.0
    lines = ["## Summary", "",
             f"Estimated step {step:.3f} ms, set by rank {critical} (node {critical // max(local, 1)}): "
             + ", ".join(f"{p} {v:.3f} ms" for p, v in parts.items())
             + f"; the {top} is {share:.0%} of it.", "",
             "| per rank | min | median | max |", "|---|---|---|---|"]
    for col in COLUMNS:
        label = col.replace("_bytes", " GiB").replace("_ms", " ms").replace("_", " ")
        lines.append(f"| {label} | " + " | ".join(_fmt(col, m[f"plan/summary/{col}_{k}"])
                                                 for k in ("min", "median", "max")) + " |")
    busiest = sorted(range(len(ranks)), key=lambda r: -ranks[r]["total_ms"])[:BUSIEST]
    nodes = _node_totals(ranks, local)
    top_nodes = sorted(range(len(nodes)), key=lambda n: -nodes[n])[:BUSIEST]
    lines += ["", "Busiest ranks (estimated step ms): "
              + ", ".join(f"{r} ({ranks[r]['total_ms']:.3f})" for r in busiest) + ".",
              "Busiest nodes (their ranks' steps summed, ms): "
              + ", ".join(f"{n} ({nodes[n]:.3f})" for n in top_nodes) + ".", ""]
    return lines
