"""A plan-only sweep's points planned together by the balanced proposer, so that they agree.

A point's plan can be rated at any other point of a study (the same tables' options, other estimates or
storage). The balanced proposer's answers agree when no point's plan is worse than another point's plan
rated there, wherever that plan is valid. One search per point cannot promise that: a later point may find
a plan better at an earlier point than the earlier point's own. So a grid sweep of balanced plans runs in
two passes:

1. :func:`plan_together`, in the sweep's own process before any job starts: every point is planned in
   full (:func:`runner.plan.planner.make_plan`: enumeration, TorchRec's compared plans, the search), and
   each point's plan joins the sweep's plan set, written to a file the jobs find through
   :data:`PLAN_SET_ENV` (jobs in other processes, joblib's, inherit it);
2. each job then takes, of the set's plans valid at its point, the one with the lowest rating there
   (:func:`choices_for`: the balanced planner's selection), and reports what pass 1 compared
   (TorchRec's ratings).

Every point's own plan is in the set, so no point is worse than its own search, nor than TorchRec's
plans it started from; and each point holds the best of the set, so none is worse than another's. In
this process the enumerated options are reused between the passes
(:mod:`runner.plan.torchrec_adapter.enumeration_reuse`).

**Pass 1 on two cores.** Pass 1 plans every point in full, one after the other, in the sweep's process: at
5,384 tables on 1,024 GPUs each point is its enumeration (redone where the bandwidths change) and a 5 s
search, 90 s for 9 points on one core while the other waits. :func:`plan_in_halves` forks the sweep's process
once (where a fork is safe and a core is spare: :func:`runner.runtime.cores.may_fork`); the fork plans the later
half of the points (consecutive points share their bandwidths, so each half enumerates as few as it can), the
sweep's process the earlier half; the fork sends its points' plans and facts back. What a point gets is the same
kind of answer: its own search's plan (the earlier points of its own half as extra starts) joins the set, and
pass 2 gives every point the best of the whole set there. Where the fork fails or dies, its points are planned
here after the others.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from multiprocessing.connection import Pipe
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from runner.runtime.cores import may_fork
from runner.runtime.device import device_type
from runner.runtime.process_end import fork_helper, reap

if TYPE_CHECKING:
    from runner.config.schema import ShardingSchema
    from runner.plan import PlanFacts, PlanSpec

PLAN_SET_ENV = "RUNNER_SWEEP_PLAN_SET"  # the plan set's file, for the sweep's jobs (set by plan_together)
_LOADED: Dict[str, Dict[str, Any]] = {}


def applies(mode: str, sharding: ShardingSchema) -> bool:
    """Whether a sweep's point (of ``mode``, with its ``sharding`` keys) is one this module plans together: a
    balanced plan-only point."""
    from runner.config.modes import MODES
    from runner.config.proposers import PROPOSERS

    return MODES[mode].plans_together and PROPOSERS[sharding.proposer].plans_sweeps_together and not sharding.plan


def plan_together(points: List[Tuple[List[str], PlanSpec, Callable[[], Any]]],
                  progress: Optional[Callable[[int, Dict[str, Any]], None]] = None) -> Path:
    """Pass 1 (see the module doc) for ``points`` (each a point's overrides, its plan part and what builds its
    planning model): every point planned, the plans and what each point compared written to a file named in
    :data:`PLAN_SET_ENV`; that file's path. A point where no plan fits adds nothing. ``progress``: told each
    point's planning progress (the point's index, the planner's counts)."""
    plans: List[Dict[str, Any]] = []
    facts_of: Dict[str, Any] = {}
    t0 = time.perf_counter()
    tty = sys.stdout.isatty()
    if not tty:
        print(f"[runner] planning the sweep's {len(points)} points together (sharding.proposer=balanced)", flush=True)

    def plan_point(i: int, report: bool) -> Tuple[Optional[Dict[str, Any]], Dict[str, Any]]:
        return _plan_point(i, points[i][1], points[i][2], len(points), t0, progress if report else None, tty and report)

    import scipy.optimize  # noqa: F401  (the points' bound forks find it imported: 0.5 s each otherwise)

    with warnings.catch_warnings(), _quiet("torchrec"):
        warnings.simplefilter("ignore")  # the jobs send library warnings to their log files; none exist yet
        for i, entry, facts in plan_in_halves(len(points), plan_point):
            if entry is not None and entry not in plans:
                plans.append(entry)
            if entry is not None:
                facts_of[_key(points[i][0])] = facts
    done = time.perf_counter() - t0
    print(f"{chr(13) if tty else ''}[runner] planned the sweep's {len(points)} points together in {done:.1f} s: "
          f"{len(plans)} distinct plans; each point takes the best of them" + ("\x1b[K" if tty else ""), flush=True)
    fd, name = tempfile.mkstemp(prefix="runner-sweep-plans-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump({"plans": plans, "facts": facts_of}, f)
    atexit.register(lambda: Path(name).unlink(missing_ok=True))
    os.environ[PLAN_SET_ENV] = name
    return Path(name)


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _plan_point(i: int, spec: PlanSpec, build_model: Callable[[], Any], count: int, t0: float,
                progress: Optional[Callable[[int, Dict[str, Any]], None]], tty: bool
                ) -> Tuple[Optional[Dict[str, Any]], Dict[str, Any]]:
    """Point ``i``'s plan (as entries; None where no plan fits: its job says so) and what it compared; its
    planning model shared with the points of the same model (``build_model``: a new one)."""
    from runner.config.errors import PlanError
    from runner.plan import make_plan, plan_entries, reusable_model

    if tty:
        print(f"\r[runner] planning the sweep's {count} points together (sharding.proposer=balanced): "
              f"{i + 1}/{count}, {time.perf_counter() - t0:.0f} s\x1b[K", end="", flush=True)
    c = spec.cluster
    world, local = c.nodes * c.workers_per_node, c.workers_per_node
    facts: PlanFacts = {}
    try:
        _, best, _, _ = make_plan(spec, reusable_model(spec, build_model), world, local,
                                  device_type(c.device, planning=True), reuse=True, facts=facts,
                                  progress=None if progress is None else lambda counts: progress(i, counts))
    except PlanError:
        return None, {}
    entry = {k: list(v) for k, v in plan_entries(best).items()}
    bound = facts.get("lower_bound_ms")
    return entry, {"compared": facts.get("compared", {}), "torchrec": facts.get("torchrec", {}),
                   "skipped": facts.get("skipped", {}),
                   "bound": None if bound is None else [bound, facts.get("lower_bound_kind")]}


def _key(overrides: Sequence[str]) -> str:
    """A point's identity from its overrides, as its job and the pre-check both see them: Hydra's parse of
    each (a job's task overrides come in Hydra's order, without hydra's own keys, escaped, with values
    normalised: ``false`` as ``False``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, out = OverridesParser.create(), []
    for o in overrides:
        if o.lstrip("+~").startswith("hydra"):
            continue
        try:
            parsed = parser.parse_overrides([o])[0]
            out.append(f"{parsed.get_key_element()}={parsed.value()!r}")
        except Exception:  # noqa: BLE001 - not Hydra's syntax: as written
            out.append(o)
    return json.dumps(sorted(out))


def choices_for(overrides: Sequence[str]) -> Optional[Tuple[List[Dict[str, Any]], Dict[str, Any]]]:
    """Pass 2's inputs for the point with these overrides: the sweep's plans and what pass 1 compared at
    this point; None outside a sweep planned together (or for a point it did not plan)."""
    name = os.environ.get(PLAN_SET_ENV)
    if not name:
        return None
    if name not in _LOADED:
        try:
            _LOADED[name] = json.loads(Path(name).read_text())
        except (OSError, ValueError):
            return None  # gone or damaged: the point plans on its own
    found = _LOADED[name]
    facts = found["facts"].get(_key(overrides))
    return None if facts is None else (found["plans"], facts)


Answer = Tuple[int, Optional[Dict[str, Any]], Dict[str, Any]]  # (point, its plan's entries or None, its facts)
ANSWER_TIMEOUT_S = 24 * 3600.0  # the fork's half takes as long as this process's half


def plan_in_halves(count: int, plan_point: Callable[[int, bool], Tuple[Optional[Dict[str, Any]], Dict[str, Any]]]
                   ) -> List[Answer]:
    """Every point's answer (``plan_point(i, report)``: its entries and facts; ``report``: whether it may print
    progress), in point order; the later half in a fork where a fork may be made (:func:`may_fork`)."""
    later = list(range((count + 1) // 2, count)) if count > 1 and may_fork() else []
    pid, conn = _start(later, plan_point) if later else (None, None)
    try:
        answers = {i: (i, *plan_point(i, True)) for i in range(count) if i not in later}
        got = _collect(conn, later) if later else []
        answers.update({a[0]: a for a in got})
        # the fork failed: planned here
        answers.update({i: (i, *plan_point(i, True)) for i in later if i not in answers})
    finally:
        if pid is not None and conn is not None:  # (both or neither)
            conn.close()
            reap(pid, kill=True)  # done (it has sent all) or given up on
    return [answers[i] for i in range(count)]


def _start(points: List[int], plan_point: Callable[[int, bool], Tuple[Any, Any]]) -> Tuple[Optional[int], Any]:
    ours, theirs = Pipe(duplex=False)

    def work() -> None:  # in the fork: its points, each answer sent as it comes (what it did not send is
        ours.close()  # planned in the sweep's process)
        for i in points:
            theirs.send((i, *plan_point(i, False)))

    try:
        pid = fork_helper(work)
    except OSError:
        ours.close()
        theirs.close()
        return None, None
    theirs.close()
    return pid, ours


def _collect(conn: Any, points: List[int]) -> List[Answer]:
    out: List[Answer] = []
    if conn is None:
        return out
    with contextlib.suppress(EOFError, OSError):  # it ended early: what it sent is kept
        while len(out) < len(points) and conn.poll(ANSWER_TIMEOUT_S):
            out.append(conn.recv())
    return out
