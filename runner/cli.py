"""``python -m runner [overrides]``: check the overrides, then hand over to Hydra.

Every override (each value of a sweep too) is composed and validated before Hydra starts a job, so
a wrong value fails at once with one line naming the key and what is allowed.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from runner import PROJECT_ROOT
from runner.config.errors import TrackingError, WorkerFailure, disk_full, one_line
from runner.config.schema import register_schemas
from runner.config.secrets import redact_text
from runner.config.validation import validate
from runner.launch.precheck import CONF_DIR, checked, hydra_conf, precheck
from runner.runtime import rundir, signals
from runner.track.objective import objective_value
from runner.track.sweep import end_failed_sweep

if TYPE_CHECKING:
    from runner.launch.slurm import SlurmTask

OmegaConf.register_new_resolver("project_root", lambda: str(PROJECT_ROOT), replace=True)


def _run_subdir() -> str:
    """A single run's folder under outputs/runs: ``<date>/<time>``; the tasks of one Slurm job step
    (``srun python -m runner``) share ``slurm/<job id>.<step id>`` (node k > 0 keeps its files in ``node<k>/``)."""
    import os
    from datetime import datetime

    if "SLURM_JOB_ID" in os.environ and "SLURM_STEP_ID" in os.environ:
        return f"slurm/{os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}"
    return datetime.now().strftime("%Y-%m-%d/%H-%M-%S-%f")


OmegaConf.register_new_resolver("run_subdir", _run_subdir, use_cache=True, replace=True)
register_schemas()


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def _hydra_job(cfg: DictConfig) -> Optional[float]:
    """One job (a sweep's point, or the single run). Its outcome goes to its run folder's ``status.json``,
    where a sweep's outcome is read from (:mod:`runner.track.sweep`), whichever process ran it. As a Slurm
    task, a failed or stopped job also fails its Slurm job (and node k > 0 keeps its files in ``node<k>/``)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from runner.launch.slurm import adopt, stop_outcome, task_for

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir).resolve()
    logging.captureWarnings(True)  # library warnings to the run's log file (Hydra's job logging), not the terminal
    slurm = False
    try:
        task = task_for(cfg)
        if task is not None:
            slurm = True
            _as_slurm_task()
            if cfg.mode != "train" and task.node_rank > 0:
                print(f"[runner] node {task.node_rank}: mode={cfg.mode} runs in node 0's task only", flush=True)
                return None
            if cfg.mode == "train":
                run_dir = adopt(cfg, task, run_dir)
            else:
                cfg.cluster.scheduler = "slurm"  # the run's tags say where it ran
        if task is not None or not checked(list(hc.overrides.task)):
            validate(cfg)  # once per job: with Slurm's values adopted, unless the pre-check validated this config
        earlier = None
        if hc.mode == RunMode.MULTIRUN:
            from runner.launch.resume import kept_point, reusable

            kept = kept_point(cfg, run_dir)
            if kept is not None:  # a resumed sweep: this point has its answer
                print(f"[runner] job {hc.job.num} kept: it finished before with the same config ({run_dir})",
                      flush=True)
                return kept.get("objective")
            earlier = reusable(cfg)  # sweep.reuse: an earlier run of the same config answers it
        if earlier is not None:
            from runner.launch.driver import reuse_job

            results = reuse_job(cfg, earlier)
        else:
            results = _attempts(cfg, run_dir, task)
    except KeyboardInterrupt as exc:
        stop = signals.stopped(exc)
        status, line = stop_outcome(cfg, stop.name)
        _record_status(run_dir, status, line)
        resume = (f"; resume the sweep: python -m runner resume {Path(hc.sweep.dir).resolve()}"
                  if hc.mode == RunMode.MULTIRUN else "")
        _say_error(f"{line}; every worker was stopped, the run is {status} ({run_dir}){resume}")
        raise SystemExit(stop.exit_code) from None
    except Exception as exc:
        # a full disk in a sweep: every later point would fail too, so the sweep ends here
        if (full := disk_full(exc, str(run_dir))) and hc.mode == RunMode.MULTIRUN:
            line = end_failed_sweep(f"disk full: {full}", Path(hc.sweep.dir).resolve())
            _record_status(run_dir, "FAILED", line)
            _say_error(line)
            raise SystemExit(1) from None
        line = one_line(exc)
        logging.getLogger("runner").error("job failed: %s", line, exc_info=True)  # to the run's log file
        if line.startswith("unexpected error"):
            line += f" (traceback in {run_dir / rundir.LOG})"
        _record_status(run_dir, "FAILED", line)
        _say_error(line)
        if hc.mode != RunMode.MULTIRUN or slurm:  # a Slurm job fails with its run
            raise SystemExit(1) from None
        return objective_value(cfg, None)  # the sweep goes on (a searching sweeper gets the worst value);
        # its outcome is read from every point's status
    value = objective_value(cfg, results)
    _record_status(run_dir, "FINISHED", summary=results.get("summary"), objective=value)
    return value


def _attempts(cfg: DictConfig, run_dir: Path, task: Optional[SlurmTask]) -> Dict[str, Any]:
    """The job, run again (up to ``sweep.retries`` times) while it fails from a fault; each attempt its own
    MLflow run (tag ``runner.attempt``), the earlier attempts' files in ``previous/<n>/``. ``task``: the Slurm
    task the job runs as, if any."""
    from runner.launch.driver import execute_job
    from runner.launch.mlflow_run import record_requeued

    attempt = 1
    if task is not None and task.restarts > 0:  # Slurm requeued the job (a lost node): the point's next attempt
        attempt += task.restarts
        if task.node_rank == 0:
            record_requeued(run_dir, task.shown_id, attempt)
        if attempt > cfg.sweep.retries + 1:
            raise WorkerFailure(f"Slurm requeued job {task.shown_id} after it lost a node; sweep.retries="
                                f"{cfg.sweep.retries} allows {cfg.sweep.retries + 1} attempt(s), so attempt "
                                f"{attempt} does not run")
    while True:
        try:
            return execute_job(cfg, attempt)
        except (WorkerFailure, TrackingError) as exc:
            if attempt > cfg.sweep.retries or not exc.fault:
                raise
            _record_status(run_dir, "FAILED", one_line(exc), attempt=attempt)
            print(f"[runner] attempt {attempt} of {cfg.sweep.retries + 1} failed from a fault ({exc}); running "
                  "it again", flush=True)
            attempt += 1


def _as_slurm_task() -> None:
    """Signals as the command line has them (submitit's own handlers ignore SIGTERM), and a line on Slurm's
    early time-limit signal."""
    from runner.launch.slurm import on_time_limit_warning

    signals.install()
    on_time_limit_warning()


def _say_error(line: str) -> None:
    """``error: <line>`` on stderr, on a line of its own (rank 0's progress bar may not have ended one)."""
    print(f"{chr(10) if sys.stderr.isatty() else ''}error: {line}", file=sys.stderr, flush=True)


def _record_status(run_dir: Path, status: str, error: Optional[str] = None, **extra: object) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        rundir.write_status(run_dir, status, error, **{k: v for k, v in extra.items() if v is not None})
    except OSError as exc:  # the job's own outcome matters more than its record (a full disk: already said)
        if not (disk_full(exc) and (error or "").startswith("disk full")):
            print(f"[runner] warning: could not record the job's status in {run_dir}: {exc}", file=sys.stderr)


_PYTHON_M = re.compile(r"^(\S*python[\d.]*\s+-m\s+)runner\b")


def _shell_completion(args: List[str]) -> bool:
    """Hydra's shell completion (``-sc install=bash``, then ``-sc query=bash`` per TAB), taught the
    ``python -m runner`` form: Hydra's script completes ``python <script.py>`` and ``runner`` only."""
    if not any(a in ("-sc", "--shell-completion") or a.startswith("--shell-completion=") for a in args):
        return False
    import contextlib
    import io
    import os

    m = _PYTHON_M.match(os.environ.get("COMP_LINE", ""))
    if m:  # a query from `python -m runner ...`: Hydra reads the line as `runner ...`
        os.environ["COMP_LINE"] = os.environ["COMP_LINE"][len(m.group(1)):]
        os.environ["COMP_POINT"] = str(max(int(os.environ.get("COMP_POINT", "0")) - len(m.group(1)), 0))
    if not any(a.startswith("install=bash") for a in args):
        _hydra_job()
        return True
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _hydra_job()
    print(out.getvalue().replace(
        'if [ "${words[0]}" == "python" ]; then',
        'if [ "${words[0]}" == "python" ] && [ "${words[1]}" == "-m" ] && [ "${words[2]}" == "runner" ]; then\n'
        '        helper="${words[0]} -m runner"\n'
        '    elif [ "${words[0]}" == "python" ]; then', 1), end="")
    return True


def _help(args: List[str]) -> bool:
    """``--help [word ...]``: usage, each config group's options, and every key's doc from the schema (only
    the keys containing one of the words, when given). Hydra's own help stays at ``--hydra-help``."""
    if not any(a in ("--help", "-h") for a in args):
        return False
    import textwrap

    from runner.config.keydocs import key_docs
    from runner.config.schema import RunnerConfig

    words = [a for a in args if not a.startswith("-")]
    with hydra_conf() as loader:
        groups = {g: loader.get_group_options(g) for g in sorted(loader.list_groups("")) if g != "hydra"}
    print("python -m runner [group=option ...] [key=value ...]      one job (mode=train | plan | write_data)\n"
          "python -m runner -m [key=a,b ...]                        a sweep (hydra/launcher=joblib|slurm, "
          "hydra/sweeper=optuna)\n"
          "python -m runner --cfg job [--resolve]                   the composed config\n"
          "python -m runner --help [word ...]                       this help (keys containing a word)\n"
          "python -m runner sync <folder>                           send runs kept during a tracking outage\n"
          "python -m runner resume <sweep folder>                   run a stopped sweep's unfinished points\n"
          "python -m runner diff <A> <B>                            what differs between two runs (folders or ids)\n")
    print("Config groups (group=option):")
    for g, options in groups.items():
        print(textwrap.fill(", ".join(options), 116, initial_indent=f"  {g}: ", subsequent_indent=" " * (len(g) + 4)))
    print("\nKeys (key = default: what it means):")
    for key, default, doc in key_docs(RunnerConfig):
        if words and not any(w in key for w in words):
            continue
        print(f"  {key} = {default}" if default else f"  {key}")
        if doc:
            print(textwrap.fill(doc, 116, initial_indent="      ", subsequent_indent="      "))
    return True


def main() -> None:
    """Console entry: pre-check, run (or sweep); exit non-zero if the job or any point of the sweep failed."""
    signals.install()
    logging.raiseExceptions = False  # a log file on a full disk: no traceback on the terminal for its handler
    if sys.argv[1:2] == ["sync"]:
        from runner.track.sync import sync

        sys.exit(sync(sys.argv[2:]))
    if sys.argv[1:2] == ["resume"]:  # the sweep's own command again, in its folder
        from runner.launch.resume import resume_argv

        sys.argv = [sys.argv[0], *resume_argv(sys.argv[2:])]
    if sys.argv[1:2] == ["diff"]:
        from runner.track.diff import diff

        sys.exit(diff(sys.argv[2:]))
    try:
        if _shell_completion(sys.argv[1:]) or _help(sys.argv[1:]):
            return
    except BrokenPipeError:  # e.g. `--help | head`
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return
    try:
        from runner.launch.prewarm import prewarm_for

        prewarm_for(sys.argv[1:])
        error, launcher = precheck(sys.argv[1:])
        if error:
            print(f"error: {redact_text(error)}", file=sys.stderr)
            sys.exit(2)
        sys.argv += launcher
        from runner.launch.driver import plan_sweep_together

        plan_sweep_together(sys.argv[1:])  # a grid sweep of balanced plans: planned together first
        _hydra_job()
    except SystemExit as exc:  # a failed single job, or a sweep with failed points (raised by its callback)
        if exc.code in (130, 143):  # a job of a sweep stopped (it said so): the sweep ends with it
            _end_sweep("SIGINT" if exc.code == 130 else "SIGTERM", said=True)
        if exc.code not in (0, None):
            raise
    except KeyboardInterrupt as exc:  # before or between jobs (a job's own stop is handled in _hydra_job)
        stop = signals.stopped(exc)
        if not _end_sweep(stop.name, said=False):
            _say_error(f"stopped by {stop.name}")
        sys.exit(stop.exit_code)


def _end_sweep(signame: str, said: bool) -> bool:
    """A running sweep's parent and running points end KILLED; its folder is named (in the job's own line
    when a job said it was stopped, else in this line). False when no sweep was running."""
    from runner.track.sweep import end_stopped_sweep

    folder = end_stopped_sweep(signame)
    if folder is not None and not said:
        _say_error(f"stopped by {signame}; the sweep's runs are KILLED, its points' folders are in {folder}; "
                   f"resume it: python -m runner resume {folder.resolve()}")
    return folder is not None
