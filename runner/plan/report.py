"""The plan report every run writes into ``<run_folder>/plan/``: JSON, table, estimates, comms, chart.

A plan's summary, read before its per-rank table: the estimated step and what bounds it (the critical rank and
its compute, forward and backward all-to-alls), min / median / max of memory and of each time column, and the
busiest ranks and nodes. The same figures become MLflow metrics (``plan/summary/...``), so a sweep's points can
be charted against each other in MLflow's compare view.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from runner.config.reservations import canonical
from runner.plan.analysis import COLLECTIVES, ESTIMATES, comms_per_rank, per_rank_estimates, plan_metrics
from runner.plan.cost.calibration import NONE
from runner.plan.cost.step_estimate import step_markdown, step_metrics, step_phrase
from runner.plan.cost.topology import topology_knobs
from runner.plan.plan_file import plan_table, plan_to_dict, sharding_types_used
from runner.plan.spec import PlanFacts, PlanSpec
from runner.runtime import run_files

if TYPE_CHECKING:
    from torchrec.distributed.planner.types import ShardingOption
    from torchrec.distributed.types import ShardingPlan


PRINT_TABLES_UP_TO = 24  # longer plans are summarised on the console (the files have everything)
PER_RANK_METRICS_UP_TO = 64  # ranks whose every plan/rank<r>/... is logged; beyond, the busiest ones'
BUSIEST_LOGGED = 8


@dataclass
class PlanReport:
    """What a written plan report holds, for rank 0's reporter to print and log."""

    folder: Path
    plan: Dict[str, Dict[str, Any]]
    metrics: Dict[str, float]
    tags: Dict[str, Any]
    console: str

    def logged_metrics(self) -> Dict[str, float]:
        """The metrics the run logs: all of them up to :data:`PER_RANK_METRICS_UP_TO` ranks; beyond, the per-rank
        ``plan/rank<r>/...`` of the :data:`BUSIEST_LOGGED` ranks of largest estimated step only (at 1,024 ranks
        every rank's is 9,216 metrics, 1.7 s of store writes and a compare view no one reads; each rank's
        figures are in ``estimates.json``, their spread in ``plan/summary/...``)."""
        totals = {int(k.split("/")[1][4:]): v for k, v in self.metrics.items()
                  if k.startswith("plan/rank") and k.endswith("/total_ms")}
        if len(totals) <= PER_RANK_METRICS_UP_TO:
            return self.metrics
        kept = {f"plan/rank{r}/" for r in sorted(totals, key=lambda r: -totals[r])[:BUSIEST_LOGGED]}
        return {k: v for k, v in self.metrics.items()
                if not k.startswith("plan/rank") or k[:k.index("/", 5) + 1] in kept}


def reserve_text(spec: PlanSpec, reserved: Optional[List[int]], device_type: str) -> str:
    """``storage reserve fixed_absolute: 4.000 GiB of HBM kept free per rank`` (the policy's name, an old name's new
    one, and the bytes its reservation kept free, per rank where they differ); without a reservation (a pinned
    plan) the policy alone."""
    policy = canonical(spec.sharding.storage_reserve_policy)
    if not reserved:
        return f"storage reserve {policy}"
    memory = "host memory" if device_type == "cpu" else "HBM"
    amounts = sorted(set(reserved))
    each = (f"{amounts[0] / 2**30:.3f} GiB" if len(amounts) == 1
            else f"{amounts[0] / 2**30:.3f}-{amounts[-1] / 2**30:.3f} GiB")
    return f"storage reserve {policy}: {each} of {memory} kept free per rank"


def _markdown(spec: PlanSpec, plan: Dict[str, Dict[str, Any]], ranks: List[Dict[str, float]],
              comms: Dict[str, List[float]], types: Dict[str, int], world: int, local: int,
              device_type: str, bandwidths: Dict[str, float], reserve: str) -> str:
    lines = [
        f"# Sharding plan: {world} ranks ({world // local} nodes x {local}), {device_type}",
        "",
        f"intra-node {bandwidths['intra']:g} GiB/s, cross-node {bandwidths['cross']:g} GiB/s, {reserve} "
        f"(sharding.storage_reserve_percent {spec.sharding.storage_reserve_percent:g}), "
        f"proposer {spec.proposer}, planned for the {spec.pipeline} pipeline",
        "",
        *summary_markdown(ranks, local),
        "## Tables per sharding type and the collectives they use",
        "",
        "| sharding type | tables | collectives |",
        "|---|---|---|",
    ]
    lines += [f"| {t} | {n} | {COLLECTIVES.get(t, '')} |" for t, n in types.items()]
    lines += ["", "## Per-rank estimates (planner) and estimated traffic per step", "",
              "| rank | HBM GiB | DDR GiB | fwd compute ms | fwd comms ms | bwd compute ms | bwd comms ms "
              "| total ms | sent in node MiB | sent across nodes MiB |", "|---" * 10 + "|"]
    for r, e in enumerate(ranks):
        lines.append(
            f"| {r} | {e['hbm_bytes'] / 2**30:.3f} | {e['ddr_bytes'] / 2**30:.3f} | {e['fwd_compute_ms']:.3f} | "
            f"{e['fwd_comms_ms']:.3f} | {e['bwd_compute_ms']:.3f} | {e['bwd_comms_ms']:.3f} | "
            f"{e['total_ms']:.3f} | {comms['intra_node_bytes'][r] / 2**20:.2f} | "
            f"{comms['cross_node_bytes'][r] / 2**20:.2f} |")
    lines += ["", "## Tables", "", "```", plan_table(plan).rstrip(), "```", ""]
    return "\n".join(lines)


INDENTED_ENTRIES = 100_000  # a plan.json with more shards and ranks listed is written on one line (20,000 tables
# on 8,192 GPUs: 104 MB indented, a data-parallel table's 8,192 ranks a line each); plan.txt is its readable form


def bound_metrics(est_step_ms: Optional[float], facts: PlanFacts) -> Dict[str, float]:
    """``plan/lower_bound_ms`` (:mod:`.torchrec_adapter.balanced.bound`) and ``plan/gap_to_bound`` (estimated
    step / bound - 1), with the ratings of TorchRec's plans the balanced proposer compared (``facts`` from
    ``make_plan``)."""
    m: Dict[str, float] = dict(facts.get("compared") or {})
    bound = facts.get("lower_bound_ms")
    if bound:
        m["plan/lower_bound_ms"] = float(bound)
        if est_step_ms is not None:
            m["plan/gap_to_bound"] = est_step_ms / bound - 1
    return m


def bound_text(metrics: Dict[str, float], kind: Optional[str] = None) -> str:
    """``lower bound 11.416 ms (gap +0.98%)`` for the summary and report lines, with which bound is tight
    (``kind``: ``lower bound 250.081 ms from whole shards (gap +0.01%)``); empty without a bound."""
    if "plan/lower_bound_ms" not in metrics:
        return ""
    gap = metrics.get("plan/gap_to_bound")
    return (f"lower bound {metrics['plan/lower_bound_ms']:.3f} ms" + (f" from {kind}" if kind else "")
            + (f" (gap {gap:+.2%})" if gap is not None else ""))


def write_plan_report(spec: PlanSpec, plan: ShardingPlan, best_plan: List[ShardingOption], world: int, local: int,
                      device_type: str, out: Path, seconds: float, note: str = "",
                      facts: Optional[PlanFacts] = None) -> PlanReport:
    """Write ``plan.json``, ``plan.txt``, ``estimates.json`` and ``report.md`` into ``out`` (``plan.png`` is drawn
    from them by :class:`runner.launch.job.end.PlanChart`, off the ranks' path);
    ``note``: how the plan was found, when not by TorchRec's proposer alone (tag ``runner.plan_note``);
    ``facts``: what ``make_plan`` found beside the plan (its lower bound, TorchRec's ratings compared)."""
    out.mkdir(parents=True, exist_ok=True)
    facts = facts or {}
    specs = spec.tables
    plan_dict = plan_to_dict(plan, specs)
    types = sharding_types_used(plan_dict)
    ranks = per_rank_estimates(best_plan, world)
    pooling = {t.name: spec.pooling for t in specs}
    pooling.update({n: c.pooling_factor for n, c in spec.sharding.constraints.items() if c.get("pooling_factor")})
    comms = comms_per_rank(plan_dict, world, local, spec.batch, pooling)
    metrics = {"plan/seconds": seconds, "plan/pinned": float(bool(spec.sharding.plan)),
               **plan_metrics(ranks, comms, types, device_type), **summary_metrics(ranks, local)}
    metrics.update(bound_metrics(metrics.get("plan/est_step_ms"), facts))
    step = facts.get("step")
    if step:
        metrics.update(step_metrics(step))
    bandwidths = facts.get("bandwidths") or topology_knobs(None, device_type, spec.cluster.intra_node_bandwidth,
                                                           spec.cluster.cross_node_bandwidth)[1]
    metrics.update({f"plan/{k}_node_bandwidth_gibps": v for k, v in bandwidths.items()})
    reserved = facts.get("reserved_bytes")
    if reserved:  # the same on every rank with TorchRec's reservations: the largest, should one differ
        metrics["plan/reserved_bytes_per_rank"] = float(max(reserved))
    reserve = reserve_text(spec, reserved, device_type)
    bound = bound_text(metrics, facts.get("lower_bound_kind"))
    entries = sum(len(t["shards"]) + len(t["ranks"] or ()) for tables in plan_dict.values() for t in tables.values())
    (out / "plan.json").write_text(json.dumps(plan_dict, indent=2 if entries <= INDENTED_ENTRIES else None))
    table = plan_table(plan_dict)
    (out / "plan.txt").write_text(table)
    constants = facts.get("calibration")
    title = (f"{world} ranks, {spec.cluster.name}, sharding={spec.sharding.name}: "
             + ", ".join(f"{n} {t}" for t, n in types.items())
             + ("" if constants is None else "; TorchRec's default constants" if constants == NONE
                else f"; calibrated ({Path(constants).name})"))
    run_files.write_json(out / ESTIMATES, {"device": device_type, "per_rank": ranks, "comms_bytes_per_step": comms,
                                        "title": title, "estimated": bool(best_plan),
                                        "local_world_size": local, "step": step,
                                        "calibration": facts.get("calibration"),  # whole: the driver reads it
                                        "reserved_bytes_per_rank": metrics.get("plan/reserved_bytes_per_rank")})
    (out / "report.md").write_text(_markdown(spec, plan_dict, ranks, comms, types, world, local, device_type,
                                             bandwidths, reserve)
                                   + (f"\nEstimated step {metrics['plan/est_step_ms']:.3f} ms; {bound}.\n"
                                      if bound else "")
                                   + (step_markdown(facts) if best_plan else "")
                                   + (f"\nNote: {note}.\n" if note else ""))
    counts = ", ".join(f"{n} {t}" for t, n in types.items())
    head = f"[runner] sharding plan: {counts} over {world} ranks (planned in {seconds:.2f}s)"
    if "plan/est_step_ms" in metrics:
        head += (f"; {step_phrase(facts, metrics['plan/est_step_ms'])}, "
                 f"max memory {metrics['plan/max_mem_bytes'] / 2**30:.3f} GiB per rank"
                 + (f", {bound}" if bound else ""))
    head += f"; {reserve}; planned for the {spec.pipeline} pipeline"
    if note:
        head += f"\n[runner] note: {note}"
    console = head + ("\n" + table if len(specs) <= PRINT_TABLES_UP_TO else f"\n(tables: {out / 'plan.txt'})")
    tags = {"runner.world_size": world, "runner.local_world_size": local, "runner.nodes": world // local,
            "runner.device": device_type, "runner.sharding_types": ",".join(types), "runner.plan_status": "feasible",
            "runner.plan_source": facts.get("plan_source") or ("torchrec" if spec.sharding.plan is None else "pinned"),
            "runner.storage_reserve_policy": canonical(spec.sharding.storage_reserve_policy),
            "runner.planned_pipeline": spec.pipeline,
            **{f"runner.{tag}": str(value) for tag, key in (
                ("planner", "planner"), ("plan_fallback", "fallback"), ("lower_bound", "lower_bound_kind"),
                ("plan_cut_short", "cut_short"), ("calibration", "calibration")) if (value := facts.get(key))},
            **({"runner.plan_note": note} if note else {})}
    return PlanReport(out, plan_dict, metrics, tags, console)


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
