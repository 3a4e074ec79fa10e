"""The sweep report's chart (``report/estimates.png``): each point's estimated step and memory per rank.

- **A grid over two or three swept keys** (every combination once, as a grid sweep gives): heatmaps, the first
  key down, the second across, one column of panels per value of the third (the last swept key). The top row
  colours the estimated step, each cell saying it and its gap to the lower bound; the bottom row the memory per
  rank, each cell saying it and what the storage reservation kept free. One colour bar per row, outside the
  panels, on one scale across them, so that panels compare; points with no plan are grey, "no plan".
- **Anything else** (one key, a search's scattered points, four keys or more): per swept key, every point's
  estimated step and memory against it, the lower bound as a grey dash under each point and points with no plan
  as red crosses at the bottom, named once in a legend below the panels.

The lower bound is explained once, in the figure's caption.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

BOUND = ("lower bound: the estimated step no plan can go below at that point (docs/planning.md); "
         "gap = estimated step / lower bound - 1")
MAX_FACETS = 6  # more values of the third key than this read better as points against each key


def _as_float(v: Any) -> Optional[float]:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _ordered(values: Sequence[Any]) -> List[Any]:
    """Distinct values, numbers by size, then the rest by their text."""
    return sorted(set(values), key=lambda v: (0, _as_float(v), "") if _as_float(v) is not None else (1, 0.0, str(v)))


def _short(key: str) -> str:
    return key.split(".")[-1]


def _gap(p: Dict[str, Any]) -> float:
    return p["est_step_ms"] / p["lower_bound_ms"] - 1 if p["lower_bound_ms"] > 0 else float("nan")


def grid_of(points: List[Dict[str, Any]], keys: List[str]) -> Optional[List[List[Any]]]:
    """Each key's values where the points are a full grid over two or three keys, each combination once, with at
    most ``MAX_FACETS`` values of the third; None otherwise."""
    if not 2 <= len(keys) <= 3:
        return None
    values = [_ordered([p["params"].get(k) for p in points]) for k in keys]
    combos = {tuple(p["params"].get(k) for k in keys) for p in points}
    if len(combos) != len(points) or len(points) != math.prod(len(v) for v in values):
        return None
    return values if len(keys) == 2 or len(values[2]) <= MAX_FACETS else None


def chart_figure(points: List[Dict[str, Any]], keys: List[str]) -> Any:
    """The chart of ``points`` (the sweep report's, at least one) over the swept ``keys``, as a Matplotlib figure
    (the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = grid_of(points, keys)
    return _heatmaps(plt, points, keys, grid) if grid else _against_each_key(plt, points, keys or ["job"])


def write_chart(path: Path, points: List[Dict[str, Any]], keys: List[str]) -> None:
    """Draw the chart of ``points`` over the swept ``keys`` into ``path`` (nothing without points)."""
    import matplotlib.pyplot as plt

    if not points:
        return
    fig = chart_figure(points, keys)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _heatmaps(plt: Any, points: List[Dict[str, Any]], keys: List[str], grid: List[List[Any]]) -> Any:
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.ticker import FormatStrFormatter

    rows, cols = grid[0], grid[1]
    facets = grid[2] if len(grid) > 2 else [None]
    at = {tuple(p["params"].get(k) for k in keys): p for p in points}
    width = max(2.6, 0.9 * len(cols) + 1.2)
    fig, axes = plt.subplots(2, len(facets), figsize=(width * len(facets) + 1.6, 2 * (0.55 * len(rows) + 1.3) + 1.2),
                             squeeze=False, layout="constrained")
    steps = [p["est_step_ms"] for p in points if p["status"] == "feasible"]
    mems = [p["max_mem_gib"] for p in points if p["status"] == "feasible"]
    # the step spans decades over a slow-to-fast network: a log scale keeps every cell's colour telling
    step_norm = _norm(steps, LogNorm, Normalize)
    mem_norm = _norm(mems, Normalize, Normalize)
    for j, facet in enumerate(facets):
        cells = [[at.get((r, c) if facet is None else (r, c, facet)) for c in cols] for r in rows]
        for i, (field, norm, cmap) in enumerate((("est_step_ms", step_norm, "YlOrRd"),
                                                 ("max_mem_gib", mem_norm, "Blues"))):
            ax = axes[i][j]
            data = np.array([[p[field] if p and p["status"] == "feasible" else np.nan for p in line]
                             for line in cells], dtype=float)
            ax.imshow(np.ma.masked_invalid(data), cmap=colormaps[cmap].with_extremes(bad="0.85"), norm=norm,
                      origin="lower", aspect="auto")
            for r, line in enumerate(cells):
                for c, p in enumerate(line):
                    text, shade = _cell(p, field, norm)
                    ax.text(c, r, text, ha="center", va="center", fontsize=7,
                            color="white" if shade > 0.6 else "black")
            ax.set_xticks(range(len(cols)), [str(v) for v in cols], fontsize=7)
            ax.set_yticks(range(len(rows)), [str(v) for v in rows], fontsize=7)
            ax.set_xlabel(_short(keys[1]), fontsize=8)
            ax.set_ylabel(_short(keys[0]) if j == 0 else "", fontsize=8)
            if i == 0 and facet is not None:
                ax.set_title(f"{_short(keys[2])} = {facet}", fontsize=9)
    for row, label in enumerate(("estimated step, ms", "max memory per rank, GiB")):
        bar = fig.colorbar(axes[row][0].images[0], ax=list(axes[row]), label=label, shrink=0.9)
        if isinstance(bar.norm, LogNorm):  # plain numbers at 1-2-5 steps, not powers of ten
            bar.minorticks_off()
            low, high = float(bar.norm.vmin or 0.0), float(bar.norm.vmax or 0.0)
            bar.set_ticks([t for t in (m * 10.0**e for e in range(-3, 7) for m in (1, 2, 5)) if low <= t <= high],
                          labels=None)
            bar.ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    inches = fig.get_figwidth()
    fig.suptitle(_wrapped(f"{len(points)} points: estimated step (top; in each cell the gap to its lower bound) and "
                          "memory per rank (bottom; below it what the storage reserve kept free)", inches, 9),
                 fontsize=9)
    fig.text(0.01, 0.005, _wrapped(BOUND + "; grey: no plan fits", inches, 7), fontsize=7, ha="left", va="bottom")
    fig.get_layout_engine().set(rect=(0, 0.03, 1, 0.97))  # room for the caption under the panels
    return fig


def _wrapped(text: str, inches: float, points: int) -> str:
    """``text`` in lines that fit a figure ``inches`` wide at font size ``points`` (a character is about half
    as wide as the font is tall), so that no title runs past the figure's edge."""
    import textwrap

    return textwrap.fill(text, max(20, int(inches * 72 / (0.55 * points))))


def _norm(values: List[float], wide: Any, narrow: Any) -> Any:
    """A colour scale over ``values``: ``wide``'s class where they span ten times or more, else ``narrow``'s."""
    ok = [v for v in values if v == v and v > 0]
    if not ok:
        return narrow(0.0, 1.0)
    low, high = min(ok), max(ok)
    return (wide if high >= 10 * low else narrow)(low, high if high > low else low * 1.01 + 1e-9)


def _cell(p: Optional[Dict[str, Any]], field: str, norm: Any) -> Tuple[str, float]:
    """A cell's text and how dark its colour is (0..1), for the text's own colour."""
    if p is None:
        return "", 0.0
    if p["status"] != "feasible":
        return "no plan", 0.0
    value = p[field]
    shade = float(norm(value)) if value == value else 0.0
    if field == "est_step_ms":
        gap = _gap(p)
        return f"{value:.2f}" + ("" if gap != gap else f"\n{gap:+.2%}"), shade
    free = p.get("reserved_bytes", float("nan"))
    return f"{value:.1f}" + ("" if free != free else f"\nfree {free / 2**30:.1f}"), shade


def _against_each_key(plt: Any, points: List[Dict[str, Any]], keys: List[str]) -> Any:
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(2, len(keys), figsize=(3.6 * len(keys) + 0.6, 5.8), squeeze=False, layout="constrained")
    for col, key in enumerate(keys):
        values = [p["params"].get(key, p["job"]) for p in points]
        numeric = all(_as_float(v) is not None for v in values)
        order = _ordered(values)
        xs: List[float] = [_as_float(v) or 0.0 if numeric else float(order.index(v)) for v in values]
        fits = [i for i, p in enumerate(points) if p["status"] == "feasible"]
        joined = len(keys) == 1  # one key: the points are one series, in order; else scattered over the others
        for row, field in enumerate(("est_step_ms", "max_mem_gib")):
            ax = axes[row][col]
            pts = sorted(fits, key=lambda i: xs[i])
            ax.plot([xs[i] for i in pts], [points[i][field] for i in pts], "o" + ("-" if joined else ""),
                    color="C0", markersize=4)
            if field == "est_step_ms":
                ax.plot([xs[i] for i in pts], [points[i]["lower_bound_ms"] for i in pts], "_", color="0.45",
                        markersize=12)
            bad = [xs[i] for i, p in enumerate(points) if p["status"] != "feasible"]
            if bad:  # a strip under the data for them, so that a cross covers no point
                low, high = ax.get_ylim()
                ax.set_ylim(low - 0.15 * (high - low), high)
                ax.plot(bad, [0.04] * len(bad), "x", color="red", markersize=8, transform=ax.get_xaxis_transform())
            ax.set_title("estimated step, ms" if row == 0 else "max memory per rank, GiB", fontsize=9)
            ax.set_xlabel(_short(key), fontsize=8)
            ax.tick_params(labelsize=7)
            if not numeric:
                ax.set_xticks(range(len(order)), [str(v) for v in order])
                ax.set_xlim(-0.5, len(order) - 0.5)  # room for the outer labels
            elif min(xs) > 0 and max(xs) >= 10 * min(xs):  # e.g. bandwidths from 1 to 600 GiB/s
                ax.set_xscale("log")
    handles = [Line2D([], [], marker="o", color="C0", linestyle="", label="a point's estimate"),
               Line2D([], [], marker="_", color="0.45", linestyle="", markersize=12, label="its lower bound"),
               Line2D([], [], marker="x", color="red", linestyle="", label="no plan fits")]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(_wrapped(f"{len(points)} points; {BOUND}", fig.get_figwidth(), 8), fontsize=8)
    return fig
