"""``sharding.proposer=balanced``: the best plan the runner can find, by TorchRec's own yardstick.

TorchRec's options (each shard's storage and perf from its estimators) and the storage the reservation leaves
become a :class:`.problem.Problem` (:func:`problem_of`); :func:`search` runs :mod:`.moves` from several starts
and the plan with the lowest rating wins:

1. the runner's own start (:func:`.packing.construct`);
2. TorchRec's own plans for the same inputs, for each proposer in ``sharding.balanced_compare``
   (``dynamic_programming`` by default on GPU clusters: its plan, found as ``sharding.proposer=
   dynamic_programming`` finds it);
3. the plans of earlier points of this process (a sweep's points), where they are still valid here
   (:func:`remember`, :func:`pooled`).

The planner that runs it is :class:`.balanced_planner.BalancedPlanner`; what each start rated is kept in
:attr:`BalancedProposer.facts` for the report (:func:`balanced_note`, :func:`compared_metrics`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
from torchrec.distributed.planner.types import PartitionByType, ShardingOption, Topology

from runner.plan.torchrec_adapter.balanced.effort import Effort, search_text, ticker, ticking
from runner.plan.torchrec_adapter.balanced.exact import exact
from runner.plan.torchrec_adapter.balanced.moves import improve, perturb
from runner.plan.torchrec_adapter.balanced.packing import construct, packing_starts
from runner.plan.torchrec_adapter.balanced.problem import (
    DEVICE,
    HOST,
    HOST_UNIFORM,
    MULTI_HOST,
    UNIFORM,
    Choice,
    Problem,
    Solution,
    changed,
    rating,
    simple_bound,
    valid,
)
from runner.plan.torchrec_adapter.compact_enumeration import shard_arrays, shard_count

_KIND = {PartitionByType.UNIFORM.value: UNIFORM, PartitionByType.DEVICE.value: DEVICE,
         PartitionByType.HOST.value: HOST, PartitionByType.MULTI_HOST.value: MULTI_HOST}
POOL_SIZE = 32  # plans kept per problem shape for later points
ROUNDS = 200  # ruin-and-recreate rounds at most (the patience or the work ends them first at a thousand tables)
EXACT_TABLES, EXACT_NODES = 12, 20000  # problems this small are solved by branch and bound first
CONSTRUCT_TRIES = 50  # random construction orders tried where the runner's two starts fit nowhere
COMPARE_MAX_SHARDS = 100_000
"""Above this many shards in all tables' options (300 tables on 64 GPUs have about 42,000, 1,000 on 128 about
268,000), TorchRec's plans are not used as starts unless ``sharding.balanced_compare`` names them: TorchRec's
dynamic-programming proposer and partitioner work on one Python object per shard, and take most of a plan's
time and memory there (docs/planning.md, *Planning at every scale*)."""
_POOL: Dict[Tuple[Any, ...], List[Dict[str, Tuple[str, str, Tuple[int, ...]]]]] = {}


@dataclass
class BalancedProposer:
    """The settings of one balanced plan (``work``, ``patience``, ``gap``: when the search stops, :mod:`.effort`;
    ``timeout_s``: its safety stop; ``compare``: TorchRec's proposers whose plans are starts too) and, after it,
    what it found (:attr:`facts`)."""

    work: int
    compare: List[str]
    patience: int = 20000
    gap: float = 0.005
    timeout_s: Optional[float] = None
    auto: bool = False
    """``compare`` is the default (``sharding.balanced_compare=null``): skipped above :data:`COMPARE_MAX_SHARDS`."""
    sharding: Any = None
    """The job's ``sharding`` config (its compared proposers are built from it, as their declarations say)."""
    device_type: str = "cuda"
    facts: Dict[str, Any] = field(default_factory=dict)
    choose_from: Optional[Tuple[List[Dict[str, Any]], Dict[str, Any]]] = None
    """A sweep planned together (:mod:`runner.launch.sweep.plan_together`): its plans, of which the best valid here is
    taken instead of a search, and what this point compared when it was planned."""


def _kind(option: ShardingOption) -> Optional[int]:
    kind = _KIND.get(option.partition_by)
    if kind == HOST and option.sharding_type == "table_row_wise":
        return HOST_UNIFORM
    if option.compute_kernel == "key_value" and option.sharding_type == "column_wise":
        return None  # TorchRec's partitioner gives its shards distinct ranks: left to TorchRec's proposers
    return kind


_LAST_PROBLEM: List[Any] = []  # [search space, its numbers per table and options per table], the latest only


def forget_problem(search_space: List[ShardingOption]) -> None:  # (problem_of builds them again where asked)
    if _LAST_PROBLEM and _LAST_PROBLEM[0] is search_space:
        _LAST_PROBLEM.clear()


def capacity_of(reserved: Topology) -> np.ndarray:
    """Every device's storage left for tables (hbm, ddr, ssd bytes), as the problem holds it."""
    return np.array([(d.storage.hbm, d.storage.ddr, d.storage.ssd) for d in reserved.devices], dtype=np.int64)


def problem_of(search_space: List[ShardingOption], reserved: Topology, tick: Optional[Callable[[], None]] = None
               ) -> Tuple[Problem, List[List[ShardingOption]]]:
    """The search's numbers for TorchRec's options and reserved devices, and the options per table in the
    problem's order (tables in first-seen order, options as enumerated). The latest options' numbers are kept
    (the search, the bound, a sweep's next points on the same bandwidths ask again); storage is read each time
    (``tick``: called per table read, for progress)."""
    if not (_LAST_PROBLEM and _LAST_PROBLEM[0] is search_space):
        _LAST_PROBLEM[:] = [search_space, _tables_of(search_space, tick)]
    tables, table_options = _LAST_PROBLEM[1]
    return Problem(tables, capacity_of(reserved), reserved.local_world_size), table_options


def _tables_of(search_space: List[ShardingOption], tick: Optional[Callable[[], None]]
               ) -> Tuple[List[List[Choice]], List[List[ShardingOption]]]:
    by_table: Dict[str, List[ShardingOption]] = {}
    for option in search_space:
        if _kind(option) is not None:
            by_table.setdefault(option.fqn, []).append(option)
    tables = [[Choice(_kind(o), *shard_arrays(o)) for o in options]  # type: ignore[arg-type]
              for options in ticking(by_table.values(), tick)]
    return tables, list(by_table.values())


def _signature(option: ShardingOption) -> Tuple[str, str]:
    return option.sharding_type, option.compute_kernel


OptionIndex = List[Dict[Tuple[str, str, int], int]]  # per table: (sharding type, kernel, shards) -> its first option


def option_index(table_options: List[List[ShardingOption]]) -> OptionIndex:
    """Each table's first option of each sharding type, kernel and shard count (reversed: the first is kept)."""
    return [dict(reversed([((*_signature(opt), shard_count(opt)), o) for o, opt in enumerate(options)]))
            for options in table_options]


def solution_of(table_options: List[List[ShardingOption]], plan: Dict[str, Tuple[str, str, Tuple[int, ...]]],
                index: Optional[OptionIndex] = None) -> Optional[Solution]:
    """A plan given as table -> (sharding type, kernel, shard ranks) on this problem's options; None where one of
    its options is not among them (or has another shard count). ``index``: :func:`option_index`, for many plans."""
    picks, ranks = [], []
    for options, found in zip(table_options, index or option_index(table_options), strict=True):
        entry = plan.get(options[0].fqn)
        o = None if entry is None else found.get((entry[0], entry[1], len(entry[2])))
        if entry is None or o is None:
            return None
        picks.append(o)
        ranks.append(np.array(entry[2], dtype=np.int64))
    return Solution(picks, ranks)


PlanEntries = Dict[str, Tuple[str, str, Tuple[int, ...]]]  # table -> (sharding type, kernel, shard ranks)


def plan_of(table_options: List[List[ShardingOption]], solution: Solution) -> PlanEntries:
    return {options[0].fqn: (*_signature(options[o]), tuple(int(r) for r in ranks))
            for options, o, ranks in zip(table_options, solution.picks, solution.ranks, strict=True)}


def from_torchrec(table_options: List[List[ShardingOption]], chosen: List[ShardingOption],
                  ranks: List[List[int]]) -> Optional[Solution]:
    """TorchRec's plan (its chosen options and their shards' ranks) as a solution of this problem."""
    return solution_of(table_options, {o.fqn: (*_signature(o), tuple(r)) for o, r in zip(chosen, ranks, strict=True)})


def _pool_key(problem: Problem, table_options: List[List[ShardingOption]]) -> Tuple[Any, ...]:
    return (problem.world, problem.local, tuple((opts[0].fqn, tuple(_signature(o) for o in opts))
                                                for opts in table_options))


def pooled(problem: Problem, table_options: List[List[ShardingOption]]) -> List[Solution]:
    """Earlier points' plans (this process) that are valid on this problem."""
    index = option_index(table_options)
    found = (solution_of(table_options, plan, index) for plan in _POOL.get(_pool_key(problem, table_options), []))
    return [s for s in found if s is not None and valid(problem, s) is None]


def remember(problem: Problem, table_options: List[List[ShardingOption]], solution: Solution) -> None:
    plans = _POOL.setdefault(_pool_key(problem, table_options), [])
    plan = plan_of(table_options, solution)
    if plan not in plans:
        plans.append(plan)
        del plans[:-POOL_SIZE]


def search(problem: Problem, starts: Dict[str, Solution], effort: Effort, rounds: int = ROUNDS,
           patience: int = 20000, gap: float = 0.005,
           report: Optional[Callable[[str, Optional[float]], None]] = None) -> Tuple[Solution, Dict[str, Any]]:
    """The best plan the search finds from ``starts`` (name -> solution, each valid) and the runner's own
    start: small problems solved exactly first (:func:`.exact.exact`, within :data:`EXACT_NODES`); each
    start taken to its local optimum (:func:`.moves.improve`) within an even share of the work ``effort`` has
    left (so that the whole search keeps to it, however many starts a sweep's earlier points add); the best of
    those searched further (:func:`.moves.perturb`: at most ``rounds`` rounds, until ``patience`` units of work
    went by without improving, or until within ``gap`` of the simple lower bound). Every limit is counted in work,
    the safety stop's clock aside (:mod:`.effort`), so the answer does not depend on the machine.
    Returns the winner and, per start, its rating before and after. Ties keep the earlier start (the runner's
    own first). ``report`` is told each step (what, the best rating so far)."""
    say: Callable[[str, Optional[float]], None] = report or (lambda text, best: None)
    tick = ticker(None if report is None else lambda text: report(text, None), "balanced search: the starts")
    own = construct(problem, tick=tick)
    rng = random.Random(0)
    tries = [lambda: construct(problem, by_storage=True, tick=tick)] + [
        lambda: construct(problem, by_storage=True, rng=rng, tick=tick)] * (CONSTRUCT_TRIES if not starts else 0)
    for make in tries if own is None else []:  # tight storage: the smallest first, then random orders
        own = make()
        if own is not None:
            break
    candidates = ({"runner": own} if own is not None else {}) | packing_starts(problem, own, tick) | starts
    facts: Dict[str, Any] = {"starts": {}, "optimal": False}
    if len(problem.tables) <= EXACT_TABLES:  # small: solved exactly where the node budget allows
        incumbent = min((rating(problem, c) for c in candidates.values()), default=float("inf"))
        found, facts["optimal"] = exact(problem, incumbent, EXACT_NODES)
        if found is not None:
            candidates["exact"] = found
    if not candidates:
        raise ValueError("no start")  # where no plan fits: the caller says so
    target = simple_bound(problem) * (1 + gap)
    improved: Dict[str, Solution] = {}
    best_so_far: Optional[float] = None
    for i, (name, start) in enumerate(candidates.items()):
        say(f"balanced search: improving start {i + 1} of {len(candidates)} ({name})", best_so_far)
        found, moves = (start, 0) if facts["optimal"] else improve(problem, start, effort,
                                                                    effort.share(len(candidates) - i))
        improved[name] = found
        facts["starts"][name] = {"rating": rating(problem, start), "improved": rating(problem, found),
                                 "moves": moves, "changed": changed(start, found)}
        best_so_far = min(facts["starts"][name]["improved"], best_so_far or float("inf"))
    first = min(improved, key=lambda k: (facts["starts"][k]["improved"], list(improved).index(k)))
    if facts["optimal"]:
        best, done, effort.stopped = improved[first], 0, "optimal"
    else:
        say(f"balanced search: ruin and recreate from the best start ({first})", best_so_far)
        best, done = perturb(problem, improved[first], effort, rounds, patience, target)
    facts["starts"][first].update(improved=rating(problem, best), rounds=done,
                                  changed=changed(candidates[first], best))
    facts["winner"] = first
    facts.update(effort.facts(done), simple_bound_ms=float(target / (1 + gap)))
    return best, facts


def entries_of(best_plan: List[ShardingOption]) -> PlanEntries:
    """A planner's chosen options (with their shards' ranks) as table -> (sharding type, kernel, ranks)."""
    return {o.fqn: (*_signature(o), tuple(int(s.rank) for s in o.shards)) for o in best_plan}


def compared_metrics(facts: Dict[str, Any]) -> Dict[str, float]:
    """``plan/torchrec_<proposer>_ms``: each compared TorchRec proposer's plan's rating (where it found one)."""
    return {f"plan/torchrec_{name}_ms": float(r) for name, r in facts.get("torchrec", {}).items() if r is not None}


def job_facts(facts: Dict[str, Any]) -> Dict[str, Any]:
    """What a job reports of a balanced plan's search: its source, TorchRec's ratings compared, those skipped."""
    return {"plan_source": plan_source(facts), "compared": compared_metrics(facts),
            "torchrec": facts.get("torchrec", {}), "skipped": facts.get("skipped", {}),
            "search": {k: facts[k] for k in ("work", "work_limit", "rounds", "stopped", "cut_short", "simple_bound_ms")
                       if k in facts}}


def plan_source(facts: Dict[str, Any]) -> str:
    """``torchrec`` where the balanced proposer kept a TorchRec plan it started from unchanged; else ``runner``."""
    winner = str(facts.get("winner", ""))
    kept = winner.startswith("torchrec_") and not facts.get("starts", {}).get(winner, {}).get("changed", True)
    return "torchrec" if kept else "runner"


def balanced_note(facts: Dict[str, Any]) -> str:
    """The report's line on how a balanced plan was found and how it compares with TorchRec's."""
    starts = facts["starts"]
    winner = facts["winner"]
    compared = "; ".join(f"TorchRec's {name}: " + ("no plan" if r is None else f"{r:.3f} ms")
                         for name, r in facts.get("torchrec", {}).items())
    if winner == "sweep":
        return (f"sharding.proposer=balanced: the best, rated here, of the {facts['chosen_of']} plans this sweep's "
                f"points found when planned together, estimated step {facts['rating']:.3f} ms"
                + (f" ({compared})" if compared else "") + skipped_text(facts))
    if winner.startswith("torchrec_") and not starts[winner]["changed"]:
        return (f"sharding.proposer=balanced kept TorchRec's {winner[len('torchrec_'):]} plan: no move lowered its "
                f"busiest rank ({facts['rating']:.3f} ms)" + search_text(facts))
    origin = {"runner": "the runner's own start", "exact": "a branch and bound", "packing": "a packing start",
              "packing, uniform x2": "a packing start (uniform options at twice their cost)"}.get(
        winner, f"TorchRec's {winner[len('torchrec_'):]} plan" if winner.startswith("torchrec_")
        else "an earlier point's plan")
    return (f"sharding.proposer=balanced: the runner's plan, not a TorchRec proposer's, estimated step "
            f"{facts['rating']:.3f} ms" + (f" ({compared})" if compared else "")
            + f"; found from {origin}" + (", proved optimal" if facts.get("optimal") else "")
            + (f", {facts['pooled']} earlier points' plans tried" if facts.get("pooled") else "")
            + skipped_text(facts) + search_text(facts))


def skipped_text(facts: Dict[str, Any]) -> str:
    """The note's words on TorchRec's plans not tried as starts at this size (empty where none was skipped)."""
    skipped = facts.get("skipped") or {}
    names = ", ".join(skipped)
    return "" if not skipped else (
        f"; TorchRec's {names} plan not tried as a start at this size ({max(skipped.values()):,} shards in the "
        f"sharding options, above {COMPARE_MAX_SHARDS:,}): sharding.balanced_compare=[{names}] tries it")
