"""A calibration's results: the fit of every rank's measurements (:mod:`.cost_fit`), the file (:mod:`.calibration`),
kept for ``cluster.calibration=auto`` when its repeats agree, and its report beside TorchRec's default constants
(``calibration/report.md``, a chart of measured against fitted times, metrics and tags for the MLflow run)."""

from __future__ import annotations

import datetime
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from runner.plan.cost.calibration import Calibration, cache_dir, file_name, save
from runner.plan.cost.cost_fit import HOST_LINK_MAX_GIBPS, fit_all, kernel_bytes
from runner.plan.cost.torchrec_export import export_beside
from runner.plan.cost.trust import FALLBACK, allowed_median_error, trust

if TYPE_CHECKING:
    from runner.config.schema import CalibrateSchema

FOLDER = "calibration"  # in the run folder, and the artifacts' path in the MLflow run
# TorchRec's default constants (torchrec/distributed/planner/constants.py), GiB/s and its multiplier
TORCHREC = {"ddr": 51.0, "hbm": 897.0, "bwd_compute_multiplier": 2.0, "intra": 600.0, "cross": 12.5}


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
            "dense": {int(r): {p: med(v) for p, v in m.items()} for r, m in measured["dense"].items()},
            "optimizer": {int(n): med(v) for n, v in measured["optimizer"].items()},
            "input": {int(r): med(v) for r, v in measured["input"].items()}, "dense_params": measured["params"],
            "step": {int(r): med(v) for r, v in (measured.get("step") or {}).items()}}


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
    lines += ["", f"Kernel fit: largest error forward {c['fit_error_fwd']:.1%}, backward {c['fit_error_bwd']:.1%}.",
              "", "Each part's trust: how well its repeats know their medians (the median's relative standard error, "
              f"1.2533 x spread / sqrt(repeats)), allowed {allowed:.1%} (what {repeats} repeats scattered by "
              f"calibrate.max_spread={max_spread:g} know); a scattered point takes more repeats, up to "
              "calibrate.max_repeats.", "", "| part | spread of the repeats | median known to | trusted | if not: "
              "the plan uses |", "|---|---|---|---|---|"]
    lines += [f"| {part} | {cal.spread.get(part, 0.0):.1%} | {cal.median_error.get(part, 0.0):.1%} | "
              f"{'yes' if cal.trusted.get(part) else '**no**'} | {FALLBACK[part]} |" for part in FALLBACK]
    return "\n".join(lines) + "\n"


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
    gone = [f"{p} (its medians known to {cal.median_error.get(p, 0.0):.0%}"
            + (f", allowed {allowed_median_error(settings.max_spread, settings.repeats):.0%}"
               if cal.median_error.get(p, 0.0) > allowed_median_error(settings.max_spread, settings.repeats)
               else ", no bandwidth to read off") + f": {FALLBACK[p]})" for p, yes in cal.trusted.items() if not yes]
    words = f"trusted: {', '.join(ok) or 'no part'}" + (f"; not trusted: {'; '.join(gone)}" if gone else "")
    if kept:
        return words + f"; the next plan here (cluster.calibration=auto) uses it ({kept.name})"
    if not ok:
        return words + ": not kept for cluster.calibration=auto (a busy machine?), measure again when it is quieter"
    return words + "; not kept (calibrate.keep=false): pass it by path as cluster.calibration"


def calibrate_results(settings: CalibrateSchema, calibration_dir: Optional[str], run_dir: Path,
                      measured: Dict[str, Any], fingerprint: Dict[str, Any], seconds: float, reporter: Any
                      ) -> Dict[str, Any]:
    """Fit, write (and keep in ``cluster.calibration_dir``, ``calibration_dir``, when trusted and ``calibrate.keep``),
    report and log; the job's results. ``settings``: the ``calibrate`` keys."""
    constants, spreads, errors = fit_all(measured)
    parts = trust(errors, constants, allowed_median_error(settings.max_spread, settings.repeats))
    cal = Calibration(fingerprint, constants, spreads, parts, _summary(measured),
                      datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), errors)
    trusted = any(parts.values())  # kept when a part can be used: the others fall back alone
    folder = run_dir / FOLDER
    where = save(cal, folder / "calibration.yaml")
    kept = save(cal, cache_dir(calibration_dir) / file_name(fingerprint)) if trusted and settings.keep else None
    (folder / "report.md").write_text(_markdown(cal, where, kept, settings.max_spread, settings.repeats))
    _chart(cal, folder / "calibration.png")
    torchrec = export_beside(cal, where)  # TorchRec's own terms, logged with the files above
    c = constants
    metrics = {f"calibration/{k}": float(c[k]) for k in ("device_bw_gibps", "bwd_compute_multiplier",
                                                         "kernel_call_fwd_ms", "kernel_call_bwd_ms")}
    metrics.update({f"calibration/{k}_gibps": float(c[k]) for k in ("intra_node_bandwidth", "cross_node_bandwidth")
                    if c.get(k) is not None})
    metrics.update({f"calibration/spread/{k}": v for k, v in spreads.items()})
    metrics.update({f"calibration/median_error/{k}": v for k, v in errors.items()})
    metrics.update({f"calibration/trusted/{k}": float(v) for k, v in parts.items()})
    metrics["calibration/seconds"] = seconds
    a2a = next(iter(c["collectives"].get("all_to_all", {}).values()), None)  # within a node, else across
    head = (f"device {c['device_bw_gibps']:.2f} GiB/s (TorchRec's default "
            f"{TORCHREC['hbm' if fingerprint['device_kind'] == 'cuda' else 'ddr']:g}), backward x"
            f"{c['bwd_compute_multiplier']:.2f} (2), kernel call {c['kernel_call_fwd_ms']:.3f} + "
            f"{c['kernel_call_bwd_ms']:.3f} ms, "
            + (f"all-to-all {a2a['bandwidth_gibps']:.2f} GiB/s + {a2a['latency_ms']:.3f} ms"
               if a2a and a2a["bandwidth_gibps"] else "all-to-all: no bandwidth (its time did not grow with the bytes)"
               if a2a else "no collectives (1 rank)"))
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
