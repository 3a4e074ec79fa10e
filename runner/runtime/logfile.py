"""Agents' and workers' log lines and warnings go to the run's log file, never the terminal.

The terminal gets the runner's own lines (progress, the job's one line on failure); what torch, torch
elastic, TorchRec and FBGEMM log (restarts, "Received 15 death signal", deprecations) is appended to
``<run folder>/runner.log``, where Hydra's job log for the driver also goes.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from runner.runtime import run_files

_LIBRARIES = ("torch", "torchrec", "fbgemm_gpu")


def log_to_file(run_folder: Path, who: str, level: int = logging.WARNING) -> None:
    """Route every logger (torch's own terminal handlers included) and ``warnings`` to the run's log."""
    handler = logging.FileHandler(run_folder / run_files.LOG, delay=True)
    handler.setFormatter(logging.Formatter(f"[%(asctime)s][{who}][%(name)s][%(levelname)s] %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):  # a forked worker's copy of its agent's handler: closed, not left to the GC
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
    logging.raiseExceptions = False  # a log file on a full disk: the job's own line says so, not a traceback
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and name.split(".")[0] in _LIBRARIES:
            logger.handlers, logger.propagate = [], True  # torch installs terminal handlers of its own
    for logger in map(logging.getLogger, _LIBRARIES):
        logger.handlers, logger.propagate = [], True
        logger.setLevel(level)
    warnings.simplefilter("once")
    logging.captureWarnings(True)


def thread_errors_to_log(who: str) -> None:
    """Uncaught exceptions of this process go to the run's log, not the terminal: for a DataLoader worker
    process. Its fd-sharing thread (multiprocessing's ``resource_sharer``, which reports through
    ``sys.excepthook``) raises EOFError when its rank stops mid-receive, as a rank does when a peer fails;
    the job's one line must stay the only one on the terminal."""
    import sys
    import threading

    log = logging.getLogger(f"runner.{who}")

    def report(exc_type: type, exc: BaseException, _tb: object = None) -> None:
        log.warning("%s: %s", exc_type.__name__, exc)

    sys.excepthook = report
    threading.excepthook = lambda args: report(args.exc_type, args.exc_value or args.exc_type())
