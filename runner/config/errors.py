"""The error kinds a job can end with, and the one line a user sees for each.

Every stage raises one of these with a message that is already the line to print (what is wrong, where,
what to do); :func:`one_line` puts the kind in front. Workers record that line for the driver
(:mod:`runner.runtime.run_files`), the driver and the CLI print it. Any other exception is shown by its class
name and first line, and its traceback goes to the run folder.
"""

from __future__ import annotations

import errno
import os
import re
from typing import Any, Optional


class ConfigError(ValueError):
    """A config value outside what is allowed; ``str()`` is the one-line message users see."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        super().__init__(f"{key}={value!r} is not allowed; expected {allowed}")
        self.key = key

    def __reduce__(self) -> tuple:  # pickles (broadcast between ranks) as the same one line
        return (config_error_line, (str(self), self.key))


def config_error_line(message: str, key: str) -> ConfigError:
    """A :class:`ConfigError` about ``key`` whose one line is ``message`` as it is."""
    exc = ConfigError.__new__(ConfigError)
    ValueError.__init__(exc, message)
    exc.key = key
    return exc


class PlanError(RuntimeError):
    """A plan that cannot be made or used; ``str()`` is one actionable line."""


class NoPlanFits(PlanError):
    """The planner found no plan for this model on this cluster (in ``mode=plan``: an answer, not a failure)."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be found or used; ``str()`` is one line naming the path."""


class TrackingError(RuntimeError):
    """The MLflow store cannot be reached or opened; ``str()`` names the URI and what to do."""

    fault = False  # True for a tracking server that does not answer (an outage: ``sweep.retries`` may help)


class DataError(RuntimeError):
    """The data cannot be read as configured; ``str()`` names the file (and line) and what is expected."""


class TrainingError(RuntimeError):
    """Training went wrong in a way the config can change (a loss that diverged); ``str()`` names the step and
    what to try."""


class SchedulerError(RuntimeError):
    """The scheduler cannot run the job as asked; ``str()`` names the setting and what to do; ``scheduler``: the
    scheduler's own name for itself (its ``Scheduler.label``: the error's kind is ``<label> error``)."""

    def __init__(self, message: str, scheduler: str = "scheduler") -> None:
        super().__init__(message)
        self.scheduler = scheduler


class WorkerFailure(RuntimeError):
    """A worker (or agent) failed; ``str()`` names the rank and the error, in one line. ``fault``: the cause
    was outside the job's own code and config (a process killed by a signal, an agent lost), so the same job
    may succeed when run again (``sweep.retries``)."""

    def __init__(self, message: str, fault: bool = False) -> None:
        super().__init__(message)
        self.fault = fault


_KINDS = ((ConfigError, "config error"), (PlanError, "plan error"), (CheckpointError, "checkpoint error"),
          (TrackingError, "tracking error"), (DataError, "data error"), (TrainingError, "training error"),
          (SchedulerError, "scheduler error"), (WorkerFailure, "job failed"))


_TYPE_WORDS = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "String": "a string"}


def wrong_type(exc: BaseException) -> Optional[str]:
    """OmegaConf's refusal of a value the schema types otherwise, as ``key='value' is not allowed; expected an
    integer`` (None for any other error)."""
    full_key = getattr(exc, "full_key", None)
    m = re.search(r"Value '(.*)' of type '\w+' could not be converted to (\w+)", first_line(exc))
    if not (full_key and m):
        return None
    return f"{full_key}={m.group(1)!r} is not allowed; expected {_TYPE_WORDS.get(m.group(2), m.group(2))}"


def first_line(exc: BaseException) -> str:
    """The first non-empty line of ``exc``'s message ('' when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _original(text: str) -> str:
    """The error a DataLoader worker raised, out of the "Caught X in DataLoader worker process N" wrapper
    (its last line, ``module.Class: message``), without the class."""
    last = [ln for ln in text.strip().splitlines() if ln.strip()][-1]
    head, sep, rest = last.partition(": ")
    return rest if sep and " " not in head else last


def disk_full(exc: BaseException, folder: Optional[str] = None) -> Optional[str]:
    """The line for a write that found its device full (``ENOSPC``, ``EDQUOT``), naming the path (the file,
    else ``folder``, where the error does not say); else None."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        where = exc.filename or folder or "a file"
        return (f"no space left on the device of {where} ({os.strerror(exc.errno)}{_free_at(where)}); free space "
                "there, then run again")
    return None


def _free_at(where: str) -> str:
    """``, N KiB free`` on the device of ``where`` (its nearest existing folder); empty where unknown."""
    import shutil

    path = os.path.abspath(where) if "://" not in where and where != "a file" else None
    while path and not os.path.isdir(path):
        path = os.path.dirname(path) if os.path.dirname(path) != path else None
    try:
        return f", {shutil.disk_usage(path).free // 1024} KiB free" if path else ""
    except OSError:
        return ""


def one_line(exc: BaseException) -> str:
    """``<kind>: <message>`` for the runner's own errors, ``error: <message>`` for any other (the class
    name and traceback go to the run's log file, not the user's line)."""
    full = disk_full(exc)
    if full:
        return f"disk full: {full}"
    kind = next((name for cls, name in _KINDS if isinstance(exc, cls)), "unexpected error")
    if isinstance(exc, SchedulerError):
        kind = f"{exc.scheduler} error"
    text = str(exc)
    message = _original(text) if text.startswith("Caught ") and "Original Traceback" in text else first_line(exc)
    return f"{kind}: {message or type(exc).__name__}"
