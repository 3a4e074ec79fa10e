"""The ranking study of ``make bench-estimates``: does the cost model order plans as the hardware does?

Each config of :data:`RANKING` is planned several ways (:data:`VARIANTS`: whole-model sharding types, the planner's
own answer with this machine's calibration and with TorchRec's constants, its other proposers), the distinct plans
kept. Every plan is rated here by both cost models as the planner rates a plan (``sharding.plan`` pinned:
:mod:`runner.plan.plan_file`), then trained ``--ranking-repeats`` times, each round in its own order
(:func:`round_order`), each with its plan pinned. Per config: whether the plan each model calls fastest is the
measured fastest; over all pairs of a config's plans, how often each model orders them as measured. Pairs whose
measured medians lie within their own spread (half the range of their repeats, added) cannot be ordered by the
measurement and are counted apart; "close" pairs are the ordered ones whose medians are within 25% of each other.

Every plan trained here is also a held-out config for the step estimate (other batches, other plans, two models
of generated tables that no term was developed on): the study prints the calibrated whole step's error over all of
them, the second set beside :data:`estimates.CONFIGS`, twice: the estimate each trained job showed (its plan line,
the dense part timed on its own model at its batch, as in the first set) and the plan's rating here, planned alone
(the dense part from the calibration's fit of another model at another batch; the same for every plan of a config,
so it does not change the ranking).
"""

from __future__ import annotations

import json
import statistics
import time
from itertools import combinations
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

GEN = "model=dnn_many model.generated_tables.max_rows=20000"
RANKING: List[Tuple[str, str]] = [  # (name, overrides): none of them is the calibration's own job
    ("dlrm b1024", "train.batch_size=1024"),
    ("dcn b1024", "model=dcn train.batch_size=1024"),
    ("deepfm b2048", "model=deepfm train.batch_size=2048"),
    ("mmoe b512", "model=mmoe train.batch_size=512"),
    ("dnn20 b512", f"{GEN} model.generated_tables.count=20 train.batch_size=512"),
    ("2node dlrm b512", "cluster=2node train.batch_size=512"),
    # many tables of graded sizes: many distinct plans close together (mixed plans, the proposers' answers)
    ("dnn40 b256", f"{GEN} model.generated_tables.count=40 train.batch_size=256"),
    ("dnn12 b1024", f"{GEN} model.generated_tables.count=12 train.batch_size=1024"),
]
CALIBRATED, TORCHREC = "calibrated", "TorchRec's constants"

def round_order(labels: List[str], r: int, rounds: int) -> List[str]:
    """The order round ``r`` of ``rounds`` trains ``labels`` in: rotated by ``r`` / ``rounds`` of them, so each plan is
    trained early, midway and late over the rounds and none twice in a row. Until 2026-11-30 each round reversed the
    last (forward, back, forward), so the first and last plans were each trained twice back to back at the turns,
    in one state of the machine. Each of the three many-table configs' measured fastest was then its last plan (the
    balanced proposer's), 3-8% ahead of plans of the same tables per rank (20 of 40 tables and 2,400 of 4,800
    output columns on each rank, 63-70 MiB): the order could not tell a plan from a moment."""
    n = max(len(labels), 1)
    shifts: List[int] = []
    for i in range(r + 1):  # each round's rotation; one further where the last round's last plan would start it
        k = (i * n // max(rounds, 1)) % n
        if shifts and n > 1 and k == (shifts[-1] - 1) % n:
            k = (k + 1) % n
        shifts.append(k)
    return labels[shifts[-1]:] + labels[:shifts[-1]]

VARIANTS: List[Tuple[str, str, str]] = [  # (label, overrides, the constants it plans with); {big} and {second}: the
    # config's two largest tables, {small} its smallest (mixed plans: one table's sharding changed, the planner
    # placing the rest)
    ("table-wise", "sharding=tablewise", CALIBRATED),
    ("row-wise", "sharding=rowwise", CALIBRATED),
    ("table-row-wise", "sharding=tablerowwise", CALIBRATED),
    ("planner", "sharding=auto", CALIBRATED),
    ("planner (TorchRec's constants)", "sharding=auto", TORCHREC),
    ("largest row-wise", "sharding=auto +sharding.constraints.{big}.sharding_types=[row_wise]", CALIBRATED),
    ("two largest row-wise", "sharding=auto +sharding.constraints.{big}.sharding_types=[row_wise] "
     "+sharding.constraints.{second}.sharding_types=[row_wise]", CALIBRATED),
    ("second largest row-wise", "sharding=auto +sharding.constraints.{second}.sharding_types=[row_wise]",
     CALIBRATED),
    # the smallest table data-parallel: a close alternative (the largest one data-parallel was a plan 1.1-2.8x
    # slower than every other, six easy pairs per config)
    ("smallest data-parallel", "sharding=auto +sharding.constraints.{small}.sharding_types=[data_parallel]",
     CALIBRATED),
    ("largest column-wise", "sharding=auto +sharding.constraints.{big}.sharding_types=[column_wise]", CALIBRATED),
    ("balanced", "sharding=auto sharding.proposer=balanced", CALIBRATED),
]
CLOSE = 0.25  # pairs whose measured medians are within this of each other


def plan_here(overrides: List[str], world: int, local: int, device: str
              ) -> Tuple[Dict[str, Any], Dict[str, Any], Any]:
    """``overrides`` composed as the runner composes them (not through the tests' conftest, which hides the GPUs
    from every process started after its import), planned here: the plan as JSON, the plan's facts (its whole step
    with a calibration) and its chosen options."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import runner.cli  # noqa: F401  (schema and resolvers)
    from runner.config.tables import table_specs
    from runner.config.validation import validate
    from runner.plan.plan_file import plan_to_dict
    from runner.plan.planner import make_plan
    from runner.plan.spec import plan_spec
    from runner.train.models import planning_model

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    validate(cfg)
    facts: Dict[str, Any] = {}
    plan, best, _, _ = make_plan(plan_spec(cfg), planning_model(cfg), world, local, device, facts=facts)
    return plan_to_dict(plan, table_specs(cfg.model)), facts, best


def rated(plan_file: Path, base: List[str], calibration: Path, world: int, local: int, device: str
          ) -> Dict[str, float]:
    """The pinned plan's estimated step by each cost model, as the planner rates a plan: with the calibration, the
    whole step (its dense part the same for every plan of a config); with TorchRec's constants, the busiest rank's
    embeddings (all TorchRec estimates)."""
    from runner.plan.analysis import per_rank_estimates

    pinned = [*base, f"sharding.plan={plan_file}"]
    _, facts, _ = plan_here([*pinned, f"cluster.calibration={calibration}"], world, local, device)
    _, _, best = plan_here([*pinned, "cluster.calibration=none"], world, local, device)
    return {CALIBRATED: facts["step"]["step_ms"], TORCHREC: max(r["total_ms"] for r in per_rank_estimates(best, world))}


def plans_of(overrides: str, calibration: Path, world: int, local: int, device: str, folder: Path
             ) -> Dict[str, Path]:
    """The distinct plans of a config's variants (the first label that found each), each written to ``folder``;
    a variant whose plan cannot be had (a sharding type the model refuses) is passed over, said."""
    from runner.config.errors import ConfigError, PlanError

    folder.mkdir(parents=True, exist_ok=True)
    found: Dict[str, Path] = {}
    seen: List[Dict[str, Any]] = []
    first, _, _ = plan_here([*overrides.split(), "cluster.calibration=none"], world, local, device)
    tables = sorted(((t["rows"] * t["dim"], name) for m in first.values() for name, t in m.items()), reverse=True)
    names = {"big": tables[0][1], "second": tables[min(1, len(tables) - 1)][1], "small": tables[-1][1]}
    for label, variant, constants in VARIANTS:
        if "tablerowwise" in variant and world == local:
            continue  # one node: table-row-wise is row-wise
        cal = f"cluster.calibration={calibration if constants == CALIBRATED else 'none'}"
        try:
            plan, _, _ = plan_here([*overrides.split(), *variant.format(**names).split(), cal], world, local, device)
        except (ConfigError, PlanError, ValueError) as exc:
            print(f"  {label}: no plan ({str(exc).splitlines()[0][:100]})", flush=True)
            continue
        if plan in seen:
            continue
        seen.append(plan)
        found[label] = folder / f"plan-{len(found)}.json"
        found[label].write_text(json.dumps(plan))
    return found


def spread(values: List[float]) -> float:
    return (max(values) - min(values)) / 2 if values else 0.0


def judge(plans: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """One config's verdicts: per cost model, whether its fastest plan is the measured fastest, and its pairs:
    ordered as measured, all and close ones; pairs the measurement cannot order counted apart."""
    names = list(plans)
    med = {n: statistics.median(plans[n]["measured"]) for n in names}
    out: Dict[str, Any] = {"unordered": 0, "pairs": 0, "close": 0}
    fastest = min(names, key=lambda n: med[n])
    for model in (CALIBRATED, TORCHREC):
        best = min(plans[n]["estimated"][model] for n in names)
        # the plans the model calls fastest: every plan it rates at its minimum (plans of one layout under two
        # sharding types' names, column-wise tables of one shard and table-wise ones, are rated alike)
        picks = [n for n in names if plans[n]["estimated"][model] <= best * (1 + 1e-9)]
        pick = fastest if fastest in picks else picks[0]
        # a pick the measurement cannot tell from the fastest (their medians within their spreads, as a pair that is
        # not counted) is counted apart: "tied", beside the strict verdict
        tied = med[pick] - med[fastest] <= spread(plans[pick]["measured"]) + spread(plans[fastest]["measured"])
        out[model] = {"fastest": pick == fastest, "tied": tied, "right": 0, "close_right": 0}
    for a, b in combinations(names, 2):
        gap = abs(med[a] - med[b])
        if gap <= spread(plans[a]["measured"]) + spread(plans[b]["measured"]):
            out["unordered"] += 1
            continue
        close = gap / min(med[a], med[b]) <= CLOSE
        out["pairs"] += 1
        out["close"] += close
        for model in (CALIBRATED, TORCHREC):
            right = (plans[a]["estimated"][model] - plans[b]["estimated"][model]) * (med[a] - med[b]) > 0
            out[model]["right"] += right
            out[model]["close_right"] += right and close
    return out


def study(calibrations: Dict[Tuple[int, int], Path], shape_of: Callable[[str], Tuple[int, int]],
          train: Callable[[List[str]], Tuple[float, Optional[float]]], device: str, folder: Path, repeats: int,
          only: Optional[List[int]] = None, most_plans: int = 0, budget_s: float = 0.0,
          extra: Sequence[str] = ()) -> Dict[str, Any]:
    """The whole study (see the module doc): ``train(overrides)`` trains one job and returns its measured step and the
    whole step its plan line showed (None: no calibrated estimate).
    ``most_plans`` (0: all) keeps a config's first distinct plans; ``budget_s`` (0: none) bounds the study's
    seconds where time is lent (a GPU's): every plan is trained at least twice, and a further round of a config
    starts only when the rounds so far say it ends within the budget, the configs left counted at two rounds.
    ``extra``: overrides every config is planned and trained with (on a GPU, its one-GPU shape)."""
    t0 = time.perf_counter()
    # every plan's calibrated whole step against its measured median, the second set: as its jobs showed it, and as
    # planned here alone
    errors: List[float] = []
    planned: List[float] = []
    totals: Dict[str, Any] = {"configs": 0, "pairs": 0, "close": 0, "unordered": 0, "errors": errors,
                              "planned_errors": planned,
                              **{m: dict.fromkeys(("fastest", "tied", "right", "close_right"), 0)
                                 for m in (CALIBRATED, TORCHREC)}}
    for i, (name, overrides) in enumerate(RANKING):
        if only and i + 1 not in only:
            continue
        overrides = " ".join([overrides, *extra])
        shape = shape_of(overrides)
        calibration = calibrations[shape]
        print(f"ranking {name}: planning", flush=True)
        files = plans_of(overrides, calibration, shape[0] * shape[1], shape[1], device, folder / f"config-{i + 1}")
        if most_plans:
            files = dict(list(files.items())[:most_plans])
        if len(files) < 2:
            print(f"ranking {name}: {len(files)} distinct plan, nothing to rank", flush=True)
            continue
        base = overrides.split()
        plans = {label: {"file": f, "estimated": rated(f, base, calibration, shape[0] * shape[1], shape[1], device),
                         "measured": [], "shown": []} for label, f in files.items()}
        left = sum(1 for j in range(i + 1, len(RANKING)) if not only or j + 1 in only)
        for r in range(repeats):
            t_round = time.perf_counter()
            for label in round_order(list(plans), r, repeats):
                step_ms, shown = train([*base, f"sharding.plan={plans[label]['file']}",
                                        f"cluster.calibration={calibration}"])
                plans[label]["measured"].append(step_ms)
                if shown is not None:
                    plans[label]["shown"].append(shown)
            per_round = time.perf_counter() - t_round
            if budget_s and r + 1 >= 2 and r + 1 < repeats and \
                    time.perf_counter() - t0 + per_round * (1 + 2 * left) > budget_s:
                print(f"ranking {name}: {r + 1} rounds (a round takes {per_round:.0f} s; --ranking-budget-s "
                      f"{budget_s:.0f})", flush=True)
                break
        verdict = judge(plans)
        errors += [statistics.median(p["shown"]) / statistics.median(p["measured"]) - 1 for p in plans.values()
                   if p["shown"]]
        planned += [p["estimated"][CALIBRATED] / statistics.median(p["measured"]) - 1 for p in plans.values()]
        for label, p in plans.items():
            shown = f"{statistics.median(p['shown']):8.2f}" if p["shown"] else "       -"
            print(f"  {label:<32} measured {statistics.median(p['measured']):8.2f} ms (+-{spread(p['measured']):.2f})"
                  f"  calibrated {p['estimated'][CALIBRATED]:8.2f} (its jobs showed {shown})  TorchRec "
                  f"{p['estimated'][TORCHREC]:7.3f}", flush=True)
        print(f"ranking {name}: fastest chosen: calibrated {verdict[CALIBRATED]['fastest']} (or tied "
              f"{verdict[CALIBRATED]['tied']}), TorchRec {verdict[TORCHREC]['fastest']} (or tied "
              f"{verdict[TORCHREC]['tied']}); pairs ordered right: calibrated {verdict[CALIBRATED]['right']}/"
              f"{verdict['pairs']}, TorchRec {verdict[TORCHREC]['right']}/{verdict['pairs']} (close "
              f"{verdict['close']}; within their spread, not counted: {verdict['unordered']})", flush=True)
        totals["configs"] += 1
        for key in ("pairs", "close", "unordered"):
            totals[key] += verdict[key]
        for m in (CALIBRATED, TORCHREC):
            for key in ("fastest", "tied", "right", "close_right"):
                totals[m][key] += verdict[m][key]
    n, pairs, close = totals["configs"], totals["pairs"], totals["close"]
    for m in (CALIBRATED, TORCHREC):
        t = totals[m]
        print(f"ranking, {m}: fastest chosen in {t['fastest']} of {n} configs ({t['tied']} of {n} counting a pick "
              f"the measurement cannot tell from the fastest); pairs ordered right {t['right']} of "
              f"{pairs} ({t['right'] / max(pairs, 1):.0%}); close pairs {t['close_right']} of {close} "
              f"({t['close_right'] / max(close, 1):.0%})", flush=True)
    for found, what in ((errors, "as each job showed it"), (planned, "as planned here alone, the dense part from the "
                                                                      "calibration's fit")):
        if found:
            print(f"ranking, the second held-out set ({len(found)} plans of {n} configs), calibrated whole step "
                  f"{what}: median |error| {statistics.median(map(abs, found)):.1%}, signed "
                  f"{statistics.median(found):+.1%}, low in {sum(e < 0 for e in found)} of {len(found)}, largest "
                  f"{max(map(abs, found)):.1%}", flush=True)
    print(f"ranking: {n} configs, {pairs} ordered pairs ({close} close), {totals['unordered']} within their spread; "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return totals
