"""A job's MLflow run (:class:`MlflowRun`), the same for every way a job runs: opened once (the resolved config as
params, the job's tags), fed the run folder's event log, ended with the job's status.

Rank 0 only ever appends its reports to the run folder's ``events.jsonl`` (:class:`runner.track.reporter.Reporter`);
a :class:`MlflowRun` delivers them. Its owner is the driver (``python -m runner``: one per job, see
:class:`runner.track.driver_run.DriverRun`, which adds what a driver knows: sweeps, Slurm, system metrics) or,
under a plain ``torchrun`` with no driver, rank 0's own process (:func:`torchrun_run`), which delivers from a
thread. Either way a store that is away keeps the reports and the ending in the run folder for
``python -m runner sync``, and training never waits for the store.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence, cast

from runner.runtime import rundir, signals
from runner.runtime.folder_lock import taking_turns
from runner.track import store
from runner.track.events import EventLog, EventPump
from runner.track.sweep_points import sweep_of
from runner.track.sync import end_or_keep, open_kept

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig


class MlflowRun:
    """One job's MLflow run: :meth:`open`, :meth:`deliver` (or :meth:`deliver_every`), :meth:`end` once.

    A run opened while a tracking server is away is *kept*: ``run.json`` records what the run is to be created
    with (``pending``), its params go to the event log with the reports, and the job goes on. Each later
    delivery tries to create it (every few seconds at most); ``python -m runner sync`` does it after the job.
    """

    RETRY_S = 5.0  # how often a kept run's creation is tried again while the job runs

    def __init__(self, run_dir: Path, uri: str) -> None:
        self.run_dir, self.uri = run_dir, uri
        self.run_id: Optional[str] = None
        self.pending: Optional[Dict[str, Any]] = None  # the run to create once the store is back
        self.pump: Optional[EventPump] = None
        self._lock = threading.Lock()  # one delivery at a time
        self._stop: Optional[threading.Event] = None
        self._thread: Optional[threading.Thread] = None
        self._next_try = 0.0
        self.system: Any = None  # this host's system-metrics monitor (False: none, asked once); stopped at the end
        # a sweep's point: a store away is said once for the sweep, with one sync command, not by each point
        self.in_sweep = sweep_of(run_dir) is not None

    @property
    def opened(self) -> bool:
        """Whether :meth:`open` ran: the run is in the store, or kept for when the store is back."""
        return self.run_id is not None or self.pending is not None

    def open(self, experiment: str, config: Mapping[str, Any], name: str, parent: Optional[str],
             tags: Mapping[str, Any], record: Optional[Dict[str, Any]] = None) -> Optional[str]:
        """Create the run RUNNING in ``experiment`` with ``config`` as its params, and record it in the run folder's
        ``run.json`` (with ``record``'s entries); None when the server is away and the run is kept instead."""
        # a stop signal meanwhile is raised once the run is recorded (run.json): a run created in the store but not
        # known here would stay RUNNING
        with signals.uninterrupted():
            params = store.flatten(config)
            try:
                self.run_id = store.start_run(self.uri, experiment, name, parent, tags)
            except Exception as exc:
                if not store.is_outage(self.uri, exc):
                    raise
                self.pending = {"experiment": experiment, "name": name, "tags": store.creation_tags(
                    name, parent, {**tags, "runner.record_id": uuid.uuid4().hex})}  # found by it if created twice
                rundir.write_json(self.run_dir / rundir.RUN_INFO,
                                  {"tracking_uri": self.uri, "run_id": None, "pending": self.pending, **(record or {})})
                self.report_last([], None, params=params)
                self._next_try = time.monotonic() + self.RETRY_S
                if not self.in_sweep:
                    print(f"[runner] tracking store {self.uri} unreachable ({store.outage_reason(exc)}): the job goes "
                          "on; its MLflow run is created when the store is back (or by python -m runner sync "
                          f"{self.run_dir})", flush=True)
                return None
            self.pump = EventPump(self.run_dir / rundir.EVENTS, self.uri, self.run_id)
            rundir.write_json(self.run_dir / rundir.RUN_INFO,
                              {"tracking_uri": self.uri, "run_id": self.run_id, **(record or {})})
            try:
                store.log_params(self.uri, self.run_id, params)
            except Exception as exc:
                if not store.is_outage(self.uri, exc):
                    raise
                self.report_last([], None, params=params)  # delivered with the reports once the store is back
            return self.run_id

    def _create_kept(self) -> bool:
        """Create the kept run now (at most every few seconds); True once it is in the store."""
        if self.pending is None:
            return True
        if time.monotonic() < self._next_try:
            return False
        try:
            self.run_id = open_kept(self.run_dir, self.uri, self.pending)
        except Exception:  # noqa: BLE001 - still away
            self._next_try = time.monotonic() + self.RETRY_S
            return False
        self.pending = None
        self.pump = EventPump(self.run_dir / rundir.EVENTS, self.uri, self.run_id)
        print(f"[runner] tracking store {self.uri} is back: MLflow run {self.run_id} created for {self.run_dir}",
              flush=True)
        return True

    def deliver(self) -> bool:
        """Write rank 0's new reports to the run; True when the store has all of them."""
        with self._lock, taking_turns(self.run_dir, wait=False) as turn:
            if not turn:  # a runner sync delivers this folder now: what it delivers is not sent again
                return False
            if not self._create_kept():
                return False
            return self.pump() if self.pump is not None else True

    def deliver_every(self, seconds: float) -> None:
        """Deliver from a thread every ``seconds`` until :meth:`end` (a process that trains meanwhile)."""
        self._stop = threading.Event()

        def loop(stop: threading.Event) -> None:
            while not stop.wait(seconds):
                self.deliver()

        self._thread = threading.Thread(target=loop, args=(self._stop,), name="run-delivery", daemon=True)
        self._thread.start()

    def artifacts(self, files: Sequence[Path], artifact_path: Optional[str] = None) -> None:
        """Log ``files`` to the run now; while the store is away they wait in the event log with the reports."""
        try:
            if self.run_id is not None and (self.pump is None or self.pump.down is None):
                store.log_artifacts(self.uri, self.run_id, list(files), artifact_path)
                return
        except Exception as exc:
            if not store.is_outage(self.uri, exc):
                raise
        self.report_last(files, artifact_path)

    def add_to_note(self, section: str) -> None:
        """Append ``section`` to the run's Description (best effort: an outage leaves it as it was)."""
        if self.pending is not None:
            tags = self.pending["tags"]
            tags["mlflow.note.content"] = f"{tags.get('mlflow.note.content', '')}\n\n{section}".strip()
            rundir.update_json(self.run_dir / rundir.RUN_INFO, pending=self.pending)
            return
        with contextlib.suppress(Exception):  # an outage: the run keeps its Description without the section
            note = store.NOTE_OF.get(self.run_id or "")
            if note is None:
                note = store.client(self.uri).get_run(self.run_id).data.tags.get("mlflow.note.content", "")
            note = f"{note}\n\n{section}".strip()
            store.set_tags(self.uri, self.run_id, {"mlflow.note.content": note})
            store.NOTE_OF[self.run_id or ""] = note

    def report_last(self, files: Sequence[Path], artifact_path: Optional[str],
                    params: Optional[Mapping[str, str]] = None) -> None:
        """Files made once every rank has ended (the plan's chart), or ``params``, appended to the run folder's
        event log as rank 0's last report: they reach the run as the others do (from the folder by ``sync``
        in an outage)."""
        log = EventLog(self.run_dir / rundir.EVENTS)
        if params:
            log.params(params)
        if files:
            log.artifacts(list(files), artifact_path)
        log.close()

    def stop_system_metrics(self) -> None:
        """This host's last system-metric samples, logged (before the run ends); none are taken after."""
        if self.system:
            self.system.stop()
        self.system = False

    def end(self, status: str, error: Optional[str] = None) -> bool:
        """Deliver what is left and end the run; False when the store is unreachable and the ending is kept
        in the run folder for ``python -m runner sync``."""
        if self._stop is not None and self._thread is not None:
            self._stop.set()
            self._thread.join()
        self.stop_system_metrics()
        if not self.opened:
            return True
        with self._lock, taking_turns(self.run_dir):  # the last delivery waits for a sync's turn to end
            self._next_try = 0.0  # one more try to create a kept run
            created = self._create_kept()
            return end_or_keep(self.run_dir, self.pump if created else None, self.uri, self.run_id, status, error,
                               say=not self.in_sweep)


def torchrun_run(cfg: RunnerConfig, run_dir: Path) -> MlflowRun:
    """Rank 0's run under a plain torchrun: opened now, delivered every 2 s (as a driver does) while it trains."""
    from omegaconf import OmegaConf

    # an earlier torchrun job in this folder: its reports and run stay its own (only rank 0 writes these files)
    rundir.set_aside_previous(run_dir, (rundir.RUN_INFO, rundir.EVENTS, rundir.EVENTS_WRITER, rundir.DELIVERED,
                                         rundir.RESULTS))
    run = MlflowRun(run_dir, store.tracking_uri(cfg.tracking.uri))
    config = cast(Dict[str, Any], OmegaConf.to_container(cfg))  # the root is a mapping
    run.open(cfg.tracking.experiment, config, store.default_run_name(cfg.tracking.run_name, config), None,
             {"runner.launcher": "torchrun"})
    (run_dir / rundir.RESOLVED).write_text(OmegaConf.to_yaml(config))  # the config the ranks run, as a driver's
    run.artifacts([run_dir / rundir.RESOLVED])
    if run.run_id:  # this host's system metrics, as a driver records them
        from runner.track.system import start_system_metrics

        run.system = start_system_metrics(cfg.tracking, cfg.mode, cfg.cluster.nodes, run.uri, run.run_id,
                                          int(os.environ.get("GROUP_RANK", "0")))
    run.deliver_every(2.0)
    return run
