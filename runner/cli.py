"""``python -m runner [overrides]``: check the overrides, then hand over to Hydra.

Every override (each value of a sweep too) is composed and validated before Hydra starts a job, so
a wrong value fails at once with one line naming the key and what is allowed.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from typing import List, Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from runner import PROJECT_ROOT
from runner.config import rundir, signals
from runner.config.errors import ConfigError, first_line, one_line
from runner.config.schema import register_schemas
from runner.config.validation import validate

CONF_DIR = str(PROJECT_ROOT / "conf")
# Hydra flags that take a value; the value is not an override.
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-path", "-cp",
                     "--config-dir", "-cd", "--experimental-rerun"}
_FLAGS_WITHOUT_CHECK = {"--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion", "-sc",
                        "--version", "--experimental-rerun"}
_TYPE_WORDS = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "String": "a string"}

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


def _split_args(args: List[str]) -> tuple[List[str], Optional[str], bool]:
    """Overrides, the config name, and whether the arguments allow a pre-check at all."""
    overrides, config_name, checkable, skip = [], None, True, False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        flag = a.split("=", 1)[0]
        if flag in _FLAGS_WITHOUT_CHECK or flag in ("--config-path", "-cp", "--config-dir", "-cd"):
            checkable = False
        if flag in ("--config-name", "-cn"):
            config_name = a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else None)
        if a.startswith("-"):
            skip = flag in _FLAGS_WITH_VALUE and "=" not in a
            continue
        overrides.append(a)
    return overrides, config_name, checkable


def _combinations(overrides: List[str], loader: object = None) -> List[List[str]]:
    """First value of every sweep, then each other sweep value once: every value is composed once.
    ``glob()`` is expanded over the group's options; a sampler's ``interval()`` is left to the sweeper."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    values = []
    for text, o in zip(overrides, parsed, strict=True):
        if o.is_interval_sweep():
            continue
        if o.is_sweep_override():
            o.config_loader = loader  # glob() reads the group's options through it
            key = o.get_key_element()
            values.append([f"{key}={v}" for v in o.sweep_string_iterator()] or [text])
        else:
            values.append([text])
    combos = [[v[0] for v in values]]
    for i, vs in enumerate(values):
        for v in vs[1:]:
            combos.append([c if j != i else v for j, c in enumerate(combos[0])])
    return combos


def _file_sweeps(overrides: List[str], config_name: Optional[str], loader: object) -> List[str]:
    """Sweeps an experiment file sets in ``hydra.sweeper.params`` (not overridden on the command line)."""
    from hydra import compose

    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    first = _combinations(overrides, loader)[0]
    cfg = compose(config_name=config_name or "config", overrides=first, return_hydra_config=True)
    params = cfg.hydra.sweeper.get("params") or {}
    return [f"{k}={v}" for k, v in params.items() if k not in keys]


def _group_error(override: str, loader: object) -> Optional[str]:
    key, _, value = override.lstrip("+~").partition("=")
    if "." in key or not value or key.startswith("hydra") or key not in loader.list_groups(""):  # type: ignore[attr-defined]
        return None
    options = loader.get_group_options(key)  # type: ignore[attr-defined]
    if value in options or value == "null":
        return None
    return f"{key}={value!r} is not an option; expected one of {', '.join(options)}"


def _format(exc: BaseException, override_text: List[str]) -> str:
    cause = exc.__cause__ or exc
    full_key = getattr(cause, "full_key", None)
    msg = first_line(cause) or type(cause).__name__
    m = re.search(r"Value '(.*)' of type '\w+' could not be converted to (\w+)", msg)
    if full_key and m:
        return f"{full_key}={m.group(1)!r} is not allowed; expected {_TYPE_WORDS.get(m.group(2), m.group(2))}"
    if full_key and "is not in struct" in msg:  # a new key under a dict-valued setting
        given = next((o for o in override_text if o.split("=", 1)[0] == str(full_key)
                      or o.startswith(f"{full_key}.")), f"{full_key}=...")
        return (f"{full_key}: no such key yet; a new entry of a dict-valued setting is added with a leading +, "
                f"e.g. +{given.lstrip('+')}")
    if full_key:
        return f"{full_key}: {msg}"
    return f"{msg} (in: {' '.join(override_text)})"


def precheck(args: List[str]) -> Optional[str]:
    """Compose and validate what ``args`` ask for; the one-line error, or None when all is well."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides, config_name, checkable = _split_args(args)
    if not checkable:
        return None
    multirun = any(a in ("-m", "--multirun") for a in args)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            loader = GlobalHydra.instance().config_loader()
            try:
                if multirun:
                    overrides = overrides + _file_sweeps(overrides, config_name, loader)
                combos = _combinations(overrides, loader)
            except Exception as exc:  # override syntax
                return first_line(exc)
            return _check_combos(combos, config_name, loader) or next(
                (e for e in (_check_launcher(c, config_name) for c in combos) if e), None)
    finally:
        GlobalHydra.instance().clear()


def _check_combos(combos: List[List[str]], config_name: Optional[str], loader: object) -> Optional[str]:
    """The first combination's error (compose + validate), naming the point when it is a sweep's."""
    from hydra import compose

    for combo in combos:
        where = f" (sweep point: {' '.join(combo)})" if len(combos) > 1 else ""
        for o in combo:
            err = _group_error(o, loader)
            if err:
                return err + where
        try:
            validate(compose(config_name=config_name or "config", overrides=combo))
        except ConfigError as exc:
            return str(exc) + where
        except Exception as exc:
            return _format(exc, combo)
    return None


def _check_launcher(combo: List[str], config_name: Optional[str]) -> Optional[str]:
    """A Slurm launch: what its nodes must reach (the store, the sweep folder), before anything is submitted."""
    if "hydra/launcher=slurm" not in combo:
        return None
    from hydra import compose

    from runner.config.errors import SchedulerError
    from runner.launch.slurm_submit import check_submission

    try:
        check_submission(compose(config_name=config_name or "config", overrides=combo, return_hydra_config=True))
    except SchedulerError as exc:
        return str(exc)
    return None


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def _job(cfg: DictConfig) -> Optional[float]:
    """One job (a sweep's point, or the single run). Its outcome goes to its run folder's ``status.json``,
    where a sweep's outcome is read from (:mod:`runner.track.sweep`), whichever process ran it. As a Slurm
    task, a failed or stopped job also fails its Slurm job (and node k > 0 keeps its files in ``node<k>/``)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from runner.launch.driver import run_job
    from runner.launch.slurm import adopt, stop_outcome, task_for

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir).resolve()
    logging.captureWarnings(True)  # library warnings to the run's log file (Hydra's job logging), not the terminal
    slurm = False
    try:
        validate(cfg)
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
        results = run_job(cfg)
    except KeyboardInterrupt as exc:
        stop = signals.stopped(exc)
        status, line = stop_outcome(cfg, stop.name)
        _record_status(run_dir, status, line)
        _say_error(f"{line}; every worker was stopped, the run is {status} ({run_dir})")
        raise SystemExit(stop.exit_code) from None
    except Exception as exc:
        line = one_line(exc)
        logging.getLogger("runner").error("job failed: %s", line, exc_info=True)  # to the run's log file
        if line.startswith("unexpected error"):
            line += f" (traceback in {run_dir / rundir.LOG})"
        _record_status(run_dir, "FAILED", line)
        _say_error(line)
        if hc.mode != RunMode.MULTIRUN or slurm:  # a Slurm job fails with its run
            raise SystemExit(1) from None
        return None  # the sweep goes on; its outcome is read from every point's status
    _record_status(run_dir, "FINISHED", summary=results.get("summary"))
    return results.get("eval_auc")


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
    except OSError as exc:  # the job's own outcome matters more than its record
        print(f"[runner] warning: could not record the job's status in {run_dir}: {exc}", file=sys.stderr)


def _prewarm(args: List[str]) -> None:
    """Start node 0's agent now, for a plain single training job (no flags: not a sweep, not
    ``--cfg``/``--help``), so that its imports overlap composing the config (start-up)."""
    if any(a.startswith("-") for a in args) or any(re.match(r"\+*mode=(plan|write_data)$", a) for a in args):
        return
    from runner.config.schema_model import ClusterSchema
    from runner.launch.warm import prewarm
    from runner.train.affinity import threads_per_worker, workers_on_host

    prewarm(threads_per_worker(None, workers_on_host(ClusterSchema())))  # the default cluster's count


def main() -> None:
    """Console entry: pre-check, run (or sweep); exit non-zero if the job or any point of the sweep failed."""
    signals.install()
    if sys.argv[1:2] == ["sync"]:
        from runner.track.sync import sync

        sys.exit(sync(sys.argv[2:]))
    try:
        _prewarm(sys.argv[1:])
        error = precheck(sys.argv[1:])
        if error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
        _job()
    except SystemExit as exc:  # a failed single job, or a sweep with failed points (raised by its callback)
        if exc.code not in (0, None):
            raise
    except KeyboardInterrupt as exc:  # before or between jobs (a job's own stop is handled in _job)
        stop = signals.stopped(exc)
        _say_error(f"stopped by {stop.name}")
        sys.exit(stop.exit_code)
