"""``mode=plan``: plan and report in the driver's process, with no workers and no process group.

"No plan fits" is this mode's answer, not a failure: the run ends FINISHED with tags
``runner.plan_status=infeasible`` and ``runner.plan_reason`` (the one line naming the limit hit), and the
command exits 0. Plans for clusters that are not here (e.g. 16 GPUs from a CPU-only laptop): the caller builds the model
on the meta device (:func:`runner.train.models.planning_model`) and TorchRec's planner sees the topology
the cluster config describes.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, cast

from runner.config.errors import NoPlanFits
from runner.runtime import run_files
from runner.runtime.cores import collector_paused
from runner.runtime.device import device_type
from runner.runtime.process_end import answer_of, fork_answer, give_up, keep_until_exit
from runner.track.reporter import Reporter
from runner.track.store import check_store, sqlite_folder

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig
    from runner.launch.job.end import PlanChart
    from runner.plan import PlanChoices, PlanFacts
    from runner.track.mlflow_run import DriverRun


class PlanProgress:
    """A plan's progress on the terminal once it has taken ``after_s``: one line rewritten in place on a
    terminal, a line every ``every_s`` otherwise (a log file, a Slurm job's output). Counts with a
    ``phase`` (the balanced planner's enumeration, search and bound) say the phase and how far it is; the
    others, the proposals of TorchRec's proposers."""

    def __init__(self, after_s: float = 3.0, every_s: float = 10.0) -> None:
        self.after_s, self.every_s = after_s, every_s
        self.tty = sys.stdout.isatty()
        self.last: Optional[float] = None
        self.start = time.perf_counter()
        self.best: Optional[float] = None
        self.prefix = ""

    def __call__(self, counts: Dict[str, Any], prefix: str = "") -> None:
        seconds = time.perf_counter() - self.start
        if prefix != self.prefix:  # another sweep point: its own best
            self.prefix, self.best = prefix, None
        if counts.get("best") is not None:
            self.best = counts["best"]
        if seconds < self.after_s or (not self.tty and self.last is not None and seconds - self.last < self.every_s):
            return
        self.last = seconds
        best = "none yet" if self.best is None else f"{self.best:.3f} ms"
        if "phase" in counts:
            line = f"[runner] planning: {prefix}{_phase_text(counts)}; best estimated step {best} ({seconds:.0f} s)"
        else:
            line = (f"[runner] planning: {prefix}{counts['options']} sharding options of {counts['tables']} tables; "
                    f"proposals {counts['partitioned']} partitioned, {counts['skipped']} skipped; best estimated "
                    f"step {best} ({seconds:.0f} s)")
        print(f"\r{line}\x1b[K" if self.tty else line, end="" if self.tty else "\n", flush=True)

    def close(self) -> None:
        if self.tty and self.last is not None:
            print(flush=True)


def _phase_text(counts: Dict[str, Any]) -> str:
    phase = counts["phase"]
    if phase == "enumerating":
        return f"enumerating sharding options, {counts['done']} so far"
    if phase == "estimating":
        return f"estimating sharding options, {counts['done']} of {counts['of']}"
    return str(counts.get("detail") or phase)


def plan_beside(plan: Callable[[], Dict[str, Any]], run: DriverRun, chart: PlanChart) -> Dict[str, Any]:
    """A single plan-only job: ``plan()`` (:func:`plan_only`: TorchRec's import, the plan, its report) in a fork,
    the job's critical path, while this process opens the job's MLflow run (MLflow's import; a local store checked
    meanwhile, any other before the fork, as before any plan), loads the chart's matplotlib and delivers the report
    as it comes; the fork's results, or its error raised here. Where no fork can be made, all of it here."""
    local = sqlite_folder(run.uri) is not None
    if not local:
        check_store(run.uri)
    try:
        pid, answer = fork_answer(plan)
    except OSError:
        if local:
            check_store(run.uri)
        run.open()
        return plan()

    def meanwhile() -> None:
        run.pump()
        chart.start()

    try:
        if local:
            check_store(run.uri)  # refused in one line
        run.open()
        from runner.plan import load_matplotlib

        load_matplotlib()  # the chart's, while the plan is made
    except BaseException:
        give_up(pid, answer)
        raise
    return cast(Dict[str, Any], answer_of(pid, answer, meanwhile, name="the planning process"))


@collector_paused()  # a short job: the plan's millions of objects are not walked by collections
def plan_only(cfg: RunnerConfig, run_folder: Path, choose_from: Optional[PlanChoices] = None) -> Dict[str, Any]:
    """Plan ``cfg``'s model (on the meta device, shared with this process's later plans of it) for ``cfg.cluster``;
    write the report and report it to the job's run folder ``run_folder`` (its event log, for the run's holder to
    deliver); return the results. ``choose_from``: the plans of a sweep planned together
    (:mod:`runner.launch.sweep.plan_together`)."""
    from runner.plan import make_plan, plan_spec, reusable_model, step_phrase, write_plan_report
    from runner.train.models import planning_model

    spec = plan_spec(cfg)
    model = reusable_model(spec, lambda: planning_model(cfg))

    logging.getLogger("torchrec").setLevel(logging.WARNING)  # the planner's INFO lines, per proposal
    world = cfg.cluster.nodes * cfg.cluster.workers_per_node
    local = cfg.cluster.workers_per_node
    kind = device_type(cfg.cluster.device, planning=True)
    reporter = Reporter(run_folder, 0, cfg.train.steps, cfg.sweep.verbose)
    base = {"mode": cfg.mode, "world_size": world}
    notes: List[str] = []
    facts: PlanFacts = {}
    progress = PlanProgress()
    try:
        plan, best_plan, seconds, _ = make_plan(spec, model, world, local, kind, reuse=True, notes=notes,
                                                progress=progress, facts=facts, choose_from=choose_from)
    except NoPlanFits as exc:
        progress.close()
        reporter.plan_infeasible(str(exc))
        reporter.flush()
        results = {**base, "plan_status": "infeasible", "reason": str(exc)}
        run_files.write_json(run_folder / run_files.RESULTS, results)
        return results
    progress.close()
    keep_until_exit(plan, best_plan)
    reporter.plan(write_plan_report(spec, plan, best_plan, world, local, kind, run_folder / run_files.PLAN, seconds,
                                    " ".join(notes), facts))
    reporter.flush()
    m = reporter.plan_metrics
    est = m.get("plan/est_step_ms")
    results = {
        **base, "plan_status": "feasible", "plan_seconds": seconds, "est_step_ms": est,
        "est_whole_step_ms": m.get("plan/est_whole_step_ms"),
        "step_phrase": step_phrase(facts, est) if est is not None else None,
        "max_mem_bytes": m.get("plan/max_mem_bytes"), "lower_bound_ms": m.get("plan/lower_bound_ms"),
        "gap_to_bound": m.get("plan/gap_to_bound"),
        "compared_ms": {k: v for k, v in m.items() if k.startswith("plan/torchrec_")},
        "sharding_types": {k[len("plan/tables_"):]: int(v) for k, v in m.items() if k.startswith("plan/tables_")}}
    run_files.write_json(run_folder / run_files.RESULTS, results)
    return results
