"""The step a user will see, estimated: TorchRec's embedding estimate (with the calibration's constants) plus the
parts TorchRec does not model, from a calibration (:mod:`runner.plan.cost.calibration`).

Per rank, in ms: ``embeddings`` (TorchRec's perf of the rank's shards: lookups forward and backward and their
all-to-alls, plus the ids' all-to-all that its total leaves out), ``row_reuse`` (0 or less: TorchRec charges a
fused table's backward per id, where the fused optimizer updates each row a step's ids reach once; a table with
fewer rows than its step's ids, or near it, saves the calibration's ``bwd_row_share`` of its backward for every id
that repeats a row: :func:`runner.plan.cost.row_reuse.row_reuse_ms`), ``table_size`` (TorchRec charges a lookup's
bytes at one bandwidth; the fused kernel's rows are in the caches or not by the bytes of the tables its rank holds:
its compute times the calibration's multiple at those bytes, less itself, :mod:`runner.plan.cost.table_size`),
``sharded_lookups`` (what a sharded lookup costs
whatever its tables' size, forward and backward, by its family's fit: the kernel calls, the input and output
distributions' collectives and TorchRec's bookkeeping between; a sharded collection runs one lookup per sharding
type it holds, each with its own distributions, so a table column-wise beside table-wise ones pays a second; every
rank takes part in each lookup's collectives, holding a shard of it or not), ``dense_forward`` and
``dense_backward`` (the dense part at this batch, from the measured rate per dense FLOP), ``optimizer`` (the dense
optimizer over the dense parameters and the data-parallel tables), ``rank_wait`` (the step's compute, its dense part,
optimizer and the rank's embedding kernels, waits for the slowest rank at every collective, and the step is a mean
where each part was timed as its median: the calibration's lockstep factor less 1 times that compute,
:func:`runner.plan.cost.fit.rank_wait`), ``dense_allreduce`` (DDP's all-reduce of the dense
and data-parallel tables' gradients, in its buckets, by the all-reduce measured as DDP issues it) and ``input`` (a batch
from the data source: on CPU its prefetch thread shares the worker's cores, so it counts; on a GPU it overlaps the
step and is shown, not added) and ``step_overhead`` (what the job's step with tiny tables took beyond all of
those, measured alone: the loop, the pipeline, the model's wrappers). The step is the busiest rank's sum: ranks
wait for each other at every collective.

A data-parallel table is not TorchRec's kind of cost in the job: TorchRec rates its backward comms as an all-reduce of
the table apart plus the optimizer's element-wise kernels over it, while DDP all-reduces its gradient in the same
buckets as the dense part's and the dense optimizer updates it (:class:`Replicated`). Both the step and the rating
take TorchRec's term out and count the table in ``dense_allreduce`` and ``optimizer`` once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from torchrec.distributed.planner.types import PerfModel, ShardingOption

from runner.plan.cost.row_reuse import row_reuse_ms
from runner.plan.cost.table_size import table_size_ms

if TYPE_CHECKING:
    from torch import nn

    from runner.plan.cost.calibration import Calibration
    from runner.plan.spec import PlanFacts, PlanSpec

PARTS = ("embeddings", "row_reuse", "table_size", "sharded_lookups", "dense_forward", "dense_backward", "optimizer",
         "rank_wait", "dense_allreduce", "input", "step_overhead")
# the family of sharded lookup whose fit each sharding type's lookup pays (its distribution's shape)
FAMILY = {"table_wise": "table_wise", "column_wise": "table_wise", "table_column_wise": "table_wise",
          "row_wise": "row_wise", "table_row_wise": "row_wise", "grid_shard": "row_wise",
          "data_parallel": "data_parallel"}
GIB = 1024**3


@dataclass(frozen=True)
class DenseFacts:
    """What the dense part's cost is computed from: its parameters (count and bytes), the per-rank batch, its linear
    layers (in, out) and its parameters outside them (cross layers, gates, ...)."""

    params: int
    bytes: int
    batch: int
    layers: Tuple[Tuple[int, int], ...] = ()
    other_params: int = 0

    @property
    def gflops(self) -> float:
        """Forward GFLOPs per step: each dense weight is one multiply-add per sample."""
        return 2.0 * self.params * self.batch / 1e9


@dataclass(frozen=True)
class Replicated:
    """A plan's data-parallel tables: their parameters and bytes (every rank holds them whole; DDP all-reduces their
    gradients with the dense part's, the dense optimizer updates them), and per rank TorchRec's backward comms of
    them (its own all-reduce and optimizer kernels), which the step takes out of TorchRec's total."""

    params: int = 0
    bytes: int = 0
    torchrec_bwd_comms_ms: Tuple[float, ...] = ()

    def dropped(self, rank: int) -> float:
        return self.torchrec_bwd_comms_ms[rank] if rank < len(self.torchrec_bwd_comms_ms) else 0.0


def replicated(best_plan: List[ShardingOption], world: int) -> Replicated:
    """:class:`Replicated` of ``best_plan`` over ``world`` ranks."""
    params = size = 0
    comms = [0.0] * world
    for option in best_plan:
        if option.sharding_type != "data_parallel" or not option.shards:
            continue
        n = int(option.shards[0].size[0]) * int(option.shards[0].size[1])
        params += n
        size += n * (option.tensor.element_size() if option.tensor is not None else 4)
        for shard in option.shards:
            if shard.rank is not None and shard.rank < world and shard.perf is not None:
                comms[shard.rank] += float(shard.perf.bwd_comms)
    return Replicated(params, size, tuple(comms))


def allreduce_ms(reduce: Dict[str, float], size: int) -> float:
    """DDP's all-reduce of ``size`` bytes of gradients by the all-reduce's fit, which was measured as DDP issues it
    (in its buckets, all in flight: :func:`runner.train.calibrate.ddp_buckets`)."""
    return reduce["latency_ms"] + size / (reduce["bandwidth_gibps"] * GIB / 1000.0) if size > 0 else 0.0


def dense_facts(model: nn.Module, batch: int) -> DenseFacts:
    """``model``'s dense parameters (everything but the embedding tables; sizes are known on meta too) and its
    linear layers."""
    from torch import nn

    params = [p for n, p in model.named_parameters() if "embedding_bag_collection" not in n]
    linear = [m for n, m in model.named_modules() if isinstance(m, nn.Linear) and "embedding_bag_collection" not in n]
    in_layers = sum(p.numel() for m in linear for p in m.parameters())
    total = sum(p.numel() for p in params)
    return DenseFacts(total, sum(p.numel() * p.element_size() for p in params), int(batch),
                      tuple((int(m.in_features), int(m.out_features)) for m in linear), max(total - in_layers, 0))


def dense_ms(c: Dict[str, Any], part: str, dense: DenseFacts) -> float:
    """The dense part's ``part`` (``fwd``/``bwd``) at ``dense.batch``, ms: each linear layer by the measured linear
    rate (a fixed cost per layer and ms per GFLOP), the other parameters at the same rate, and what the calibrated
    model took beyond its own layers (its interaction, loss, activations). Without the layer fit (a calibration of
    an earlier format): the calibrated model's rate per GFLOP."""
    layer = c.get(f"linear_{part}")
    if not layer:
        return fitted_ms(c.get(f"dense_{part}"), dense.gflops)
    flops = [2.0 * i * o * dense.batch / 1e9 for i, o in dense.layers]
    other = 2.0 * dense.other_params * dense.batch / 1e9
    return (sum(layer["fixed_ms"] + layer["ms_per_unit"] * f for f in flops) + layer["ms_per_unit"] * other
            + max(fitted_ms(c.get(f"dense_rest_{part}"), dense.batch / 1000.0), 0.0))


def input_dist_ms(best_plan: List[ShardingOption], world: int, with_total: bool = False, waiting: float = 0.0
                  ) -> List[float]:
    """Each rank's ids all-to-all, as TorchRec estimates it (``Perf.input_dist_comms``; not in its total);
    ``with_total``: added shard by shard to TorchRec's total; ``waiting``: and this share of its kernels' compute
    (``fwd_compute`` + ``bwd_compute``: their wait for the slowest rank, :func:`wait_factor`), in the same pass."""
    out = [0.0] * world
    for option in best_plan:
        for shard in option.shards:
            if shard.rank is not None and shard.perf is not None:
                perf = shard.perf
                out[shard.rank] += ((perf.total if with_total else 0.0)
                                    + float(getattr(perf, "input_dist_comms", 0.0) or 0.0)
                                    + (waiting * (float(perf.fwd_compute) + float(perf.bwd_compute)) if waiting
                                       else 0.0))
    return out


def ddp_allreduce(c: Dict[str, Any], world: int, local: int) -> Dict[str, float]:
    """DDP's all-reduce over all ``world`` ranks: as a calibration measured it over every worker (``world``, with
    several nodes of several workers), else from the all-reduce it measured in one scope's groups
    (within a node: ``local`` ranks; across nodes: one rank of each node): a ring's latency grows with its ``p - 1``
    steps and each rank's bytes with ``(p - 1) / p`` of twice the message, so the measured latency and bandwidth are
    scaled from the measured group's size to the world's (x3 and /1.5 on 2 nodes of 2: what TorchRec's
    ``(2 nodes - 1) / nodes`` factor counts for the bytes). Where the calibration has no all-reduce (its
    collectives fell back, or a time that did not grow with the bytes): TorchRec's bandwidth for the scope and no
    latency, as TorchRec's model."""
    from runner.plan.cost.topology import TORCHREC_CROSS_GIBPS, TORCHREC_INTRA_GIBPS

    found = c.get("collectives", {}).get("all_reduce", {})
    if world > local > 1 and (found.get("world") or {}).get("bandwidth_gibps") is not None:
        return found["world"]  # measured over every worker (:data:`runner.train.calibrate.WORLD_SCOPE`)
    cross = world > local and "cross" in found
    fit = found.get("cross" if cross else "intra") or {}
    if fit.get("bandwidth_gibps") is None:
        return {"latency_ms": 0.0, "bandwidth_gibps": TORCHREC_CROSS_GIBPS if world > local else TORCHREC_INTRA_GIBPS}
    group = world // max(local, 1) if cross else local
    if group <= 1 or group >= world:
        return fit
    return {"latency_ms": fit["latency_ms"] * (world - 1) / (group - 1),
            "bandwidth_gibps": fit["bandwidth_gibps"] * ((group - 1) / group) / ((world - 1) / world)}


def family_overhead_ms(c: Dict[str, Any], lookups: List[Tuple[str, int]]) -> float:
    """What a step takes beyond its parts for the families of sharded lookup it runs (``step_overhead``'s
    ``family_ms``: each family's tiny-table job beyond the cheapest family's, paid once per family the plan uses;
    0 with a calibration that did not time them)."""
    family = (c.get("step_overhead") or {}).get("family_ms") or {}
    return sum(family.get(kind, 0.0) for kind in {FAMILY.get(k, "table_wise") for k, _ in lookups})


def compute_ms(parts: Dict[str, float], torchrec: Dict[str, float]) -> float:
    """A rank's compute, which waits for the slowest rank (``rank_wait``): its dense part and optimizer (``parts``,
    as the whole step gives them) and its embedding kernels (``torchrec``, TorchRec's per-rank estimate:
    ``fwd_compute_ms`` + ``bwd_compute_ms``, with ``parts``' ``row_reuse`` and ``table_size``)."""
    return (sum(float(parts.get(k, 0.0)) for k in ("dense_forward", "dense_backward", "optimizer", "row_reuse",
                                                   "table_size"))
            + float(torchrec.get("fwd_compute_ms", 0.0)) + float(torchrec.get("bwd_compute_ms", 0.0)))


def wait_factor(c: Dict[str, Any]) -> float:
    """A calibration's :func:`runner.plan.cost.fit.rank_wait` factor (1 where it has none: an earlier format, or a
    dense part that fell back)."""
    return float((c.get("rank_wait") or {}).get("factor", 1.0))


def fitted_ms(fit: Optional[Dict[str, float]], size: float) -> float:
    return 0.0 if not fit else fit["fixed_ms"] + fit["ms_per_unit"] * size


def optimizer_ms(c: Dict[str, Any], mparams: float) -> float:
    """The dense optimizer's step over ``mparams`` million parameters (the dense part's and the data-parallel
    tables'), ms: between two sizes the calibration timed (``optimizer.measured_ms``, by parameter count), on the
    line through them; past the largest (or below the smallest), on the nearest two's line, never below 0. One line
    through every size put 16.8 M parameters a fifth to a quarter under their measured time on 2 and 4 CPU ranks
    (its largest error 18% and 45%): past the caches each parameter costs more than the small sizes show, and a
    data-parallel table's parameters are the large ones. A calibration that kept no sizes: its line
    (:func:`fitted_ms`)."""
    fit = c.get("optimizer") or {}
    timed = sorted((int(n) / 1e6, float(ms)) for n, ms in (fit.get("measured_ms") or {}).items())
    if len(timed) < 2:
        return fitted_ms(fit or None, mparams)
    segments = list(zip(timed, timed[1:], strict=False))
    (x0, y0), (x1, y1) = next((pair for pair in segments if mparams <= pair[1][0]), segments[-1])
    return max(y0 + (y1 - y0) / (x1 - x0) * (mparams - x0), 0.0)  # sizes are distinct counts: x1 > x0


def optimizer_added_ms(c: Dict[str, Any], base_mparams: float, added_mparams: float) -> float:
    """What ``added_mparams`` million parameters (data-parallel tables) add to the dense optimizer's step over
    ``base_mparams`` (:func:`optimizer_ms`), ms."""
    if added_mparams <= 0:
        return 0.0
    return max(optimizer_ms(c, base_mparams + added_mparams) - optimizer_ms(c, base_mparams), 0.0)


def whole_step(ranks: List[Dict[str, float]], lookups: List[Tuple[str, int]], ids_ms: List[float],
               cal: Calibration, dense: DenseFacts, world: int, local: int, device_kind: str,
               tables: Replicated = Replicated(), measured: Optional[Dict[str, float]] = None,
               reused: Sequence[float] = (), sized: Sequence[Tuple[float, float]] = ()) -> Dict[str, Any]:
    """The estimated step per rank and its parts (see the module doc), and the busiest rank's. ``tables``: the
    data-parallel tables (:class:`Replicated`); ``reused``: each rank's ``row_reuse`` (:func:`.row_reuse.row_reuse_ms`);
    ``sized``: each rank's ``table_size``, forward and backward (:func:`.table_size.table_size_ms`);
    ``measured``: the job's own dense part timed on its workers at its
    batch (``fwd_ms``, ``bwd_ms``, ``optimizer_ms``, :func:`runner.train.calibrate.dense_samples`), used instead of
    the fit where given: what a model's layers take is not the square layers' rate per FLOP (wide inputs, cross
    layers, interactions)."""
    from runner.plan.cost.speed import speed_now
    from runner.plan.cost.trust import fell_back_why

    c = cal.constants
    reduce = ddp_allreduce(c, world, local)
    families = family_overhead_ms(c, lookups)
    shared = {
        "dense_forward": measured["fwd_ms"] if measured else dense_ms(c, "fwd", dense),
        "dense_backward": measured["bwd_ms"] if measured else dense_ms(c, "bwd", dense),
        "optimizer": (measured["optimizer_ms"] + optimizer_added_ms(c, dense.params / 1e6, tables.params / 1e6)
                      if measured else optimizer_ms(c, (dense.params + tables.params) / 1e6)),
        "dense_allreduce": allreduce_ms(reduce, dense.bytes + tables.bytes) if world > 1 else 0.0,
        "input": fitted_ms(c.get("input"), dense.batch / 1000.0) if device_kind == "cpu" else 0.0,
        "step_overhead": (fitted_ms(c.get("step_overhead"), dense.batch / 1000.0)  # per table: learned from runs
                          + (c.get("step_overhead") or {}).get("per_table_ms", 0.0) * sum(n for _, n in lookups)
                          + families),
    }
    fixed = lookups_ms(c, lookups, dense.batch)
    wait = wait_factor(c) - 1.0
    per_rank = []
    for r, est in enumerate(ranks):
        parts = {"embeddings": est["total_ms"] + ids_ms[r] - tables.dropped(r),
                 "row_reuse": reused[r] if r < len(reused) else 0.0,
                 "table_size": sum(sized[r]) if r < len(sized) else 0.0,
                 "sharded_lookups": fixed["fwd"] + fixed["bwd"], **shared}
        parts["rank_wait"] = wait * compute_ms(parts, est)
        forward = ((est["fwd_compute_ms"] + (sized[r][0] if r < len(sized) else 0.0)) * (1.0 + wait)
                   + est["fwd_comms_ms"] + ids_ms[r] + fixed["fwd"])
        per_rank.append({**parts, "step_ms": sum(parts.values()), "embedding_fwd_ms": forward,
                         "family_overhead_ms": families})
    busiest = max(range(len(per_rank)), key=lambda r: per_rank[r]["step_ms"]) if per_rank else 0
    return {"per_rank": per_rank, "step_ms": per_rank[busiest]["step_ms"] if per_rank else 0.0,
            "critical_rank": busiest, "parts": {p: per_rank[busiest][p] for p in PARTS} if per_rank else {},
            "input_ms": fitted_ms(c.get("input"), dense.batch / 1000.0), "fell_back": fell_back_why(cal),
            "dense_measured": bool(measured), "speed_now": speed_now(c, measured),
            "calibrated_at": (cal.learned or {}).get("measured_at") or cal.made}


def step_metrics(step: Dict[str, Any]) -> Dict[str, float]:
    """The whole step as MLflow metrics: ``plan/est_whole_step_ms``, its parts on the busiest rank
    (``plan/step/<part>_ms``), and each rank's (``plan/rank<r>/whole_step_ms``, ``.../est_embedding_fwd_ms``)."""
    m = {"plan/est_whole_step_ms": step["step_ms"], "plan/step/critical_rank": float(step["critical_rank"])}
    m.update({f"plan/step/{p}_ms": v for p, v in step["parts"].items()})
    m.update({f"plan/speed_now/{k}": v for k, v in (step.get("speed_now") or {}).items()})
    for r, x in enumerate(step["per_rank"]):
        m[f"plan/rank{r}/whole_step_ms"] = x["step_ms"]
        m[f"plan/rank{r}/est_embedding_fwd_ms"] = x["embedding_fwd_ms"]
    return m


def step_text(step: Dict[str, Any]) -> str:
    """``12.345 ms (embeddings 1.2, kernel calls 0.3, ...)`` for the report, the plan line and the summary."""
    from runner.plan.cost.speed import speed_words
    from runner.plan.cost.trust import FALLBACK

    parts = ", ".join(f"{p.replace('_', ' ')} {v:.3f}" for p, v in step["parts"].items() if v)
    fell = "".join(f"; {part}: {FALLBACK[part]} ({why})" for part, why in (step.get("fell_back") or {}).items())
    how = "; the dense part measured on this job's model" if step.get("dense_measured") else ""
    return f"{step['step_ms']:.3f} ms ({parts}; rank {step['critical_rank']}{how}{fell}{speed_words(step)})"


def step_phrase(facts: PlanFacts, embeddings_ms: float) -> str:
    """What the estimated step covers, for the plan line and the summary: the whole step and its parts with a
    calibration; else the embeddings' estimate, said to be only that."""
    step = facts.get("step")
    if step:
        return f"estimated step {step_text(step)}, embeddings rated {embeddings_ms:.3f} ms"
    why = facts.get("calibration_note") or "TorchRec's default constants"
    return f"estimated step {embeddings_ms:.3f} ms (the embeddings only; {why})"


def step_markdown(facts: PlanFacts) -> str:
    """The report's section on what the estimate covers and which constants it was made with."""
    lines = ["", "## The step", "", f"Cost model: {facts.get('calibration_note') or 'TorchRec’s default constants'}."]
    step = facts.get("step")
    if not step:
        return "\n".join(lines + ["", "Only the embeddings are estimated (TorchRec's model: lookups and their "
                                      "collectives); the dense part, the optimizer and the input are not, so the "
                                      "measured step is longer. A calibration (`python -m runner mode=calibrate`) "
                                      "estimates the whole step."]) + "\n"
    lines += ["", f"Estimated step {step_text(step)}.", "", "| part | ms (rank " f"{step['critical_rank']}) |",
              "|---|---|"]
    lines += [f"| {p.replace('_', ' ')} | {v:.4f} |" for p, v in step["parts"].items()]
    if step.get("input_ms") and not step["parts"].get("input"):
        lines.append(f"| input (prefetched, overlaps the step: not added) | {step['input_ms']:.4f} |")
    return "\n".join(lines) + "\n"


def sharded_lookups(best_plan: List[ShardingOption]) -> List[Tuple[str, int]]:
    """A plan's sharded lookups: one per sharded collection and sharding type it holds (TorchRec's sharded
    collection runs a lookup with its own input and output distributions per sharding type), each its sharding type
    and how many tables it holds, in a fixed order."""
    count = Counter((option.path, option.sharding_type) for option in best_plan)
    return [(kind, n) for (_, kind), n in sorted(count.items())]


def lookups_ms(c: Dict[str, Any], lookups: List[Tuple[str, int]], batch: int) -> Dict[str, float]:
    """What a plan's sharded lookups (:func:`sharded_lookups`) cost beyond TorchRec's estimate by a calibration's
    constants ``c``, forward and backward (ms): each lookup its family's fixed cost, per table and per sample."""
    def cost(fit: Optional[Dict[str, float]], tables: int) -> float:
        if not fit:
            return 0.0
        return (fit["fixed_ms"] + fit.get("per_table_ms", 0.0) * tables
                + fit.get("ms_per_table_ksample", 0.0) * tables * batch / 1000.0)
    sharded = c.get("sharded", {})
    return {p: sum(cost(sharded.get(FAMILY.get(kind, "table_wise"), {}).get(p), n) for kind, n in lookups)
            for p in ("fwd", "bwd")}


class StepPerfModel(PerfModel):
    """TorchRec's perf-model interface rating a plan by the part of the whole step that depends on the plan: the
    busiest rank's embeddings (TorchRec's perf with the calibration's constants, and the ids' all-to-all, less
    its backward's :func:`.row_reuse.row_reuse_ms`, with its kernels' :func:`.table_size.table_size_ms`; their wait
    for the slowest rank, :func:`wait_factor`) plus the fixed cost of each sharded lookup the plan runs
    (:func:`sharded_lookups`), and its data-parallel tables' all-reduce and update (:class:`Replicated`). The dense
    part, its optimizer and the input are the same for every plan of a job, so plans rank as their whole steps do.
    Both TorchRec's planner and the runner's take it (``performance_model``); without a calibration they keep
    TorchRec's ``NoopPerfModel``."""

    def __init__(self, cal: Calibration, world: int, local: int, batch: int) -> None:
        self.cal, self.world, self.local, self.batch = cal, world, local, batch

    def rate(self, plan: List[ShardingOption]) -> float:
        c = self.cal.constants
        wait = wait_factor(c) - 1.0  # the kernels' compute waits for the slowest rank, as in the whole step
        tables = replicated(plan, self.world)
        reused = row_reuse_ms(c, plan, self.world)  # it is compute: it waits as the kernels do
        sized = table_size_ms(c, plan, self.world, reused)
        busiest = [ms - tables.dropped(r) + (1.0 + wait) * (reused[r] + sum(sized[r]))
                   for r, ms in enumerate(input_dist_ms(plan, self.world, with_total=True, waiting=wait))]
        fixed = lookups_ms(c, sharded_lookups(plan), self.batch)
        updated = (1.0 + wait) * optimizer_added_ms(c, 0.0, tables.params / 1e6)
        reduce = ddp_allreduce(c, self.world, self.local)  # the tables' bytes join DDP's call
        reduced = tables.bytes / (reduce["bandwidth_gibps"] * GIB / 1000.0)
        return (max(busiest) + fixed["fwd"] + fixed["bwd"] + updated + (reduced if self.world > 1 else 0.0)
                + family_overhead_ms(c, sharded_lookups(plan)))


def step_perf_model(spec: PlanSpec, device_type: str, world: int, local: int) -> Optional[StepPerfModel]:
    """The perf model a planner of ``spec`` rates plans with: :class:`StepPerfModel` with a calibration, else None
    (TorchRec's own). The balanced search balances TorchRec's per-rank estimate itself (its bound and its
    comparisons with TorchRec's plans are in those terms): it keeps TorchRec's."""
    from runner.config.proposers import PROPOSERS
    from runner.plan.cost.choice import for_config

    cal = for_config(spec.cluster, spec.mode, device_type).calibration
    if cal is None or PROPOSERS[spec.proposer].own_planner:
        return None
    return StepPerfModel(cal, world, local, spec.rows)
