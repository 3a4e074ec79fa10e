"""A job's outcome, computed once as one typed value and written from it alone.

:func:`of_error` turns whatever ended a job (a failure, a stop, a full disk) into an :class:`Outcome`: its
status, its one line, its exit code. It is computed once per exception (the value is kept on it), so the
driver that ends the MLflow run and :func:`runner.launch.job.hydra_call.run_job` that writes ``status.json`` and
prints the line hold the same value, as rank 0 does under a plain torchrun. A finished job's outcome is
:func:`finished`. :func:`write` writes ``status.json``; :mod:`.end` ends the MLflow run: nothing else writes
either.
"""

from __future__ import annotations

import contextlib
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional

from runner.config.errors import disk_full, one_line
from runner.runtime import run_files, signals

if TYPE_CHECKING:
    from runner.launch.schedulers import Scheduler


@dataclass(frozen=True)
class Outcome:
    """How a job ended: ``status`` (FINISHED, FAILED or KILLED), its ``line`` (a finished job's summary, else why it
    failed or stopped), a finished job's ``results``, and the exit code of the command that ran it."""

    status: str
    line: str
    results: Dict[str, Any] = field(default_factory=dict)
    exit_code: int = 0
    full_disk: bool = False  # the failure is a full disk (a sweep then ends: every later point would fail too)

    @property
    def error(self) -> Optional[str]:
        """The reason recorded with a job that did not finish (None for one that did)."""
        return None if self.status == "FINISHED" else self.line


def finished(results: Dict[str, Any]) -> Outcome:
    return Outcome("FINISHED", str(results.get("summary") or "done"), results)


_KEPT = "_runner_outcome"


def of_error(exc: BaseException, scheduler: Scheduler, run_folder: Path, stopped_by: Optional[str] = None) -> Outcome:
    """The outcome of a job that ``exc`` ended: a stop (Ctrl-C or a stop signal, or ``stopped_by``: a signal
    received while the error came; the job's ``scheduler`` says whether it is KILLED or, at a time limit, FAILED),
    a full disk named with its folder, or the error's one line (an unexpected one pointing to its traceback in the
    run's log). The same value for the same exception, wherever it is asked."""
    kept = getattr(exc, _KEPT, None)
    if isinstance(kept, Outcome):
        return kept
    if isinstance(exc, KeyboardInterrupt) or stopped_by:
        stop = signals.Stopped(signal.Signals[stopped_by]) if stopped_by else signals.stopped(exc)
        status, line = scheduler.stop_outcome(stop.name)
        outcome = Outcome(status, line, exit_code=stop.exit_code)
    elif full := disk_full(exc, str(run_folder)):
        outcome = Outcome("FAILED", f"disk full: {full}", exit_code=1, full_disk=True)
    else:
        line = one_line(exc)
        if line.startswith("unexpected error"):
            line += f" (traceback in {run_folder / run_files.LOG})"
        outcome = Outcome("FAILED", line, exit_code=1)
    with contextlib.suppress(AttributeError):
        setattr(exc, _KEPT, outcome)  # an exception that takes no attributes: computed again, to the same value
    return outcome


def write(outcome: Outcome, run_folder: Path, **extra: Any) -> None:
    """The outcome in the run folder's ``status.json`` (where a sweep's outcome is read from)."""
    if outcome.status == "FINISHED":
        run_files.write_status(run_folder, "FINISHED", summary=outcome.results.get("summary"), **extra)
    else:
        run_files.write_status(run_folder, outcome.status, outcome.line, **extra)
