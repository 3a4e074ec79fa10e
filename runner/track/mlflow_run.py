"""A job's MLflow run (:class:`MlflowRun`), the same for every way a job runs: opened once (the resolved config as
params, the job's tags), fed the run folder's event log, ended with the job's status; and its two holders.

Rank 0 only ever appends its reports to the run folder's ``events.jsonl`` (:class:`runner.track.reporter.Reporter`);
a :class:`MlflowRun` delivers them. Its holder is the driver (``python -m runner``: one per job, :class:`DriverRun`,
which adds what a driver knows: multi-host opening, this host's system metrics, the earlier run a resumed point
replaces; ``mode=plan`` reports through the same log from the driver's own process) or, under a plain ``torchrun``
with no driver, rank 0's own process (:func:`torchrun_run`), which delivers from a thread. What the driver's run
records is given to it as data (:class:`RunRecord`), made by the launch stage when the run opens
(:func:`runner.launch.job.run_record.run_record`). Either way a store that is away keeps the reports and the ending
in the run folder for ``python -m runner sync``, and training never waits for the store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence

from runner.runtime import run_files, signals
from runner.runtime.folder_lock import taking_turns
from runner.track import store
from runner.track.events import EventLog, EventPump
from runner.track.inputs import log_datasets
from runner.track.sweep_points import sweep_of
from runner.track.sync import end_or_keep, open_kept
from runner.track.system import start_system_metrics

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig, TrackingSchema


class MlflowRun:
    """One job's MLflow run: :meth:`open`, :meth:`deliver` (or :meth:`deliver_every`), :meth:`end` once.

    A run opened while a tracking server is away is *kept*: ``run.json`` records what the run is to be created
    with (``pending``), its params go to the event log with the reports, and the job goes on. Each later
    delivery tries to create it (every few seconds at most); ``python -m runner sync`` does it after the job.
    """

    RETRY_S = 5.0  # how often a kept run's creation is tried again while the job runs

    def __init__(self, run_folder: Path, uri: str) -> None:
        self.run_folder, self.uri = run_folder, uri
        self.run_id: Optional[str] = None
        self.pending: Optional[Dict[str, Any]] = None  # the run to create once the store is back
        self.pump: Optional[EventPump] = None
        self._lock = threading.Lock()  # one delivery at a time
        self._stop: Optional[threading.Event] = None
        self._thread: Optional[threading.Thread] = None
        self._next_try = 0.0
        self.system: Any = None  # this host's system-metrics monitor (False: none, asked once); stopped at the end
        # a sweep's point: a store away is said once for the sweep, with one sync command, not by each point
        self.in_sweep = sweep_of(run_folder) is not None

    @property
    def opened(self) -> bool:
        """Whether :meth:`open` ran: the run is in the store, or kept for when the store is back."""
        return self.run_id is not None or self.pending is not None

    def open(self, experiment: str, config: Mapping[str, Any], name: str, parent: Optional[str],
             tags: Mapping[str, Any], fields: Optional[Dict[str, Any]] = None) -> Optional[str]:
        """Create the run RUNNING in ``experiment`` with ``config`` as its params, and write it in the run folder's
        ``run.json`` (with ``fields``' entries); None when the server is away and the run is kept instead."""
        # a stop signal meanwhile is raised once the run is written (run.json): a run created in the store but not
        # known here would stay RUNNING
        with signals.uninterrupted():
            params = store.flatten(config)
            tags = {**tags, **store.new_record()}  # the run is found by it where an answer was lost
            try:
                self.run_id = store.start_run(self.uri, experiment, name, parent, tags)
            except Exception as exc:
                if not store.is_outage(self.uri, exc):
                    raise
                self.pending = {"experiment": experiment, "name": name,
                                "tags": store.creation_tags(name, parent, tags)}
                run_files.write_json(self.run_folder / run_files.RUN_INFO,
                                  {"tracking_uri": self.uri, "run_id": None, "pending": self.pending, **(fields or {})})
                self.report_last([], None, params=params)
                self._next_try = time.monotonic() + self.RETRY_S
                if not self.in_sweep:
                    print(f"[runner] tracking store {self.uri} unreachable ({store.outage_reason(exc)}): the job goes "
                          "on; its MLflow run is created when the store is back (or by python -m runner sync "
                          f"{self.run_folder})", flush=True)
                return None
            self.pump = EventPump(self.run_folder / run_files.EVENTS, self.uri, self.run_id)
            run_files.write_json(self.run_folder / run_files.RUN_INFO,
                              {"tracking_uri": self.uri, "run_id": self.run_id, **(fields or {})})
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
            self.run_id = open_kept(self.run_folder, self.uri, self.pending)
        except Exception:  # noqa: BLE001 - still away
            self._next_try = time.monotonic() + self.RETRY_S
            return False
        self.pending = None
        self.pump = EventPump(self.run_folder / run_files.EVENTS, self.uri, self.run_id)
        print(f"[runner] tracking store {self.uri} is back: MLflow run {self.run_id} created for {self.run_folder}",
              flush=True)
        return True

    def deliver(self) -> bool:
        """Write rank 0's new reports to the run; True when the store has all of them."""
        with self._lock, taking_turns(self.run_folder, wait=False) as turn:
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
            run_files.update_json(self.run_folder / run_files.RUN_INFO, pending=self.pending)
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
        log = EventLog(self.run_folder / run_files.EVENTS)
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
        with self._lock, taking_turns(self.run_folder):  # the last delivery waits for a sync's turn to end
            self._next_try = 0.0  # one more try to create a kept run
            created = self._create_kept()
            return end_or_keep(self.run_folder, self.pump if created else None, self.uri, self.run_id, status, error,
                               say=not self.in_sweep)


def torchrun_run(cfg: RunnerConfig, run_folder: Path) -> MlflowRun:
    """Rank 0's run under a plain torchrun: opened now, delivered every 2 s (as a driver does) while it trains."""
    from omegaconf import OmegaConf

    from runner.config.schema import resolved_mapping

    # an earlier torchrun job in this folder: its reports and run stay its own (only rank 0 writes these files)
    run_files.set_aside_previous(run_folder, (run_files.RUN_INFO, run_files.EVENTS, run_files.EVENTS_WRITER,
                                              run_files.DELIVERED, run_files.RESULTS))
    run = MlflowRun(run_folder, store.tracking_uri(cfg.tracking.uri))
    config = resolved_mapping(cfg)
    run.open(cfg.tracking.experiment, config, store.default_run_name(cfg.tracking.run_name, config), None,
             {"runner.launcher": "torchrun"})
    (run_folder / run_files.RESOLVED).write_text(OmegaConf.to_yaml(config))  # the config the ranks run, as a driver's
    run.artifacts([run_folder / run_files.RESOLVED])
    if run.run_id:  # this host's system metrics, as a driver records them
        run.system = start_system_metrics(cfg.tracking, cfg.mode, cfg.cluster.nodes, run.uri, run.run_id,
                                          int(os.environ.get("GROUP_RANK", "0")))
    run.deliver_every(2.0)
    return run


@dataclass(frozen=True)
class JobShape:
    """What a job's run needs to know of the job: its mode, its nodes and this host's node rank (null: every node
    here), and whether a sweep's point says its details (``sweep.verbose``)."""

    mode: str
    nodes: int
    node_rank: Optional[int]
    verbose: bool


@dataclass
class RunRecord:
    """What a job's run records when it opens: made by the launch stage, recorded here as it is."""

    name: str
    parent_run_id: Optional[str]
    tags: Dict[str, Any]
    artifacts: List[Path] = field(default_factory=list)
    datasets: List[Any] = field(default_factory=list)  # MLflow dataset inputs (``track.inputs``)


class DriverRun:
    """The job's MLflow run as its driver holds it: its :class:`MlflowRun`, opened once, fed rank 0's reports,
    ended with the job's status.

    On a real multi-host job (``cluster.node_rank`` set) every host runs a driver and c10d rendezvous puts
    rank 0 on any of them: only the driver that finds rank 0 on its host opens and writes the run. A Slurm
    job's static rendezvous puts rank 0 on node 0: node 0's task opens the run at once, the others never.
    ``record`` is called when the run opens (what it records is known then: e.g. whether the prewarmed
    agent took the job).
    """

    def __init__(self, tracking: TrackingSchema, job: JobShape, run_folder: Path, config: Dict[str, Any], port: int,
                 record: Callable[[], RunRecord], static_rendezvous: bool = False) -> None:
        self.tracking, self.job, self.run_folder, self.config, self.port = tracking, job, run_folder, config, port
        self._record = record
        self.uri = store.tracking_uri(tracking.uri)
        self.multi_host = job.node_rank is not None
        self.static = static_rendezvous  # rank 0 is on node 0 (a Slurm job): node 0 opens the run at once
        self.mlflow = MlflowRun(run_folder, self.uri)  # the run itself: its id, opened, delivered and ended
        self.replaces: Optional[str] = None  # the run of this folder's earlier job (a point run again)

    def rank0_here(self) -> bool:
        if self.static:
            return self.job.node_rank == 0
        return (self.run_folder / run_files.PIDS / "rank0.pid").exists()

    @property
    def opens_early(self) -> bool:
        """Whether this driver opens the run while its workers start (it knows rank 0 is on its host)."""
        return not self.multi_host or (self.static and self.rank0_here())

    def open(self) -> None:
        """Create the run (its folder's ``run.json`` records it) with what its record says, start the system
        metrics."""
        record = self._record()
        run_id = self.mlflow.open(self.tracking.experiment, self.config, record.name, record.parent_run_id, record.tags,
                                 {"port": self.port})
        self.mlflow.artifacts(record.artifacts)
        if run_id is None:  # the store is away: the run is kept in the folder
            return
        if self.replaces and record.parent_run_id:
            _retire(self.uri, self.replaces, record.parent_run_id, run_id)
        if self.job.verbose or not self.mlflow.in_sweep:  # a sweep's point: its one line comes at its end
            line = f"[runner] MLflow run {run_id} | run folder {self.run_folder}"  # over a plan's count line, on
            print(f"\r{line}\x1b[K" if sys.stdout.isatty() else line, flush=True)  # a terminal (plan_beside)
        self.mlflow.system = self._system_metrics(run_id, self.job.node_rank or 0)
        if record.datasets:
            try:
                log_datasets(self.uri, run_id, record.datasets)
            except Exception as exc:  # the data itself was checked before launch; its record is not worth the run
                logging.getLogger("runner").warning("datasets not logged: %s", exc, exc_info=True)

    def _system_metrics(self, run_id: str, node: int) -> Any:
        return start_system_metrics(self.tracking, self.job.mode, self.job.nodes, self.uri, run_id, node)

    def pump(self) -> None:
        """Write rank 0's new reports (metrics, tags, plan artifacts) to the run."""
        if self.multi_host and not self.mlflow.opened and self.rank0_here():
            self.open()
        if self.mlflow.opened:
            self.mlflow.deliver()
        if self.mlflow.system is None and self.static and self.job.node_rank:  # node k: once node 0 opened it
            info = run_files.read_json(self.run_folder.parent / run_files.RUN_INFO)
            if info and info.get("run_id"):
                monitor = self._system_metrics(info["run_id"], self.job.node_rank)
                self.mlflow.system = monitor or False  # off: asked once

    def ensure_on_record(self) -> None:
        """A refused job is still on record, as FAILED (on a multi-host job: by node 0's driver)."""
        if not self.mlflow.opened and (not self.multi_host or self.rank0_here() or self.job.node_rank == 0):
            self.open()


def mark_requeued(run_folder: Path, job: str, attempt: int, scheduler: str = "the scheduler") -> None:
    """The run of the attempt before ``attempt``, stopped when ``scheduler`` requeued job ``job`` after a lost node (it
    ended KILLED, as a cancelled job does): FAILED, saying so. The new attempt gets its own run."""
    info = run_files.read_json(run_folder / run_files.RUN_INFO) or {}
    if not info.get("run_id"):
        return
    with contextlib.suppress(Exception):  # the earlier run keeps its status; the new attempt runs all the same
        if store.client(info["tracking_uri"]).get_run(info["run_id"]).info.status in ("KILLED", "RUNNING"):
            store.end_run(info["tracking_uri"], info["run_id"], "FAILED",
                          f"{scheduler} requeued job {job} after it lost a node (attempt {attempt} follows)")


def _retire(uri: str, old: str, parent: str, new: str) -> None:
    """A sweep's point run again (a resumed sweep): its earlier run under the same parent is deleted (MLflow's
    soft delete, restorable from the UI's deleted runs), so that the parent keeps one child per point."""
    with contextlib.suppress(Exception):  # the earlier run stays; the new one is recorded all the same
        if store.client(uri).get_run(old).data.tags.get("mlflow.parentRunId") == parent:
            store.client(uri).delete_run(old)
            store.set_tags(uri, new, {"runner.replaces": old})
