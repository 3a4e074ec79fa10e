"""What rank 0 reports while a job runs: the plan, progress, metrics and results.

Other ranks get the same calls and stay quiet, so training code never branches on rank. What is
reported arrives as plain data (a plan report's metrics, tags and folder; a training result's numbers):
this module knows the run folder and MLflow, not how plans are made or models trained.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from runner.config.modes import DEFAULT, MODES
from runner.config.parts import part
from runner.runtime import run_files, signals
from runner.track import ui_links
from runner.track.estimate_error import against_estimates, estimate_errors
from runner.track.events import EventLog
from runner.track.sweep_points import sweep_of


class SilentBar:
    """A progress bar that shows nothing (a quiet rank, a calibration's timed loop)."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **kwargs: Any) -> None:
        pass


class Reporter:
    """Rank 0's reports, appended to the run folder's ``events.jsonl``: the job's MLflow run gets them from
    whoever owns it (:class:`runner.track.mlflow_run.MlflowRun`: the driver, or rank 0's own process under a plain
    torchrun). Training never waits for the store.
    """

    def __init__(self, run_folder: Path, rank: int, steps: int, verbose: bool) -> None:
        """``steps``: ``train.steps``; ``verbose``: ``sweep.verbose``."""
        self.run_folder, self.rank, self.steps, self.verbose = run_folder, rank, steps, verbose
        self.active = rank == 0
        self.plan_metrics: Dict[str, float] = {}
        self.extra: Dict[str, Any] = {}
        self._sink: Optional[EventLog] = EventLog(run_folder / run_files.EVENTS) if self.active else None

    def _quiet(self) -> bool:
        """A sweep's point, at the default verbosity (``sweep.verbose=false``): details stay in its files."""
        return not self.verbose and sweep_of(self.run_folder) is not None

    def flush(self) -> None:
        """Every report made so far is in the event log (complete lines, for the run's owner to deliver)."""
        sink, self._sink = self._sink, None
        if sink is not None:
            sink.close()

    def failed(self, exc: BaseException) -> None:
        """The job failed (``exc``) or was stopped: what rank 0 reported before is kept."""
        with signals.uninterrupted():  # a second SIGTERM (torchrun's peers are stopping too) waits for the end
            with contextlib.suppress(OSError):  # a full run folder: the job's error says so; what was written stays
                self.flush()

    def _tags(self, tags: Dict[str, Any]) -> None:
        if self._sink is not None:
            self._sink.tags(tags)

    def plan(self, report: Any) -> None:
        """Print and log a written plan report (its ``console`` text, ``metrics``, ``tags``, the files in
        its ``folder``)."""
        if not self.active:
            return
        if not self._quiet():  # a sweep's point: its one summary line (the plan is in its folder and run)
            print(report.console, flush=True)
        self.step_metrics(0, report.logged_metrics())
        self._tags(report.tags)
        assert self._sink is not None  # active: the sink is open
        self._sink.artifacts(sorted(report.folder.iterdir()), run_files.PLAN)
        self.plan_metrics = report.metrics

    def calibrated(self, report: Any) -> Dict[str, Any]:
        """``mode=calibrate``'s answer (its ``console`` text, ``metrics``, ``tags``, the files in its ``folder``,
        its ``results``): printed, logged, and written to ``results.json``; the results."""
        print(report.console, flush=True)
        self.step_metrics(0, report.metrics)
        self._tags(report.tags)
        assert self._sink is not None  # only rank 0 reports a calibration
        self._sink.artifacts(sorted(report.folder.iterdir()), report.folder.name)
        self.flush()
        run_files.write_json(self.run_folder / run_files.RESULTS, report.results)
        return dict(report.results)

    def hbm_cap(self, cap: Optional[int], ddr: Optional[float] = None) -> None:
        """The HBM per GPU the planner was given (CUDA: the job's GPUs' least free memory, or
        ``cluster.hbm_cap_gib``), as ``plan/hbm_cap_gib``; ``ddr``: its host memory per worker (reconciled with
        this host's, :func:`runner.runtime.device.ddr_cap_for_host`), as ``plan/ddr_cap_gib``."""
        if self.active and cap is not None:
            self.step_metrics(0, {"plan/hbm_cap_gib": cap / 2**30,
                                  **({"plan/ddr_cap_gib": ddr} if ddr is not None else {})})
            self.extra["hbm_cap_bytes"] = cap

    def plan_infeasible(self, reason: str) -> None:
        """``mode=plan``'s answer when no plan fits: printed, and tagged on the run (which still finishes)."""
        if not self.active:
            return
        print(f"[runner] no sharding plan: {reason}", flush=True)
        self._tags({"runner.plan_status": "infeasible", "runner.plan_reason": reason[:5000]})

    def started(self, step: int, restarts: int, source: Optional[Path]) -> None:
        """Where training starts: from scratch, a resumed checkpoint, or after an elastic restart."""
        self.extra.update({"start_step": step, "restarts": restarts, "resumed_from": str(source) if source else None})
        if not self.active:
            return
        tags: Dict[str, Any] = {"runner.restarts": restarts}
        if source is not None:
            tags["runner.resumed_from"] = str(source)
            print(f"[runner] resumed from {source} at step {step}" +
                  (f" (elastic restart {restarts})" if restarts else ""), flush=True)
        self._tags(tags)
        self.step_metrics(step, {"restarts": float(restarts)})

    def startup(self, marks: Dict[str, float]) -> None:
        """Seconds from the command's start (``RUNNER_START_UNIX``, else this worker's start) to each
        phase of rank 0's start-up: logged as ``startup/<phase>_s`` and printed in one line."""
        if not self.active:
            return
        t0 = float(os.environ.get("RUNNER_START_UNIX") or marks["worker_started"])
        phases = {k: v - t0 for k, v in marks.items()}
        self.extra["startup_s"] = phases
        self.step_metrics(0, {f"startup/{k}_s": v for k, v in phases.items()})
        print("[runner] start-up (s from launch): " + ", ".join(f"{k.replace('_', ' ')} {v:.1f}"
                                                             for k, v in phases.items()), flush=True)

    def data_ended(self, step: int) -> None:
        """The data ran out on some rank before ``train.steps``: every rank stopped after ``step``."""
        self.extra["data_ended_at_step"] = step
        if not self.active:
            return
        print(f"[runner] data ended after step {step} of {self.steps} (every rank stopped there)", flush=True)
        self._tags({"runner.data_ended_at_step": step})

    def pruned(self, step: int, metric: str, value: Optional[float]) -> None:
        """An Optuna trial's pruner stopped the training after ``step`` (:mod:`runner.track.trial`)."""
        self.extra["pruned_at_step"] = step
        if not self.active:
            return
        print(f"[runner] Optuna's pruner stopped this trial after step {step} of {self.steps} ({metric} "
              f"{'n/a' if value is None else format(value, '.4f')} at that step's evaluation); the trial is PRUNED in "
              "its study", flush=True)
        self._tags({"runner.pruned_at_step": step})

    def ids_hashed(self, hashed: int, ids: int) -> None:
        """Ids of the data outside their tables, hashed into range (``data.hash_ids=true``): said in one line and
        logged as ``data/ids_hashed_fraction`` (rank 0's share of the data)."""
        if not self.active or not hashed:
            return
        fraction = hashed / max(ids, 1)
        self.extra["ids_hashed_fraction"] = fraction
        print(f"[runner] {fraction:.1%} of ids ({hashed:,} of {ids:,} read by rank 0) were outside their tables "
              "and hashed into range (data.hash_ids=true)", flush=True)
        self.step_metrics(self.steps, {"data/ids_hashed_fraction": fraction})

    def checkpointed(self, step: int, path: Path, metrics: Dict[str, float]) -> None:
        self.extra["checkpoint"] = str(path)
        self._tags({"runner.last_checkpoint": str(path)})

    def measured(self, per_rank: List[Dict[str, Any]]) -> None:
        """Measured step time, page faults per step and peak memory per rank, next to the planner's estimates; the
        CPU cores each rank was bound to (tag ``runner.cpu_cores``)."""
        if not self.active:
            return
        self._tags({"runner.cpu_cores": "; ".join(
            f"rank{r}: {','.join(map(str, x['cores'])) if x.get('cores') else 'unbound'}"
            for r, x in enumerate(per_rank))})
        m: Dict[str, float] = {f"measured/rank{r}/{k}": x[k] for r, x in enumerate(per_rank)
                               for k in ("step_ms", "peak_mem_bytes", "mem_over_baseline_bytes", "mem_baseline_bytes",
                                         "embedding_fwd_ms", "faults_per_step") if x.get(k) is not None}
        m["measured/step_ms"] = max(x["step_ms"] for x in per_rank)
        m["measured/peak_mem_bytes"] = max(x["peak_mem_bytes"] for x in per_rank)
        est_step = self.plan_metrics.get("plan/est_whole_step_ms") or self.plan_metrics.get("plan/est_step_ms")
        est_mem = self.plan_metrics.get("plan/max_mem_bytes")
        if est_step:
            m["ratio/step_measured_over_estimated"] = m["measured/step_ms"] / est_step
        if est_mem:
            m["ratio/mem_measured_over_estimated"] = m["measured/peak_mem_bytes"] / est_mem
        m.update(estimate_errors(per_rank, self.plan_metrics))
        self.step_metrics(self.steps, m)
        run_files.write_json(self.run_folder / run_files.MEASURED, {"per_rank": per_rank, **m})
        print(against_estimates(per_rank, self.plan_metrics), flush=True)

    @contextlib.contextmanager
    def progress(self, steps: int, initial: int = 0) -> Iterator[Any]:
        if not self.active:
            yield SilentBar()
            return
        from tqdm import tqdm

        tty = sys.stderr.isatty()
        bar = tqdm(total=steps, initial=initial, desc="train", unit="step", file=sys.stderr if tty else _Lines(),
                   mininterval=1.0 if tty else 10.0, dynamic_ncols=tty, ncols=None if tty else 100)
        try:
            yield bar
        finally:
            bar.close()

    def step_metrics(self, step: int, metrics: Dict[str, float]) -> None:
        """Metrics at ``step``: a training step's, an evaluation's (and this reporter's own)."""
        if self._sink is not None:
            self._sink.metrics(metrics, step)

    def finish(self, result: Any, eval_metrics: Dict[str, float], world: int) -> Dict[str, Any]:
        """Log final metrics; write ``results.json`` for the driver's summary line."""
        if not self.active:
            return {}
        final = dict(eval_metrics)
        if result.losses:
            final.update({"train/final_loss": result.final_loss, "train/avg_samples_per_s": result.samples_per_s,
                          "train/avg_step_ms": result.step_time_ms})
        self.step_metrics(self.steps, final)
        self.flush()
        results = {"world_size": world, "final_loss": result.final_loss, "losses": result.losses,
                   "samples_per_s": result.samples_per_s, "eval_auc": eval_metrics["eval/auc"],
                   "eval_logloss": eval_metrics["eval/logloss"], "eval_ne": eval_metrics.get("eval/ne"),
                   "loss_steps": result.steps, "first_step_unix": result.first_step_unix, **self.extra}
        run_files.write_json(self.run_folder / run_files.RESULTS, results)
        return results


class _Lines:
    """The progress bar's refreshes as whole lines where stderr is a file or a pipe (a log, a Slurm job's output,
    a supervisor): no partial line is left for the next writer (another process's ``error:`` line), and the log
    gets a line every 10 s instead of carriage returns."""

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip("\n")
        if line.strip():
            sys.stderr.write(line + "\n")

    def flush(self) -> None:
        sys.stderr.flush()


def summary_line(results: Dict[str, Any]) -> str:
    """The job's last line: what came out, and where to see it in the MLflow UI."""
    run = results.get("run_id") or "(created when the store is back)"
    if results.get("tracking_pending"):
        view = f"tracking pending (the store is unreachable): python -m runner sync {results['tracking_pending']}"
    else:
        view = ui_links.view_hint(results["tracking_uri"], results.get("run_id"))
    if results.get("plan_status") == "infeasible":
        return f"[runner] plan done: no plan fits ({results['reason']}); MLflow run {run}; {view}"
    return str(part(MODES[results.get("mode", DEFAULT)].reports)(results, run, view))


def calibration_line(results: Dict[str, Any], run: str, view: str) -> str:
    """A calibration's last line (:func:`summary_line`)."""
    kept = (f"kept for cluster.calibration=auto as {results['kept']}" if results.get("kept")
            else "not kept for cluster.calibration=auto")
    return (f"[runner] calibration done in {results['seconds']:.0f}s: {results['headline']}; written to "
            f"{results['file']}, {kept}; MLflow run {run}; {view}")


def plan_line(results: Dict[str, Any], run: str, view: str) -> str:
    """A plan-only job's last line (:func:`summary_line`)."""
    types = ", ".join(f"{n} {t}" for t, n in results["sharding_types"].items())
    est = (f"{results.get('step_phrase') or 'estimated step %.3f ms' % results['est_step_ms']}, max memory "
           f"{results['max_mem_bytes'] / 2**30:.2f} GiB per rank, " if results.get("est_step_ms") else "")
    if results.get("lower_bound_ms") and results.get("gap_to_bound") is not None:
        est += f"{results['gap_to_bound']:+.2%} from the lower bound {results['lower_bound_ms']:.3f} ms, "
    return (f"[runner] plan done: {types} over {results['world_size']} ranks; {est}planned in "
            f"{results['plan_seconds']:.1f}s; MLflow run {run}; {view}")


def training_line(results: Dict[str, Any], run: str, view: str) -> str:
    """A training job's last line (:func:`summary_line`)."""
    return (f"[runner] done: final loss {results['final_loss']:.4f}, eval AUC {results['eval_auc']:.4f}"
            + (f", NE {results['eval_ne']:.4f}, " if results.get("eval_ne") is not None else ", ")
            + f"{results['samples_per_s']:.0f} samples/s, MLflow run {run}; {view}")

