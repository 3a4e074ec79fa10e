"""Fitting a calibration's constants from measurements (:mod:`runner.train.calibrate` measures).

Every part is fitted to the same shape, ``time = fixed + size / rate``: a fixed cost per call (a kernel launch and
its bookkeeping, a collective's latency), which TorchRec's model leaves out and which dominates small tables, and a
bandwidth term. The sizes are TorchRec's own where its model has the term: an embedding kernel's bytes are those of
TorchRec's table-wise forward estimate on one rank (:func:`kernel_bytes`), so the fitted rate is the device
bandwidth that TorchRec's estimator divides by. Fits weigh relative error (each point's time counts alike, so the
small calls that set the fixed cost are not drowned by the large ones).

**Its results.** The fit of every rank's measurements, the file (:mod:`.calibration`),
kept for ``cluster.calibration=auto`` when its repeats agree, and its report beside TorchRec's default constants
(``calibration/report.md``, a chart of measured against fitted times, metrics and tags for the MLflow run).

One concept: a calibration made from raw measurements (the fit, the file it makes and the report of that fit),
read top to bottom: the fit's shape and terms, then what ``mode=calibrate`` makes of it.
"""

from __future__ import annotations

import datetime
import functools
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from runner.plan.cost.calibration import Calibration, cache_dir, file_name, save
from runner.plan.cost.row_reuse import repeated_share
from runner.plan.cost.step_estimate import (
    DenseFacts,
    allreduce_ms,
    ddp_allreduce,
    dense_ms,
    fitted_ms,
    lookups_ms,
    optimizer_ms,
    wait_factor,
)
from runner.plan.cost.table_size import doublings, multiple
from runner.plan.cost.torchrec_export import export_beside
from runner.plan.cost.trust import (
    FALLBACK,
    allowed_median_error,
    collectives_note,
    median_error,
    node_bandwidths,
    spread,
    trust,
)

if TYPE_CHECKING:
    from runner.config.schema import CalibrateSchema

GIB = 1024**3
ID_BYTES = 8  # TorchRec's BIGINT_DTYPE: ids are read as int64
FULL_BLOCK_DIM, MIN_LOOKUP_DIM = 128, 32  # TorchRec's block penalty threshold and its smallest looked-up width
# TorchRec's default constants (torchrec/distributed/planner/constants.py), GiB/s and its multiplier
TORCHREC = {"ddr": 51.0, "hbm": 897.0, "bwd_compute_multiplier": 2.0, "intra": 600.0, "cross": 12.5}


def _weights(y: Sequence[float]) -> List[float]:
    """Each point's weight in a fit, ``1 / y**2``: squared errors relative to the time."""
    return [1.0 / max(v, 1e-12) ** 2 for v in y]


def fit_line(x: Sequence[float], y: Sequence[float]) -> Tuple[float, float]:
    """``(a, b)`` with ``y ~ a + b x``, least squares on relative error (weights ``1 / y**2``)."""
    if len(x) < 2 or len(set(x)) < 2:
        raise ValueError("a fit needs at least two distinct sizes")
    w = _weights(y)
    sw = sum(w)
    mx = sum(wi * xi for wi, xi in zip(w, x, strict=True)) / sw
    my = sum(wi * yi for wi, yi in zip(w, y, strict=True)) / sw
    sxx = sum(wi * (xi - mx) ** 2 for wi, xi in zip(w, x, strict=True))
    sxy = sum(wi * (xi - mx) * (yi - my) for wi, xi, yi in zip(w, x, y, strict=True))
    b = sxy / sxx
    return my - b * mx, b


def fit_nonneg(x: Sequence[float], y: Sequence[float]) -> Tuple[float, float]:
    """:func:`fit_line` with ``a >= 0`` and ``b >= 0`` (a time has no negative part): where the free fit has a
    negative term (noise over a size that barely shows, as a small model's dense part at small batches), the best fit
    on the boundary by the same weighted error, either the weighted mean time (``b = 0``) or a line through the origin
    (``a = 0``), not the free fit with its negative term cut off (whose other term was fitted to make up for it)."""
    a, b = fit_line(x, y)
    if a >= 0 and b >= 0:
        return a, b
    w = _weights(y)
    flat = (sum(wi * yi for wi, yi in zip(w, y, strict=True)) / sum(w), 0.0)
    sxx = sum(wi * xi * xi for wi, xi in zip(w, x, strict=True))
    through_origin = (0.0, max(sum(wi * xi * yi for wi, xi, yi in zip(w, x, y, strict=True)) / sxx, 0.0))

    def sse(fit: Tuple[float, float]) -> float:
        return sum(wi * (fit[0] + fit[1] * xi - yi) ** 2 for wi, xi, yi in zip(w, x, y, strict=True))
    return min(flat, through_origin, key=sse)


def block_penalty(dim: int) -> float:
    """TorchRec's penalty for table-wise lookups narrower than a full block (1, 1.15, 1.75)."""
    return 1.0 if dim >= FULL_BLOCK_DIM else 1.15 if dim >= FULL_BLOCK_DIM // 2 else 1.75


def kernel_bytes(batch: int, pooling: int, dim: int, elem: int = 4) -> float:
    """The bytes TorchRec's estimator charges a table-wise lookup on one rank (ids read, rows looked up, pooled
    rows written), its block penalty included: the size a kernel call's time is fitted against."""
    lookups = batch * pooling
    return (math.ceil(lookups * ID_BYTES) + lookups * max(dim, MIN_LOOKUP_DIM) * elem + batch * dim * elem) \
        * block_penalty(dim)


def _errors(points: List[Tuple[float, float]], a: float, b: float) -> float:
    """The largest relative error of the fit ``a + b x`` over ``points`` (x, y)."""
    return max(abs(a + b * x - y) / y for x, y in points) if points else 0.0


REUSE_POINTS = 0.5  # the kernel points must hold one whose ids repeat rows this much, or no row share is read off
REUSE_ROWS = 256  # rows of the kernel's table whose ids repeat its rows, as the calibration's tiny tables' do


def fit_kernels(points: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Kernel constants from ``points`` (``rows``, ``batch``, ``pooling``, ``dim``, ``fwd_ms``, ``bwd_ms``): the
    device bandwidth (GiB/s, TorchRec's ``hbm_mem_bw``/``ddr_mem_bw`` for the fused kernel), the fixed forward and
    backward cost per call (ms), and the backward's multiple of the forward's bandwidth term where every id is a row
    of its own (TorchRec's ``bwd_compute_multiplier``: its model charges the backward per id, whatever the table's
    size). ``bwd_row_share``: the part of that backward which is paid per distinct row, not per id (the fused
    optimizer updates each row a step's ids reach once), fitted as ``fixed + per id x forward term + per row x
    forward term x distinct share`` (non-negative least squares, relative errors) where a point's ids repeat its
    rows (:data:`REUSE_POINTS`); else 0. On 2 CPU ranks, 16,384 ids of a 64-wide table took 1.9 ms backward over
    64 rows, 6.1 over 100,000 rows: what TorchRec's per-id term cannot tell apart."""
    repeated = [repeated_share(p.get("rows", math.inf), p["batch"] * p["pooling"]) for p in points]
    # the forward by the grid's own tables, not the small one whose ids repeat its rows: that one is read from the
    # caches (on 2 CPU ranks the bandwidth read 13 GiB/s without its points, 22 with them)
    own = [p for p in points if p.get("rows", math.inf) > REUSE_ROWS] or points
    x_own = [kernel_bytes(p["batch"], p["pooling"], p["dim"]) for p in own]
    fixed_f, per_byte = fit_nonneg(x_own, [p["fwd_ms"] for p in own])
    x = [kernel_bytes(p["batch"], p["pooling"], p["dim"]) for p in points]
    if per_byte <= 0:  # the launch, not the bytes, set every call's time: no bandwidth to read off
        return {"device_bw_gibps": float("nan"), "kernel_call_fwd_ms": fixed_f,
                "kernel_call_bwd_ms": 0.0, "bwd_compute_multiplier": float("nan"), "fit_error_fwd": float("inf"),
                "fit_error_bwd": float("inf"), "bwd_row_share": 0.0}
    fwd_term = [xi * per_byte for xi in x]  # TorchRec's forward compute, ms, with the fitted bandwidth
    bwd = [p["bwd_ms"] for p in points]
    if max(repeated, default=0.0) < REUSE_POINTS:
        fixed_b, multiplier = fit_nonneg(fwd_term, bwd)
        share = 0.0
    else:
        fixed_b, per_id, per_row = fit_residual([[1.0, t, t * (1.0 - r)] for t, r in zip(fwd_term, repeated,
                                                                                        strict=True)], bwd, bwd)
        multiplier = per_id + per_row
        share = round(per_row / multiplier, 6) if multiplier > 0 else 0.0  # (a least-squares 1e-16 is none)
    model = [fixed_b + multiplier * t * (1.0 - share * r) for t, r in zip(fwd_term, repeated, strict=True)]
    grid = [(p, (t, multiplier * t * (1.0 - share * r))) for p, t, r in zip(points, fwd_term, repeated, strict=True)
            if p.get("rows", math.inf) > REUSE_ROWS]
    curve = table_size_fit([p for p, _ in grid], [t for _, t in grid], (fixed_f, fixed_b))
    return {"device_bw_gibps": 1.0 / per_byte * 1000.0 / GIB, "kernel_call_fwd_ms": fixed_f,
            **({"table_size": curve} if curve else {}),
            "kernel_call_bwd_ms": fixed_b, "bwd_compute_multiplier": multiplier, "bwd_row_share": share,
            "fit_error_fwd": _errors(list(zip(x_own, [p["fwd_ms"] for p in own], strict=True)), fixed_f, per_byte),
            "fit_error_bwd": max((abs(m - y) / y for m, y in zip(model, bwd, strict=True)), default=0.0)}


def _scale(terms: Sequence[Tuple[float, float, float]]) -> float:
    """``s`` with ``s x term ~ time past the fixed cost`` (``terms``: (term, that time, the whole time)), least
    squares on the error relative to the whole time (as every fit here), at least 0."""
    w = _weights([whole for _, _, whole in terms])
    den = sum(wi * t * t for wi, (t, _, _) in zip(w, terms, strict=True))
    return max(sum(wi * t * y for wi, (t, y, _) in zip(w, terms, strict=True)) / den, 0.0) if den > 0 else 1.0


# where the kernel's cost per byte starts to grow (MiB, halves of a doubling from 0.5 MiB to 1 GiB) and how much it
# grows per doubling of the tables' bytes: the grid :func:`table_size_fit` searches
FROM_MIB = [2 ** (k / 2) for k in range(-2, 21)]
PER_DOUBLING = [k / 100 for k in range(0, 201)]
MIN_LEVEL = 0.05  # a level at least this: a time all fixed cost (launch-bound calls) reads off nothing


def _shapes_sse(points: Sequence[Tuple[Tuple[int, int, int], float, float, float]], from_mib: float,
                per_doubling: float) -> float:
    """How far ``points`` (shape, table bytes, time past the fixed cost, whole time) are from ``k_shape x (1 +
    per_doubling x doublings past from_mib)``, each shape its own ``k`` (least squares on relative error)."""
    shapes: Dict[Tuple[int, int, int], List[Tuple[float, float, float]]] = {}
    for shape, nbytes, y, whole in points:
        shapes.setdefault(shape, []).append((1.0 + per_doubling * doublings(nbytes, from_mib), y, whole))
    sse = 0.0
    for same in shapes.values():
        k = _scale(same)
        sse += sum((k * m - y) ** 2 / max(whole, 1e-9) ** 2 for m, y, whole in same)
    return sse


def table_size_fit(points: List[Dict[str, Any]], terms: List[Tuple[float, float]], fixed: Tuple[float, float]
                   ) -> Optional[Dict[str, Any]]:
    """The kernel's multiple of its fitted bandwidth term by the bytes of its tables (:mod:`.table_size`), forward
    and backward: ``level x (1 + per_doubling x doublings of the bytes past from_mib)``. ``from_mib`` and
    ``per_doubling`` from the shapes timed at more than one table size (each shape's own time level, so that what
    the bandwidth term misses of a shape is not read as a size's), searched over :data:`FROM_MIB` x
    :data:`PER_DOUBLING`; then ``level`` over every point (:func:`_scale`). ``points``: the kernel's grid (``rows``
    above :data:`REUSE_ROWS`), ``terms``: each point's forward and backward bandwidth terms by the fit, ``fixed``:
    the fixed costs. None where no shape was timed at two sizes. ``up_to_mib``: the largest table timed x 4, past
    which the multiple stays (a line in the log of the bytes is not read further than two doublings)."""
    def shape(p: Dict[str, Any]) -> Tuple[int, int, int]:
        return p["dim"], p["pooling"], p["batch"]

    def nbytes(p: Dict[str, Any]) -> float:  # the kernel's tables are float32
        return float(p["rows"] * p["dim"] * 4)

    sized = [(p, t) for p, t in zip(points, terms, strict=True) if math.isfinite(p.get("rows", math.inf))]
    shape_sizes: Dict[Tuple[int, int, int], set] = {}
    for p, _ in sized:
        shape_sizes.setdefault(shape(p), set()).add(p["rows"])
    if not any(len(rows) > 1 for rows in shape_sizes.values()):
        return None
    out: Dict[str, Any] = {"up_to_mib": round(4 * max(nbytes(p) for p, _ in sized) / 2**20, 3)}
    for i, part in enumerate(("fwd", "bwd")):
        data = [(shape(p), nbytes(p), p[f"{part}_ms"] - fixed[i], p[f"{part}_ms"]) for p, _ in sized
                if len(shape_sizes[shape(p)]) > 1]
        _, start, per = min((_shapes_sse(data, m, k), m, k) for m in FROM_MIB for k in PER_DOUBLING)
        level = _scale([(t[i] * (1.0 + per * doublings(nbytes(p), start)), p[f"{part}_ms"] - fixed[i],
                         p[f"{part}_ms"]) for p, t in sized])
        out[part] = {"level": round(max(level, MIN_LEVEL), 6), "from_mib": round(start, 6),
                     "per_doubling": round(per, 6)}
    return out


UVM_CACHE_RATIO = 0.2  # TorchRec's UVM_CACHING_RATIO: the share of a UVM-caching table's rows its GPU cache holds
HOST_LINK_MAX_GIBPS = 420.0
"""The fastest host-to-GPU link shipped (NVLink-C2C of a GH200, 450 GB/s a direction). A fitted host-to-GPU bandwidth
above it measured no host link: on an H100 (2026-11-27) the fit gave 716 GiB/s, the managed pages of a table that
small having moved to the GPU; such a fit is reported and not used."""


def fit_uvm(points: List[Dict[str, Any]], hbm_gibps: float) -> Dict[str, Any]:
    """The UVM-caching kernel's fit (``points`` as :func:`fit_kernels`' ) and the host-to-GPU bandwidth that makes
    TorchRec's ``(ratio x HBM + (1 - ratio) x host-to-GPU) / 10`` equal its measured bandwidth
    (``hbm_to_ddr_gibps``, TorchRec's ``hbm_to_ddr_mem_bw``; None where no positive one does)."""
    fit = fit_kernels(points)
    measured = fit["device_bw_gibps"]
    h2d = (10 * measured - UVM_CACHE_RATIO * hbm_gibps) / (1 - UVM_CACHE_RATIO) if math.isfinite(measured) else 0.0
    # None where the fit measured no bandwidth (launch-bound calls, or slower than the HBM share alone): a value a
    # calibration file holds is a measurement, and is checked as one when read
    return {"device_bw_gibps": measured if math.isfinite(measured) else None,
            "kernel_call_fwd_ms": fit["kernel_call_fwd_ms"],
            "hbm_to_ddr_gibps": h2d if 0 < h2d <= HOST_LINK_MAX_GIBPS else None,
            "fitted_hbm_to_ddr_gibps": h2d if h2d > 0 else None}


def fit_rate(points: List[Dict[str, Any]], size: str, scale: float = 1.0) -> Dict[str, float]:
    """``fixed_ms`` and ``ms_per_unit`` of ``ms ~ fixed + points[size] / scale * ms_per_unit``, and the fit's
    largest relative error."""
    x = [p[size] / scale for p in points]
    a, b = fit_nonneg(x, [p["ms"] for p in points])
    return {"fixed_ms": a, "ms_per_unit": b, "fit_error": _errors(list(zip(x, [p["ms"] for p in points],
                                                                             strict=True)), a, b)}


def fit_collective(points: List[Dict[str, Any]]) -> Dict[str, Optional[float]]:
    """A collective's latency (ms) and bandwidth (GiB/s, bytes each rank puts in per ms, as TorchRec's comms
    terms divide by) from ``points`` (``bytes``, ``ms``)."""
    fit = fit_rate(points, "bytes")
    # a time that does not grow with the bytes (noise over the sizes) measured no bandwidth: None, and the
    # collectives are not trusted (:func:`trust`)
    rate = 1.0 / fit["ms_per_unit"] * 1000.0 / GIB if fit["ms_per_unit"] > 0 else None
    return {"latency_ms": fit["fixed_ms"], "bandwidth_gibps": rate, "fit_error": fit["fit_error"]}


def median_ms(samples: Sequence[float]) -> float:
    return float(statistics.median(samples))


def _worst(samples_by_rank: List[List[float]]) -> List[float]:
    """Per repeat, the slowest rank's time (a collective ends when its last rank does)."""
    return [max(run) for run in zip(*samples_by_rank, strict=True)]


def _rank_spread(samples_by_rank: List[List[float]], of: Any = spread) -> float:
    """The median over ranks of each rank's own spread (ranks that differ from each other are not a busy machine);
    ``of``: :func:`median_error` for how well each rank knows its median."""
    return float(statistics.median(of(s) for s in samples_by_rank))


def _pooled(samples_by_rank: List[List[float]]) -> List[float]:
    return [s for rank in samples_by_rank for s in rank]


def fit_all(measured: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, float], Dict[str, float]]:
    """The calibration's constants, each part's spread and how well it knows its medians (the median over its points
    of :func:`median_error`) from every rank's measurements (``measured``:
    ``collectives`` ``{name: {scope: {bytes: [per-rank samples]}}}``, ``kernels`` ``[{shape, fwd, bwd}]`` with
    per-rank samples, ``dense`` ``{rows: {fwd, bwd, optimizer}}``, ``optimizer`` ``{params: samples}``, ``input``
    ``{rows: samples}``, ``params``: the dense parameters)."""
    constants: Dict[str, Any] = {"collectives": {}}
    spreads: Dict[str, List[float]] = {"collectives": [], "kernels": [], "dense": []}
    errors: Dict[str, List[float]] = {"collectives": [], "kernels": [], "dense": [], "sharded": []}
    for name, by_scope in measured["collectives"].items():
        for scope, by_size in by_scope.items():
            points, known = [], []
            for size, per_rank in by_size.items():
                worst = _worst(per_rank)
                spreads["collectives"].append(spread(worst))
                known.append(median_error(worst))
                points.append({"bytes": float(size), "ms": median_ms(worst)})
            errors["collectives"] += known
            # how well this collective alone knows its medians: where the part is not trusted, one that is known
            # well enough is still used (:func:`runner.plan.cost.trust.kept_collectives`)
            constants["collectives"].setdefault(name, {})[scope] = {**fit_collective(points),
                                                                   "median_error": statistics.median(known)}
    constants.update(node_bandwidths(constants["collectives"]))
    kernel_points = []
    for k in measured["kernels"]:
        fwd, bwd = _pooled(k["fwd"]), _pooled(k["bwd"])
        spreads["kernels"] += [_rank_spread(k["fwd"]), _rank_spread(k["bwd"])]
        errors["kernels"] += [_rank_spread(k["fwd"], median_error), _rank_spread(k["bwd"], median_error)]
        kernel_points.append({**k["shape"], "fwd_ms": median_ms(fwd), "bwd_ms": median_ms(bwd)})
    constants.update(fit_kernels(kernel_points))
    uvm = [{**k["shape"], "fwd_ms": median_ms(_pooled(k["fwd"])), "bwd_ms": median_ms(_pooled(k["bwd"]))}
           for k in measured.get("uvm_kernels") or [] if isinstance(k, dict) and k.get("shape")]
    if uvm:
        constants["uvm_caching"] = fit_uvm(uvm, constants["device_bw_gibps"])
    if not math.isfinite(constants["device_bw_gibps"]):  # no bandwidth to read off: TorchRec's, and not trusted
        memory = "hbm" if measured.get("job", {}).get("device") == "cuda" else "ddr"
        constants.update(device_bw_gibps=TORCHREC[memory], bwd_compute_multiplier=TORCHREC["bwd_compute_multiplier"],
                         kernel_fit_failed=True)
    constants["sharded"], world = {}, int((measured.get("job") or {}).get("world", 1))
    for kind, by_tables in measured.get("sharded", {}).items():
        constants["sharded"][kind] = {
            part: fit_lookups(by_tables, part, spreads, errors,
                              functools.partial(lookup_bytes_ms, constants, kind, world=world, part=part,
                                                local=int((measured.get("job") or {}).get("local", world))))
            for part in ("fwd", "bwd")}
    params = measured["params"]
    for part, key in (("fwd", "dense_fwd"), ("bwd", "dense_bwd")):
        points = [{"gflops": 2.0 * params * int(rows) / 1e9, "ms": median_ms(_pooled(m[part]))}
                  for rows, m in measured["dense"].items()]
        spreads["dense"] += [_rank_spread(m[part]) for m in measured["dense"].values()]
        errors["dense"] += [_rank_spread(m[part], median_error) for m in measured["dense"].values()]
        constants[key] = _per_unit(fit_rate(points, "gflops"), "ms_per_gflop")
    if measured.get("linear"):
        fit_linear(constants, measured)
    # the line, and the sizes as timed, which the step reads between (:func:`.step_estimate.optimizer_ms`)
    timed = {int(n): median_ms(_pooled(s)) for n, s in sorted(measured["optimizer"].items(), key=lambda i: int(i[0]))}
    points = [{"mparams": n / 1e6, "ms": ms} for n, ms in timed.items()]
    constants["optimizer"] = {**_per_unit(fit_rate(points, "mparams"), "ms_per_mparam"),
                              "measured_ms": {n: round(ms, 6) for n, ms in timed.items()}}
    points = [{"ksamples": int(rows) / 1000.0, "ms": median_ms(_pooled(s))} for rows, s in measured["input"].items()]
    constants["input"] = _per_unit(fit_rate(points, "ksamples"), "ms_per_ksample")
    if measured.get("probe"):  # the machine's speed as calibrated, for each job to compare its own with
        constants["probe_ms"] = {k: median_ms(_pooled(v)) for k, v in measured["probe"].items()}
    if measured.get("lockstep"):  # before the step's overhead: its parts wait for the slowest rank too
        constants["rank_wait"] = rank_wait(measured["lockstep"])
    if measured.get("step"):
        constants["step_overhead"] = step_overhead(constants, measured)
    return (constants, {part: float(statistics.median(s)) for part, s in spreads.items() if s},
            {part: float(statistics.median(s)) for part, s in errors.items() if s})


WAIT_SPAN = 1.5  # the calls at 4x the batch at least this much longer than at 1x, or no share is read off
MAX_WAIT_SHARE = 1.0  # at most the call's own time again (measured here: at most 0.6, four ranks on two cores)


def rank_wait(lockstep: Dict[Any, Dict[str, Any]]) -> Dict[str, float]:
    """How much longer the step's compute takes than its ranks' medians, from the dense part called in lockstep at
    two batches (:func:`runner.train.calibrate.lockstep_samples`: per batch, ``own``, per rank, per round, each
    call's time on that rank; ``slowest``, the slowest rank's of each call). Per round and batch, a call's wait is
    the mean over its calls of the slowest rank's time less the mean over ranks of each rank's median; fitted over
    the rounds of both batches as ``per_call_ms + share x the ranks' median`` (least squares, neither below 0).
    ``factor`` is ``1 + share``: what the step's compute pays in proportion (a step ends each stretch of compute
    between two collectives when its slowest rank does, and is a mean over steps where every part is timed as its
    median). ``per_call_ms``, what each stretch waits whatever its length (more ranks than cores: a rank waits for a
    core), is reported, not added: the tiny-table job's step, whose stretches are all short, holds it in its
    overhead. Where the calls at both batches take about as long (:data:`WAIT_SPAN`; a GPU's small dense part, bound
    by its launches) the wait is all per call; the share is at most :data:`MAX_WAIT_SHARE`."""
    import numpy as np
    from scipy.optimize import nnls

    points = []
    for by_batch in lockstep.values():
        own, slowest = by_batch["own"], by_batch["slowest"][0]
        for i, worst in enumerate(slowest):
            typical = statistics.mean(statistics.median(rank[i]) for rank in own)
            if worst and typical > 0:
                points.append((typical, statistics.mean(worst) - typical))
    if not points:
        return {"factor": 1.0, "per_call_ms": 0.0}
    calls = [t for t, _ in points]
    if max(calls) < WAIT_SPAN * min(calls):  # calls alike at both batches (launch-bound): no share to read off
        return {"factor": 1.0, "per_call_ms": max(float(statistics.mean(w for _, w in points)), 0.0)}
    (per_call, share), _ = nnls(np.array([[1.0, t] for t, _ in points]), np.array([w for _, w in points]))
    return {"factor": 1.0 + min(float(share), MAX_WAIT_SHARE), "per_call_ms": float(per_call)}


def step_overhead(c: Dict[str, Any], measured: Dict[str, Any]) -> Dict[str, Any]:
    """What the job's step with tiny tables took beyond every part measured alone (the loop, the pipeline, the
    model's wrappers) at each batch it was timed at: its step less the parts at that batch (:func:`_parts_ms`),
    fitted to the batch by :func:`fit_overhead`. Where the job was also timed in each family of sharded lookup
    (``step_family``, at the job's batch, in interleaved rounds), ``family_ms`` (:func:`family_overhead`): what
    each family's step takes there beyond the cheapest family's; the fit is of what is left (the table-wise job's
    residual less table-wise's own)."""
    job, params = measured["job"], measured["params"]

    def parts(rows: Any, kind: str = "table_wise") -> float:
        return _parts_ms(c, job, params, int(rows), measured["dense"].get(rows), kind)
    points = [{"batch": int(rows), "tables": len(job["dims"]), "measured_ms": median_ms(_pooled(per_rank)),
               "parts_ms": parts(rows)} for rows, per_rank in measured["step"].items()]
    by_family = measured.get("step_family") or {}
    if "table_wise" not in by_family or len(by_family) < 2 or job["batch"] not in measured["step"]:
        return fit_overhead(points)  # (with gradient accumulation the families are not timed)
    family, noise = family_overhead({kind: [s - parts(job["batch"], kind) for s in _worst(per_rank)]
                                     for kind, per_rank in by_family.items()})
    fit = fit_overhead([{**p, "parts_ms": p["parts_ms"] + family["table_wise"]} for p in points])
    return {**fit, "family_ms": family, "family_noise_ms": noise}


# two-sided 95% quantiles of Student's t by degrees of freedom (rounds - 1): few rounds know their spread poorly
T95 = {2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def family_overhead(residuals: Dict[str, List[float]]) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Each family's step beyond the cheapest family's, from ``residuals`` (per family, what its tiny-table job's
    step took beyond its parts in each round; the rounds interleaved, so that round ``i`` of every family saw the
    machine alike). A family's difference from table-wise is taken round by round; its median counts only where it
    lies beyond its standard error (``1.2533 x standard deviation / sqrt(n)`` in ms, as :func:`median_error` has it
    relative) times Student's t at 95% (:data:`T95`) and at least 3 rounds were timed, else it is 0 (the family
    costs what table-wise does): a difference the machine's noise can make would reorder plans from one calibration
    to the next. Each family's residual is then table-wise's median one plus its difference, and its term what it
    has beyond the cheapest's, no residual counted below 0 (a family whose step came out under its parts pays none,
    and does not raise the others). Also each difference's standard error, ms."""
    base = residuals["table_wise"]
    differences = {kind: [r - t for r, t in zip(values, base, strict=True)] for kind, values in residuals.items()
                   if kind != "table_wise"}
    noise = {kind: 1.2533 * statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else math.inf
             for kind, d in differences.items()}
    kept = {kind: float(statistics.median(d)) if len(d) >= 3
            and abs(statistics.median(d)) > T95.get(len(d) - 1, 1.96) * noise[kind] else 0.0
            for kind, d in differences.items()}
    level = float(statistics.median(base)) if base else 0.0
    absolute = {"table_wise": level, **{kind: level + v for kind, v in kept.items()}}
    least = max(min(absolute.values()), 0.0)
    return ({kind: max(r, 0.0) - least for kind, r in absolute.items()},
            {kind: (float(v) if math.isfinite(v) else 0.0) for kind, v in noise.items()})


def fit_residual(rows: List[List[float]], residual: List[float], measured: List[float]) -> List[float]:
    """The coefficients of ``residual ~ rows x coefficients``, none below 0 (non-negative least squares), each row's
    residual weighed relative to its ``measured`` step (a residual is a difference of two times: weighed relative to
    itself, one near 0 would pull the whole fit to 0)."""
    import numpy as np
    from scipy.optimize import nnls

    w = 1.0 / np.maximum(np.array(measured, dtype=float), 1e-9)
    return [float(v) for v in nnls(np.array(rows, dtype=float) * w[:, None], np.array(residual, dtype=float) * w)[0]]


def fit_overhead(points: List[Dict[str, float]]) -> Dict[str, float]:
    """The step's overhead from ``points`` (``batch`` per rank, the ``measured_ms`` step and the ``parts_ms`` every
    other part gave): ``fixed + per 1,000 samples x batch``, no term below 0 (non-negative least squares), each
    point's residual weighed relative to its measured step. The overhead is a difference of two times: where the
    parts alone reach the step at one batch, its residual is about 0 or below it, and weighed relative to itself (as
    :func:`fit_rate` weighs a time) that one point would pull the whole fit to 0 (a calibration of 2026-11-29: 4.1
    and 4.7 ms beyond the parts at 64 and 256 samples, -0.5 ms at 1,024, fitted 0.001 ms). The fit's error is the
    largest relative to the step."""
    if len(points) < 2:  # one batch timed: its residual (at least 0) is the overhead at every batch
        fixed, per_ksample = max(points[0]["measured_ms"] - points[0]["parts_ms"], 0.0) if points else 0.0, 0.0
    else:
        fixed, per_ksample = fit_residual([[1.0, p["batch"] / 1000.0] for p in points],
                                          [p["measured_ms"] - p["parts_ms"] for p in points],
                                          [p["measured_ms"] for p in points])
    error = max((abs(p["parts_ms"] + fixed + per_ksample * p["batch"] / 1000.0 - p["measured_ms"]) / p["measured_ms"]
                 for p in points), default=0.0)
    return {"fixed_ms": fixed, "ms_per_unit": per_ksample, "ms_per_ksample": per_ksample, "fit_error": float(error)}


def _parts_ms(c: Dict[str, Any], job: Dict[str, Any], params: int, batch: int,
              dense_at: Optional[Dict[str, Any]] = None, kind: str = "table_wise") -> float:
    """Every part of the tiny-table job's step at ``batch``: the embeddings' bytes by TorchRec's terms (the
    kernels' as table-wise: the tables are tiny; the outputs' by the ``kind`` family's collectives), the ``kind``
    lookups, the dense part and optimizer (``dense_at``: their samples at ``batch``, as a job times its own; else
    their fits), dense all-reduce, input."""
    world = job["world"]
    local = int(job.get("local", world))
    # the dense all-reduce as the step estimates it (a file without "local": its all-reduce as measured)
    reduce = ddp_allreduce(c, world, local)
    # each tiny table's ids (every rank's, on the rank that holds it) repeat its rows: its fused backward is that much
    # less (data-parallel tables are the dense optimizer's)
    reused = 1.0 if kind == "data_parallel" else tiny_backward(c, world, batch * world * job["pooling"])
    # tiny tables: the kernel's multiple at their bytes (:mod:`.table_size`), as the step takes a rank's
    held = sum(TINY_ROWS * world * d * 4 for d in job["dims"])
    sized = (1.0, 1.0) if kind == "data_parallel" else (multiple(c.get("table_size"), "fwd", held),
                                                        multiple(c.get("table_size"), "bwd", held))
    compute = (sum(table_bytes_ms(c, batch, world, job["pooling"], d) for d in job["dims"])
               * (sized[0] + sized[1] * c["bwd_compute_multiplier"] * reused))
    # the pooled outputs forward, their gradients backward, by the family's collectives (:func:`output_ms`)
    comms = sum(output_ms(c, kind, batch, world, local, d, part) for d in job["dims"] for part in ("fwd", "bwd"))
    dense = DenseFacts(params, params * 4, batch, tuple(map(tuple, job.get("layers", ()))),
                       job.get("other_params", 0))
    compute += (sum(median_ms(_pooled(dense_at[p])) for p in ("fwd", "bwd", "optimizer")) if dense_at
                else dense_ms(c, "fwd", dense) + dense_ms(c, "bwd", dense) + optimizer_ms(c, params / 1e6))
    # the compute waits for the slowest rank, as the step estimates it (:func:`rank_wait`)
    return (compute * wait_factor(c) + comms + sum(lookups_ms(c, [(kind, len(job["dims"]))], batch).values())
            + (allreduce_ms(reduce, params * 4) if world > 1 else 0.0)
            + (fitted_ms(c["input"], batch / 1000.0) if job.get("device", "cpu") == "cpu" else 0.0))


def fit_linear(constants: Dict[str, Any], measured: Dict[str, Any]) -> None:
    """``linear_fwd``/``linear_bwd`` (a linear layer's fixed cost and ms per GFLOP, from square layers of several
    widths and batches) and ``dense_rest_fwd``/``dense_rest_bwd``: what the calibrated model's dense part took beyond
    its own layers at that rate (its interaction, loss, activations), fitted to its batch (fixed + ms per 1,000
    samples)."""
    job = measured["job"]
    for part in ("fwd", "bwd"):
        points = [{"gflops": 2.0 * int(w) * int(w) * int(r) / 1e9, "ms": median_ms(_pooled(m[part]))}
                  for w, by_rows in measured["linear"].items() for r, m in by_rows.items()]
        fit = _per_unit(fit_rate(points, "gflops"), "ms_per_gflop")
        constants[f"linear_{part}"] = fit

        rest = [{"ksamples": int(r) / 1000.0, "ms": max(median_ms(_pooled(m[part])) - _layers_ms(fit, job, int(r)),
                                                        1e-3)} for r, m in measured["dense"].items()]
        constants[f"dense_rest_{part}"] = _per_unit(fit_rate(rest, "ksamples"), "ms_per_ksample")


def _layers_ms(fit: Dict[str, float], job: Dict[str, Any], batch: int) -> float:
    """The calibrated model's linear layers (and its other parameters) at ``batch`` by the linear fit ``fit``."""
    flops = [2.0 * i * o * batch / 1e9 for i, o in job["layers"]] + [2.0 * job["other_params"] * batch / 1e9]
    return sum(fit["ms_per_unit"] * f for f in flops) + fit["fixed_ms"] * len(job["layers"])


SHARDED_DIM = 16  # the width of the sharded lookups' tiny tables (runner.train.calibrate.sharded_samples)
TINY_ROWS = 64  # the rows per rank of the calibration's tiny tables (the sharded lookups' and the tiny-table job's)


def table_bytes_ms(c: Dict[str, Any], batch: int, world: int, pooling: int, dim: int) -> float:
    """One table's kernel bytes by TorchRec's terms, with the constants ``c``, at a per-rank ``batch`` of ``world``
    ranks (its lookups' work spread over them), ``pooling`` ids per sample, ``dim`` wide: the forward kernel's ms
    (the backward's: times the calibrated multiplier; its output's collective: :func:`output_ms`)."""
    return kernel_bytes(batch * world, pooling, dim) / world * 1000.0 / (c["device_bw_gibps"] * GIB)


def tiny_backward(c: Dict[str, Any], world: int, ids: float) -> float:
    """The share of the calibrated backward multiplier a tiny table (:data:`TINY_ROWS` rows per rank) pays when a
    step sends it ``ids`` ids: they repeat its rows, and the fused backward pays the distinct rows' share
    (``bwd_row_share``) once per row."""
    return 1.0 - c.get("bwd_row_share", 0.0) * repeated_share(TINY_ROWS * world, ids)


BATCHED_COPY = 2.455  # TorchRec's BATCHED_COPY_PERF_FACTOR: a row-wise backward's copy, per byte at the device's
# the collective a family's pooled output takes, forward and backward, as TorchRec's terms charge it
OUTPUT_COLLECTIVE = {"table_wise": ("all_to_all", "all_to_all"), "row_wise": ("reduce_scatter", "all_gather")}


def output_ms(c: Dict[str, Any], kind: str, batch: int, world: int, local: int, dim: int, part: str) -> float:
    """What TorchRec's terms charge a rank, on average, for one table's pooled output sharded ``kind``, ``part``
    ``fwd`` or ``bwd``, at a per-rank ``batch`` of ``world`` ranks (``local`` a node), ``dim`` wide, by the
    constants ``c``: the whole batch's output (TorchRec's ``output_write_size``: ``batch x world x dim x 4``) at
    the bandwidth of its collective in its scope (``intra`` on one node, else ``cross``; the all-to-all's where
    that collective was not measured, none where neither was). Table-wise the table sits on one of the ``world``
    ranks (a ``world``-th of it each, on average); row-wise every rank holds a shard and pays it whole, forward as
    a reduce-scatter, backward as an all-gather, which on 2 CPU ranks moved 0.5-0.7 GiB/s where the all-to-all
    moved 1.4-1.7. Data-parallel: no output to send."""
    if kind not in OUTPUT_COLLECTIVE:
        return 0.0
    fits, scope = c.get("collectives") or {}, "intra" if world <= local else "cross"
    name = OUTPUT_COLLECTIVE[kind][part == "bwd"]
    gibps = ((fits.get(name) or {}).get(scope) or {}).get("bandwidth_gibps") \
        or ((fits.get("all_to_all") or {}).get(scope) or {}).get("bandwidth_gibps")
    size = batch * world * dim * 4 / (world if kind == "table_wise" else 1)
    # and, row-wise backward, TorchRec's batched copy of the gathered gradients (its BATCHED_COPY_PERF_FACTOR)
    copy = size * BATCHED_COPY * 1000.0 / (c["device_bw_gibps"] * GIB) \
        if kind == "row_wise" and part == "bwd" and c.get("device_bw_gibps") else 0.0
    return (size * 1000.0 / (gibps * GIB) if gibps else 0.0) + copy


def lookup_bytes_ms(c: Dict[str, Any], kind: str, tables: int, batch: int, world: int, part: str,
                    local: Optional[int] = None) -> float:
    """What the step's embeddings part charges by TorchRec's terms, with the constants ``c``, for ``tables`` of the
    sharded lookups' tiny tables (:data:`SHARDED_DIM` wide, one id per sample) sharded ``kind`` at a per-rank
    ``batch`` of ``world`` ranks (``local`` a node), ``part`` ``fwd`` or ``bwd``: the kernel's bytes (the backward at
    the calibrated multiplier) and, but data-parallel (each rank its own batch, no output to send), the pooled
    output's collective as TorchRec charges it (:func:`output_ms`: row-wise a reduce-scatter forward and an
    all-gather backward of the whole batch's output on every rank; charged as a table-wise all-to-all, row-wise's
    went into its own fitted terms, which the step then added beside TorchRec's charge). A sharded lookup's time
    beyond this is its own term (:func:`fit_lookups`): at 4,096 samples on 1 x 2, 8 tiny tables table-wise took
    6.9 ms backward, of which TorchRec's terms charge 3.7 (the kernel's backward at x24.6 and the all-to-all), which
    the step's embeddings part charges the job's tables already; the kernel at :mod:`.table_size`'s multiple for
    tables that small."""
    kernel = table_bytes_ms(c, batch, 1 if kind == "data_parallel" else world, 1, SHARDED_DIM)
    if kind != "data_parallel":  # tiny tables: the kernel's multiple at their bytes, as the step charges a rank's
        kernel *= multiple(c.get("table_size"), part, tables * TINY_ROWS * world * SHARDED_DIM * 4)
    out = output_ms(c, kind, batch, world, world if local is None else local, SHARDED_DIM, part)
    if kind == "data_parallel":
        return tables * kernel * (c["bwd_compute_multiplier"] if part == "bwd" else 1.0)
    return tables * (kernel * (c["bwd_compute_multiplier"] * tiny_backward(c, world, batch * world)
                               if part == "bwd" else 1.0) + out)


def fit_lookups(by_tables: Dict[Any, Dict[Any, Dict[str, Any]]], part: str, spreads: Dict[str, List[float]],
                errors: Dict[str, List[float]], bytes_ms: Callable[[int, int], float] = lambda n, b: 0.0
                ) -> Dict[str, float]:
    """A family of sharded lookup's ``part`` (``fwd``/``bwd``) from ``{tables: {batch: {part: per-rank samples}}}``
    (one and several tables, each at a few batches), less what TorchRec's terms charge their bytes (``bytes_ms(tables,
    batch)``, :func:`lookup_bytes_ms`): ``ms ~ fixed + per table x tables + per 1,000 samples of each table x tables x
    batch / 1000`` (least squares on relative error, none below 0: the best such fit, as :func:`fit_nonneg`, not the
    free one with its negative terms cut off)."""
    import numpy as np
    from scipy.optimize import nnls

    points = [(int(n), int(b), max(median_ms(_worst(m[part])) - bytes_ms(int(n), int(b)), 1e-3))
              for n, by_batch in by_tables.items() for b, m in by_batch.items()]
    spreads.setdefault("sharded", []).extend(spread(_worst(m[part])) for by_batch in by_tables.values()
                                            for m in by_batch.values())
    errors.setdefault("sharded", []).extend(median_error(_worst(m[part])) for by_batch in by_tables.values()
                                           for m in by_batch.values())
    a = np.array([[1.0, n, n * b / 1000.0] for n, b, _ in points])
    y = np.array([t for _, _, t in points])
    w = 1.0 / np.maximum(y, 1e-9)
    fixed, per_table, per_ksample = (float(v) for v in nnls(a * w[:, None], y * w)[0])
    return {"fixed_ms": fixed, "per_table_ms": per_table, "ms_per_table_ksample": per_ksample}


def _per_unit(fit: Dict[str, float], unit: str) -> Dict[str, float]:
    """A fit with its slope named by its unit (kept as ``ms_per_unit`` too, which the step estimate reads)."""
    return {**fit, unit: fit["ms_per_unit"]}


FOLDER = "calibration"  # in the run folder, and the artifacts' path in the MLflow run


@dataclass
class CalibrationReport:
    """What rank 0's reporter logs (:meth:`runner.track.reporter.Reporter.calibrated`)."""

    folder: Path
    metrics: Dict[str, float]
    tags: Dict[str, Any]
    console: str
    results: Dict[str, Any]


def _summary(measured: Dict[str, Any]) -> Dict[str, Any]:
    """The measurements as the file keeps them: each point's median over ranks and repeats, ms."""
    def med(per_rank: List[List[float]]) -> float:
        return round(statistics.median(s for rank in per_rank for s in rank), 6)
    return {"collectives": {n: {sc: {int(b): med(v) for b, v in by.items()} for sc, by in s.items()}
                            for n, s in measured["collectives"].items()},
            "kernels": [{**k["shape"], "fwd_ms": med(k["fwd"]), "bwd_ms": med(k["bwd"])} for k in measured["kernels"]],
            "sharded": {kind: {int(n): {int(b): {p: med(v) for p, v in m.items()} for b, m in by_batch.items()}
                               for n, by_batch in by_tables.items()}
                        for kind, by_tables in (measured.get("sharded") or {}).items()},
            "dense": {int(r): {p: med(v) for p, v in m.items()} for r, m in measured["dense"].items()},
            "optimizer": {int(n): med(v) for n, v in measured["optimizer"].items()},
            "input": {int(r): med(v) for r, v in measured["input"].items()}, "dense_params": measured["params"],
            "step": {int(r): med(v) for r, v in (measured.get("step") or {}).items()},
            "step_family": {k: [round(v, 6) for v in _worst(per_rank)]
                            for k, per_rank in (measured.get("step_family") or {}).items()},
            # each round's slowest rank (its mean: a step is a mean over steps) beside each rank's own median (what
            # the parts are timed as) and mean (which the slowest's never falls below: it is the largest of each call)
            "lockstep": {int(b): {"slowest_mean_ms": [round(statistics.mean(r), 6) for r in m["slowest"][0]],
                                  "own_median_ms": [[round(statistics.median(r), 6) for r in rank]
                                                    for rank in m["own"]],
                                  "own_mean_ms": [[round(statistics.mean(r), 6) for r in rank] for rank in m["own"]]}
                         for b, m in (measured.get("lockstep") or {}).items()}}


def uvm_text(uvm: Dict[str, Any]) -> str:
    """The host-to-GPU bandwidth the UVM-caching kernel's fit gave: used, not used (above any host link), or none."""
    if uvm.get("hbm_to_ddr_gibps") is not None:
        return f"{uvm['hbm_to_ddr_gibps']:.3f}"
    fitted = uvm.get("fitted_hbm_to_ddr_gibps")
    if isinstance(fitted, (int, float)) and fitted > 0:
        return (f"not used: the fit gave {fitted:.0f}, above any host link ({HOST_LINK_MAX_GIBPS:g}): the table's "
                "managed pages moved to the GPU, so TorchRec's default stays")
    return "not measured"


def _markdown(cal: Calibration, where: Path, kept: Optional[Path], max_spread: float, repeats: int) -> str:
    allowed = allowed_median_error(max_spread, repeats)
    c, fp = cal.constants, cal.fingerprint
    memory = "hbm" if fp["device_kind"] == "cuda" else "ddr"

    def gib(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, (int, float)) else "not measured"
    lines = [f"# Calibration: {fp['device_name']}, {fp['nodes']} x {fp['workers_per_node']} workers", "",
             f"torch {fp['torch']}, FBGEMM {fp['fbgemm']}, TorchRec {fp['torchrec']}, CUDA {fp['cuda']}; "
             f"made {cal.made}. File: `{where}`" + (f"; kept for `cluster.calibration=auto`: `{kept}`" if kept else
                                                   "; not kept for `cluster.calibration=auto`") + ".", "",
             "| constant | measured here | TorchRec's default |", "|---|---|---|",
             f"| device bandwidth of the fused kernel (`{memory}_mem_bw`), GiB/s | {c['device_bw_gibps']:.3f} | "
             f"{TORCHREC[memory]:g} |",
             f"| backward / forward (`bwd_compute_multiplier`) | {c['bwd_compute_multiplier']:.3f} | 2 |",
             f"| the backward's share paid per distinct row, not per id (`bwd_row_share`, the runner's own) | "
             f"{c.get('bwd_row_share', 0.0):.3f} | not modelled (0) |",
             f"| fixed cost per kernel call, forward / backward, ms | {c['kernel_call_fwd_ms']:.4f} / "
             f"{c['kernel_call_bwd_ms']:.4f} | not modelled (0) |",
             f"| host to GPU for UVM-caching tables (`hbm_to_ddr_mem_bw`), GiB/s | "
             f"{uvm_text(c.get('uvm_caching') or {})} | 32 |",
             f"| all-to-all within a node (`intra_host_bw`), GiB/s | {gib(c.get('intra_node_bandwidth'))} | 600 |",
             f"| all-to-all across nodes (`inter_host_bw`), GiB/s | {gib(c.get('cross_node_bandwidth'))} | 12.5 |", "",
             "| collective | scope | latency ms | bandwidth GiB/s | largest fit error |", "|---|---|---|---|---|"]
    for name, by_scope in c["collectives"].items():
        for scope, f in by_scope.items():
            lines.append(f"| {name} | {scope} | {f['latency_ms']:.4f} | {gib(f['bandwidth_gibps'])} | "
                         f"{f['fit_error']:.1%} |")
    lines += ["", "| part | fixed ms | slope | largest fit error |", "|---|---|---|---|"]
    for key, unit in (("dense_fwd", "ms per GFLOP"), ("dense_bwd", "ms per GFLOP"), ("optimizer", "ms per M params"),
                      ("input", "ms per 1,000 samples")):
        f = c[key]
        lines.append(f"| {key} | {f['fixed_ms']:.4f} | {f['ms_per_unit']:.4f} {unit} | {f['fit_error']:.1%} |")
    lines += ["", f"Ranks waiting for each other: {wait_text(c)}.",
              "", f"The step's overhead (the tiny-table job beyond its parts): {overhead_text(c)}."]
    lines += ["", f"Kernel fit: largest error forward {c['fit_error_fwd']:.1%}, backward {c['fit_error_bwd']:.1%}.",
              "", "Each part's trust: how well its repeats know their medians (the median's relative standard error, "
              f"1.2533 x spread / sqrt(repeats)), allowed {allowed:.1%} (what {repeats} repeats scattered by "
              f"calibrate.max_spread={max_spread:g} know); a scattered point takes more repeats, up to "
              "calibrate.max_repeats.", "", "| part | spread of the repeats | median known to | trusted | if not: "
              "the plan uses |", "|---|---|---|---|---|"]
    lines += [f"| {part} | {cal.spread.get(part, 0.0):.1%} | {cal.median_error.get(part, 0.0):.1%} | "
              f"{'yes' if cal.trusted.get(part) else '**no**'} | {FALLBACK[part]} |" for part in FALLBACK]
    return "\n".join(lines) + "\n"


def wait_text(c: Dict[str, Any]) -> str:
    """``x1.120 on the step's compute ... and 1.8 ms per stretch ...`` (:func:`rank_wait`)."""
    w = c.get("rank_wait")
    if not w:
        return "not measured (every part's median as it is)"
    return (f"x{w['factor']:.3f} on the step's compute (the dense part, its optimizer, the embedding kernels): each "
            "stretch of compute between two collectives ends when the slowest rank's does, and the step is their "
            f"mean, where each part was timed as its median; and {w.get('per_call_ms', 0.0):.2f} ms per stretch "
            "whatever its length, in the tiny-table job's overhead")


def overhead_text(c: Dict[str, Any]) -> str:
    """``12.3 ms + 4.5 ms per 1,000 samples; each family beyond the cheapest ...: table_wise +14.0 ms, row_wise +0.0
    ms (difference from table_wise known to +-2.1), ...``."""
    o = c.get("step_overhead") or {}
    if not o:
        return "not measured"
    text = f"{o['fixed_ms']:.1f} ms + {o['ms_per_ksample']:.1f} ms per 1,000 samples"
    family, noise = o.get("family_ms") or {}, o.get("family_noise_ms") or {}
    if family:
        text += ("; each family beyond the cheapest (a difference within Student's t at 95% times its noise counts "
                 "as 0): ") + ", ".join(
            f"{k} +{v:.1f} ms" + (f" (difference from table_wise known to +-{noise[k]:.1f})" if k in noise else "")
            for k, v in family.items())
    return text


def _chart(cal: Calibration, path: Path) -> None:
    """Measured against fitted: the kernel's forward and backward by bytes, each collective by message size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c, m = cal.constants, cal.measurements
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    x = [kernel_bytes(k["batch"], k["pooling"], k["dim"]) for k in m["kernels"]]
    per_byte = 1000.0 / (c["device_bw_gibps"] * 2**30)
    left.scatter(x, [k["fwd_ms"] for k in m["kernels"]], s=12, label="forward, measured")
    left.scatter(x, [k["bwd_ms"] for k in m["kernels"]], s=12, label="backward, measured")
    xs = sorted(x)
    left.plot(xs, [c["kernel_call_fwd_ms"] + v * per_byte for v in xs], label="forward, fitted")
    left.plot(xs, [c["kernel_call_bwd_ms"] + c["bwd_compute_multiplier"] * v * per_byte for v in xs],
              label="backward, fitted")
    left.plot(xs, [v / (TORCHREC["hbm" if cal.fingerprint["device_kind"] == "cuda" else "ddr"] * 2**30) * 1000
                   for v in xs], "k--", label="forward, TorchRec's default")
    left.set(xscale="log", yscale="log", xlabel="bytes (TorchRec's table-wise estimate)", ylabel="ms",
             title="embedding kernel")
    for name, by_scope in m["collectives"].items():
        for scope, points in by_scope.items():
            sizes = sorted(points)
            fit = c["collectives"][name][scope]
            right.scatter(sizes, [points[s] for s in sizes], s=12, label=f"{name} ({scope})")
            if fit["bandwidth_gibps"]:  # None: the time did not grow with the bytes, no line to draw
                right.plot(sizes, [fit["latency_ms"] + s / (fit["bandwidth_gibps"] * 2**30) * 1000 for s in sizes])
    right.set(xscale="log", yscale="log", xlabel="bytes per rank", ylabel="ms", title="collectives")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _trust_words(cal: Calibration, settings: CalibrateSchema, kept: Optional[Path]) -> str:
    """Which parts are trusted, and what the next plan uses: the line ``mode=calibrate`` ends with."""
    ok = [p for p, yes in cal.trusted.items() if yes]
    gone = [f"{p} (its medians known to {cal.median_error.get(p, 0.0):.1%}"
            + (f", allowed {allowed_median_error(settings.max_spread, settings.repeats):.1%}"
               if cal.median_error.get(p, 0.0) > allowed_median_error(settings.max_spread, settings.repeats)
               else ", no bandwidth to read off") + f": {FALLBACK[p]}"
            + (collectives_note(cal.constants) if p == "collectives" else "") + ")"
            for p, yes in cal.trusted.items() if not yes]
    words = f"trusted: {', '.join(ok) or 'no part'}" + (f"; not trusted: {'; '.join(gone)}" if gone else "")
    if kept:
        return words + f"; the next plan here (cluster.calibration=auto) uses it ({kept.name})"
    if not ok:
        return words + ": not kept for cluster.calibration=auto (a busy machine?), measure again when it is quieter"
    return words + "; not kept (calibrate.keep=false): pass it by path as cluster.calibration"


def calibrate_results(settings: CalibrateSchema, calibration_dir: Optional[str], run_folder: Path,
                      measured: Dict[str, Any], fingerprint: Dict[str, Any], seconds: float, reporter: Any
                      ) -> Dict[str, Any]:
    """Fit, write (and keep in ``cluster.calibration_dir``, ``calibration_dir``, when trusted and ``calibrate.keep``),
    report and log; the job's results. ``settings``: the ``calibrate`` keys."""
    constants, spreads, errors = fit_all(measured)
    parts = trust(errors, constants, allowed_median_error(settings.max_spread, settings.repeats))
    cal = Calibration(fingerprint, constants, spreads, parts, _summary(measured),
                      datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), errors)
    trusted = any(parts.values())  # kept when a part can be used: the others fall back alone
    folder = run_folder / FOLDER
    where = save(cal, folder / "calibration.yaml")
    kept = save(cal, cache_dir(calibration_dir) / file_name(fingerprint)) if trusted and settings.keep else None
    (folder / "report.md").write_text(_markdown(cal, where, kept, settings.max_spread, settings.repeats))
    _chart(cal, folder / "calibration.png")
    torchrec = export_beside(cal, where)  # TorchRec's own terms, logged with the files above
    c = constants
    metrics = {f"calibration/{k}": float(c[k]) for k in ("device_bw_gibps", "bwd_compute_multiplier",
                                                         "kernel_call_fwd_ms", "kernel_call_bwd_ms")}
    metrics["calibration/bwd_row_share"] = float(c.get("bwd_row_share", 0.0))
    metrics.update({f"calibration/{k}_gibps": float(c[k]) for k in ("intra_node_bandwidth", "cross_node_bandwidth")
                    if c.get(k) is not None})
    if c.get("rank_wait"):
        metrics["calibration/rank_wait_factor"] = float(c["rank_wait"]["factor"])
    metrics.update({f"calibration/spread/{k}": v for k, v in spreads.items()})
    metrics.update({f"calibration/median_error/{k}": v for k, v in errors.items()})
    metrics.update({f"calibration/trusted/{k}": float(v) for k, v in parts.items()})
    metrics["calibration/seconds"] = seconds
    a2a = next(iter(c["collectives"].get("all_to_all", {}).values()), None)  # within a node, else across
    head = (f"device {c['device_bw_gibps']:.2f} GiB/s (TorchRec's default "
            f"{TORCHREC['hbm' if fingerprint['device_kind'] == 'cuda' else 'ddr']:g}), backward x"
            f"{c['bwd_compute_multiplier']:.2f} (2; {c.get('bwd_row_share', 0.0):.0%} of it per distinct row), "
            f"kernel call {c['kernel_call_fwd_ms']:.3f} + "
            f"{c['kernel_call_bwd_ms']:.3f} ms, "
            + (f"all-to-all {a2a['bandwidth_gibps']:.2f} GiB/s + {a2a['latency_ms']:.3f} ms"
               if a2a and a2a["bandwidth_gibps"] else "all-to-all: no bandwidth (its time did not grow with the bytes)"
               if a2a else "no collectives (1 rank)"))
    if c.get("rank_wait"):
        head += f", compute waits x{c['rank_wait']['factor']:.2f} for the slowest rank"
    family = (c.get("step_overhead") or {}).get("family_ms") or {}
    if any(family.values()):
        head += ", step beyond the cheapest family: " + ", ".join(f"{k} +{v:.1f} ms" for k, v in family.items() if v)
    said = _trust_words(cal, settings, kept)
    results = {"mode": "calibrate", "file": str(where), "kept": str(kept) if kept else None, "trusted": parts,
               "spread": spreads, "median_error": errors, "seconds": seconds, "headline": f"{head}; {said}"}
    tags = {"runner.calibration_file": str(where), "runner.calibration_trusted": ",".join(
                p for p, ok in parts.items() if ok) or "none",
            "runner.device_name": fingerprint["device_name"], "runner.world_size": fingerprint["nodes"]
            * fingerprint["workers_per_node"]}
    console = f"[runner] calibration: {head}\n[runner] calibration: {said}\n[runner] calibration report: " \
              f"{folder / 'report.md'}\n[runner] calibration: {torchrec}"
    return reporter.calibrated(CalibrationReport(folder, metrics, tags, console, results))
