"""An MLflow run's life, the same for every way a job runs: opened once (the resolved config as params, the
job's tags), fed the run folder's event log, ended with the job's status.

Rank 0 only ever appends its reports to the run folder's ``events.jsonl`` (:class:`runner.track.reporter.Reporter`);
a :class:`RunLife` delivers them. Its owner is the driver (``python -m runner``: one per job, see
:class:`runner.launch.mlflow_run.MlflowRun`, which adds what a driver knows: sweeps, Slurm, system metrics) or,
under a plain ``torchrun`` with no driver, rank 0's own process (:func:`torchrun_run`), which delivers from a
thread. Either way a store that is away keeps the reports and the ending in the run folder for
``python -m runner sync``, and training never waits for the store.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional

from runner.runtime import rundir
from runner.track import store
from runner.track.events import EventLog, EventPump
from runner.track.sync import end_or_keep

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig


class RunLife:
    """One job's MLflow run: :meth:`open`, :meth:`deliver` (or :meth:`deliver_every`), :meth:`end` once."""

    def __init__(self, run_dir: Path, uri: str) -> None:
        self.run_dir, self.uri = run_dir, uri
        self.run_id: Optional[str] = None
        self.pump: Optional[EventPump] = None
        self._lock = threading.Lock()  # one delivery at a time
        self._stop: Optional[threading.Event] = None
        self._thread: Optional[threading.Thread] = None

    def open(self, cfg: RunnerConfig, config: Mapping[str, Any], name: str, parent: Optional[str],
             tags: Mapping[str, Any], record: Optional[Dict[str, Any]] = None) -> str:
        """Create the run RUNNING and record it in the run folder's ``run.json`` (with ``record``'s entries)."""
        self.run_id = store.open_job_run(self.uri, cfg, config, name, parent, tags)
        self.pump = EventPump(self.run_dir / rundir.EVENTS, self.uri, self.run_id)
        rundir.write_json(self.run_dir / rundir.RUN_INFO,
                          {"tracking_uri": self.uri, "run_id": self.run_id, **(record or {})})
        return self.run_id

    def deliver(self) -> bool:
        """Write rank 0's new reports to the run; True when the store has all of them."""
        with self._lock:
            return self.pump() if self.pump is not None else True

    def deliver_every(self, seconds: float) -> None:
        """Deliver from a thread every ``seconds`` until :meth:`end` (a process that trains meanwhile)."""
        self._stop = threading.Event()

        def loop(stop: threading.Event) -> None:
            while not stop.wait(seconds):
                self.deliver()

        self._thread = threading.Thread(target=loop, args=(self._stop,), name="run-delivery", daemon=True)
        self._thread.start()

    def report_last(self, files: Any, artifact_path: str) -> None:
        """Files made once every rank has ended (the plan's chart), appended to the run folder's event log as
        rank 0's last report: they reach the run as the others do (from the folder by ``sync`` in an outage)."""
        log = EventLog(self.run_dir / rundir.EVENTS)
        log.artifacts(list(files), artifact_path)
        log.close()

    def end(self, status: str, error: Optional[str] = None) -> bool:
        """Deliver what is left and end the run; False when the store is unreachable and the ending is kept
        in the run folder for ``python -m runner sync``."""
        if self._stop is not None and self._thread is not None:
            self._stop.set()
            self._thread.join()
        if self.run_id is None:
            return True
        with self._lock:
            return end_or_keep(self.run_dir, self.pump, self.uri, self.run_id, status, error)


def torchrun_run(cfg: RunnerConfig, run_dir: Path) -> RunLife:
    """Rank 0's run under a plain torchrun: opened now, delivered every 2 s (as a driver does) while it trains."""
    from omegaconf import OmegaConf

    # an earlier torchrun job in this folder: its reports and run stay its own (only rank 0 writes these files)
    rundir.set_aside_previous(run_dir, (rundir.RUN_INFO, rundir.EVENTS, rundir.DELIVERED, rundir.RESULTS))
    life = RunLife(run_dir, store.tracking_uri(cfg))
    life.open(cfg, OmegaConf.to_container(cfg), store.default_run_name(cfg), None, {"runner.launcher": "torchrun"})
    life.deliver_every(2.0)
    return life
