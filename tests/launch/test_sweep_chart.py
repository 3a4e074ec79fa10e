"""The sweep report's chart (report/estimates.png): a grid over two swept keys against a third drawn as heatmaps,
one per value of the third, every cell saying its numbers; a search's scattered points against each key with one
legend outside the panels; titles that fit and never collide. Drawn from point records as the sweep report reads
them from a sweep folder (in process, a second or two)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Dict, List

KEYS = ["cluster.cross_node_bandwidth", "cluster.intra_node_bandwidth", "sharding.storage_reserve_gib"]


def _point(job: int, params: Dict[str, Any], step: float, fits: bool = True) -> Dict[str, Any]:
    """A point record as ``sweep_report.load_points`` gives it (the fields the chart reads)."""
    nan = float("nan")
    return {"job": job, "params": params, "status": "feasible" if fits else "infeasible",
            "est_step_ms": step if fits else nan, "lower_bound_ms": step * 0.99 if fits else nan,
            "max_mem_gib": 60.0 - params.get("sharding.storage_reserve_gib", 0.0) if fits else nan,
            "reserved_bytes": params.get("sharding.storage_reserve_gib", 0.0) * 2**30 if fits else nan}


def _grid() -> List[Dict[str, Any]]:
    combos = itertools.product([1.0, 3.0, 12.5], [30.0, 600.0], [6.0, 36.0, 72.0])
    return [_point(i, dict(zip(KEYS, c, strict=True)), 45.0 / c[0], fits=c[2] < 72.0) for i, c in enumerate(combos)]


def _no_collision(fig: Any) -> None:
    """Every title, the caption and the legend inside the figure; no two of them overlapping; the legend over no
    panel's data."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = fig.bbox
    texts = [ax.title for ax in fig.axes if ax.get_title()] + list(fig.texts)  # the suptitle among the latter
    boxes = [t.get_window_extent(renderer) for t in texts]
    for box in boxes:
        assert frame.x0 - 1 <= box.x0 and box.x1 <= frame.x1 + 1 and box.y0 >= frame.y0 - 1, (box, frame)
    for (a, ta), (b, tb) in itertools.combinations(zip(boxes, texts, strict=True), 2):
        assert not a.overlaps(b), (ta.get_text(), tb.get_text())
    panels = [ax.get_window_extent(renderer) for ax in fig.axes if ax.get_label() != "<colorbar>"]
    for legend in fig.legends:
        box = legend.get_window_extent(renderer)
        assert not any(box.overlaps(p) for p in panels), "the legend covers a panel"


def test_a_grid_over_two_keys_against_a_third_is_a_heatmap_per_value_of_the_third(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    from runner.launch.sweep.sweep_chart import chart_figure, grid_of, write_chart

    points = _grid()
    assert grid_of(points, KEYS) == [[1.0, 3.0, 12.5], [30.0, 600.0], [6.0, 36.0, 72.0]]
    fig = chart_figure(points, KEYS)
    heatmaps = [ax for ax in fig.axes if ax.images and ax.get_label() != "<colorbar>"]
    assert len(heatmaps) == 6  # step and memory per rank, for each of the 3 reserves
    assert [ax.get_title() for ax in heatmaps[:3]] == [f"storage_reserve_gib = {v}" for v in (6.0, 36.0, 72.0)]
    cells = [t.get_text() for ax in heatmaps for t in ax.texts]
    assert "45.00\n+1.01%" in cells  # the step and its gap to the bound, in the cell
    assert "54.0\nfree 6.0" in cells  # memory per rank and what the reserve kept free
    assert cells.count("no plan") == 2 * 6  # the 72 GiB reserve: grey cells, said so
    assert sum("lower bound:" in t.get_text() for t in fig.texts) == 1  # the bound explained once
    _no_collision(fig)
    plt.close(fig)
    write_chart(tmp_path / "estimates.png", points, KEYS)
    assert (tmp_path / "estimates.png").read_bytes()[:4] == b"\x89PNG"


def test_a_search_s_scattered_points_are_drawn_against_each_key_with_one_legend_outside() -> None:
    import matplotlib.pyplot as plt

    from runner.launch.sweep.sweep_chart import chart_figure, grid_of

    keys = ["sharding.proposer", "sharding.storage_reserve_percent"]
    points = [_point(i, {keys[0]: p, keys[1]: r}, 4.0 + r, fits=r < 0.55)
              for i, (p, r) in enumerate([("greedy", 0.12), ("dynamic_programming", 0.71), ("greedy", 0.33),
                                          ("dynamic_programming", 0.5), ("greedy", 0.9)])]
    assert grid_of(points, keys) is None  # a search draws values, not a grid
    fig = chart_figure(points, keys)
    assert len(fig.legends) == 1 and [t.get_text() for t in fig.legends[0].get_texts()] == [
        "a point's estimate", "its lower bound", "no plan fits"]
    assert all(ax.get_legend() is None for ax in fig.axes)  # no legend inside a panel
    _no_collision(fig)
    plt.close(fig)
