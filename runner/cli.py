"""``python -m runner [overrides]``: check the overrides, then hand over to Hydra.

Every override (each value of a sweep too) is composed and validated before Hydra starts a job, so
a wrong value fails at once with one line naming the key and what is allowed.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import TYPE_CHECKING, List, Optional, cast

import hydra
from omegaconf import DictConfig, OmegaConf

from runner import PROJECT_ROOT
from runner.config import paired
from runner.config.parts import part
from runner.config.schema import register_schemas
from runner.config.secrets import redact_text
from runner.launch.job.hydra_call import say_error
from runner.launch.sweep.precheck import CONF_DIR, hydra_conf, precheck
from runner.runtime import signals

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig
    from runner.track.objective import Objective

OmegaConf.register_new_resolver("project_root", lambda: str(PROJECT_ROOT), replace=True)


def _run_subdir() -> str:
    """A single run's folder under outputs/runs: ``<date>/<time>``; the tasks of one job step of a scheduler
    share the folder it names (:meth:`runner.launch.schedulers.Scheduler.run_folder_name`)."""
    from datetime import datetime

    from runner.launch import schedulers

    return schedulers.run_folder_name() or datetime.now().strftime("%Y-%m-%d/%H-%M-%S-%f")


OmegaConf.register_new_resolver("run_subdir", _run_subdir, use_cache=True, replace=True)
register_schemas()


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def _hydra_job(cfg: DictConfig) -> Optional[Objective]:
    """Hydra's entry for one job (a sweep's point, or the single run): :func:`runner.launch.job.hydra_call.run_job`."""
    from runner.launch.job.hydra_call import run_job

    return run_job(cast("RunnerConfig", cfg))  # the schema-typed config Hydra composed


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
    from runner.launch import schedulers

    launchers = "|".join(["joblib", *schedulers.launchers()])  # this host's, and each scheduler's
    print("python -m runner [group=option ...] [key=value ...]      one job (mode=train | plan | write_data)\n"
          f"python -m runner -m [key=a,b ...]                        a sweep (hydra/launcher={launchers}, "
          "hydra/sweeper=optuna)\n"
          "python -m runner -m [key=a,b ...] --dry-run              each point's overrides and verdict; nothing runs\n"
          "python -m runner -m a=pair(1,2,3) b=pair(x,y,z) [c=...]  paired axes: 3 points (1,x) (2,y) (3,z), "
          "crossed with the others\n"
          "python -m runner --cfg job [--resolve]                   the composed config\n"
          "python -m runner --help [word ...]                       this help (keys containing a word)\n"
          "python -m runner sync <folder>                           send runs kept during a tracking outage\n"
          "python -m runner resume <sweep folder>                   run a stopped sweep's unfinished points\n"
          "python -m runner diff <A> <B>                            what differs between two runs (folders or ids)\n"
          "python -m runner export-calibration <cal.yaml> [out.py]  a calibration as TorchRec's own perf config\n"
          "python -m runner learn-calibration <runs> [cal.yaml]     a calibration refitted from finished runs\n")
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


def _sync(args: List[str]) -> int:
    from runner.track.sync import sync

    try:
        return sync(args)
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM: what was delivered is recorded, the rest waits
        stop = signals.stopped(exc)
        print(f"error: sync stopped by {stop.name}; what it delivered is recorded (delivered.json), and "
              f"python -m runner sync {' '.join(args)} delivers the rest", file=sys.stderr, flush=True)
        return stop.exit_code


SUBCOMMANDS = {  # each ``module:function`` of the arguments after its name, imported when named; ``resume`` is a
    "sync": "runner.cli:_sync", "diff": "runner.track.diff:diff",  # sweep's own command again: it runs as one
    "export-calibration": "runner.plan:export_calibration_command", "learn-calibration": "runner.plan:learn_command"}


def main() -> None:
    """Console entry: pre-check, run (or sweep); exit non-zero if the job or any point of the sweep failed."""
    signals.install()
    logging.raiseExceptions = False  # a log file on a full disk: no traceback on the terminal for its handler
    args = sys.argv[1:]
    if args[:1] and args[0] in SUBCOMMANDS:
        sys.exit(part(SUBCOMMANDS[args[0]])(args[1:]))
    args = paired.rewrite(args)  # key=pair(...): paired sweep axes, in Hydra's grammar
    if args[:1] == ["resume"]:  # the sweep's own command again, in its folder
        from runner.launch.sweep.resume import resume_argv

        args = resume_argv(args[1:])
    sys.argv = [sys.argv[0], *args]  # what Hydra reads
    if "--dry-run" in args:
        sys.exit(_dry_run([a for a in args if a != "--dry-run"]))
    if _answered_without_a_job(args):
        return
    try:
        _start(args)
    except SystemExit as exc:  # a failed single job, or a sweep with failed points (raised by its callback)
        if exc.code in (130, 143):  # a job of a sweep stopped (it said so): the sweep ends with it
            _end_sweep("SIGINT" if exc.code == 130 else "SIGTERM", said=True)
        if exc.code not in (0, None):
            raise
    except KeyboardInterrupt as exc:  # before or between jobs (a job's own stop is handled in _hydra_job)
        stop = signals.stopped(exc)
        if not _end_sweep(stop.name, said=False):
            say_error(f"stopped by {stop.name}")
        sys.exit(stop.exit_code)


def _dry_run(args: List[str]) -> int:
    """``--dry-run``: every point previewed (:mod:`runner.launch.sweep.preview`), nothing started or written."""
    from runner.launch.sweep.preview import preview

    error = _config_file_error(args)
    if error is None:
        try:
            return preview(args)
        except Exception as exc:  # noqa: BLE001 - the overrides' own syntax: Hydra's message, one line
            from runner.config.errors import first_line

            error = first_line(exc) or type(exc).__name__
    print(f"error: {redact_text(error)}", file=sys.stderr)
    return 2


def _answered_without_a_job(args: List[str]) -> bool:
    """Shell completion and ``--help``: answered here, no job."""
    try:
        return _shell_completion(args) or _help(args)
    except BrokenPipeError:  # e.g. `--help | head`
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return True


def _start(args: List[str]) -> None:
    """The checks before anything starts (one line and exit 2 on a refusal), then Hydra's job or sweep."""
    from runner.launch.processes.prewarm import prewarm_for

    prewarm_for(args)
    error = _config_file_error(args)
    error, launcher = (error, []) if error else precheck(args)
    if error:
        print(f"error: {redact_text(error)}", file=sys.stderr)
        sys.exit(2)
    sys.argv += launcher
    _hold_named_run_folder(args)
    from runner.launch.job.driver import plan_sweep_together

    plan_sweep_together(sys.argv[1:])  # a grid sweep of balanced plans: planned together first
    _hydra_job()


def _config_file_error(args: List[str]) -> Optional[str]:
    from pathlib import Path

    from runner.config.config_files import config_file_error

    names = [a.split("=", 1)[1] for a in args if a.startswith(("--config-name=", "-cn="))]
    return config_file_error(args, Path(CONF_DIR), names[-1] if names else None)


def _hold_named_run_folder(args: List[str]) -> None:
    """A single job whose run folder the command names: one live job per folder (refused in one line, exit 2)."""
    from runner.launch import schedulers

    if any(a in ("-m", "--multirun") for a in args) or schedulers.in_a_task():
        return  # a sweep's folder has its own lock; a job step's tasks share their run folder by design
    named = [a.split("=", 1)[1] for a in args if a.startswith("hydra.run.dir=")]
    if not named or not named[-1]:
        return
    from pathlib import Path

    from runner.runtime.folder_lock import FolderBusy, hold_run_folder

    try:
        hold_run_folder(Path(named[-1].strip("'\"")).absolute())
    except FolderBusy as exc:
        say_error(str(exc))
        sys.exit(2)
    except OSError:
        pass  # a folder that cannot be made: the job's own checks say why


def _end_sweep(signame: str, said: bool) -> bool:
    """A running sweep's parent and running points end KILLED; its folder is named (in the job's own line
    when a job said it was stopped, else in this line). False when no sweep was running."""
    from runner.launch.sweep.parent import end_stopped_sweep

    folder = end_stopped_sweep(signame)
    if folder is not None and not said:
        say_error(f"stopped by {signame}; the sweep's runs are KILLED, its points' folders are in {folder}; "
                   f"resume it: python -m runner resume {folder.resolve()}")
    return folder is not None
