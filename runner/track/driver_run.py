"""A job's MLflow run as its driver holds it (:class:`DriverRun`): the job's
:class:`runner.track.mlflow_run.MlflowRun`, and what a driver adds to it (multi-host opening, this host's system
metrics, the earlier run a resumed point replaces).

What the run records is given to it as data (:class:`RunRecord`: its name, parent, tags, artifacts,
datasets), made by the launch stage when the run opens (:func:`runner.launch.job.job_run.run_record`). Rank 0
never opens or ends it (it appends its reports to the run folder's event log); ``mode=plan`` reports through
the same log from the driver's own process. A plain torchrun, without a driver, has rank 0's process hold
the job's ``MlflowRun`` (:func:`runner.track.mlflow_run.torchrun_run`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from runner.runtime import rundir
from runner.track import store
from runner.track.mlflow_run import MlflowRun
from runner.track.system import start_system_metrics

if TYPE_CHECKING:
    from runner.config.schema import TrackingSchema


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

    def __init__(self, tracking: TrackingSchema, job: JobShape, run_dir: Path, config: Dict[str, Any], port: int,
                 record: Callable[[], RunRecord], static_rendezvous: bool = False) -> None:
        self.tracking, self.job, self.run_dir, self.config, self.port = tracking, job, run_dir, config, port
        self._record = record
        self.uri = store.tracking_uri(tracking.uri)
        self.multi_host = job.node_rank is not None
        self.static = static_rendezvous  # rank 0 is on node 0 (a Slurm job): node 0 opens the run at once
        self._run = run = MlflowRun(run_dir, self.uri)  # open, deliver, end
        self.replaces: Optional[str] = None  # the run of this folder's earlier job (a point run again)
        # the run's own, as MlflowRun does them: deliver, report_last, add_to_note, stop_system_metrics (this host's
        # last samples, logged before the run ends), end (False: the store is unreachable and the ending is kept in
        # the run folder for ``python -m runner sync``; this host's system metrics stopped first)
        self.deliver, self.report_last, self.add_to_note = run.deliver, run.report_last, run.add_to_note
        self.stop_system_metrics, self.end = run.stop_system_metrics, run.end

    @property
    def run_id(self) -> Optional[str]:
        return self._run.run_id

    @property
    def opened(self) -> bool:
        """Whether this driver opened the run (in the store, or kept while the store is away)."""
        return self._run.opened

    def rank0_here(self) -> bool:
        if self.static:
            return self.job.node_rank == 0
        return (self.run_dir / rundir.PIDS / "rank0.pid").exists()

    @property
    def opens_early(self) -> bool:
        """Whether this driver opens the run while its workers start (it knows rank 0 is on its host)."""
        return not self.multi_host or (self.static and self.rank0_here())

    def open(self) -> None:
        """Create the run (its folder's ``run.json`` records it) with what its record says, start the system
        metrics."""
        record = self._record()
        run_id = self._run.open(self.tracking.experiment, self.config, record.name, record.parent_run_id, record.tags,
                                 {"port": self.port})
        self._run.artifacts(record.artifacts)
        if run_id is None:  # the store is away: the run is kept in the folder
            return
        if self.replaces and record.parent_run_id:
            _retire(self.uri, self.replaces, record.parent_run_id, run_id)
        if self.job.verbose or not self._run.in_sweep:  # a sweep's point: its one line comes at its end
            line = f"[runner] MLflow run {self.run_id} | run folder {self.run_dir}"  # over a plan's count line, on
            print(f"\r{line}\x1b[K" if sys.stdout.isatty() else line, flush=True)  # a terminal (plan_beside)
        self._run.system = self._system_metrics(run_id, self.job.node_rank or 0)
        if record.datasets:
            from runner.track.inputs import log_datasets

            try:
                log_datasets(self.uri, run_id, record.datasets)
            except Exception as exc:  # the data itself was checked before launch; its record is not worth the run
                logging.getLogger("runner").warning("datasets not logged: %s", exc, exc_info=True)

    def _system_metrics(self, run_id: str, node: int) -> Any:
        return start_system_metrics(self.tracking, self.job.mode, self.job.nodes, self.uri, run_id, node)

    def pump(self) -> None:
        """Write rank 0's new reports (metrics, tags, plan artifacts) to the run."""
        if self.multi_host and not self.opened and self.rank0_here():
            self.open()
        if self.opened:
            self._run.deliver()
        if self._run.system is None and self.static and self.job.node_rank:  # node k: once node 0 opened it
            info = rundir.read_json(self.run_dir.parent / rundir.RUN_INFO)
            if info and info.get("run_id"):
                monitor = self._system_metrics(info["run_id"], self.job.node_rank)
                self._run.system = monitor or False  # off: asked once

    def ensure_on_record(self) -> None:
        """A refused job is still on record, as FAILED (on a multi-host job: by node 0's driver)."""
        if not self.opened and (not self.multi_host or self.rank0_here() or self.job.node_rank == 0):
            self.open()


def record_requeued(run_dir: Path, job: str, attempt: int, scheduler: str = "the scheduler") -> None:
    """The run of the attempt before ``attempt``, stopped when ``scheduler`` requeued job ``job`` after a lost node (it
    ended KILLED, as a cancelled job does): FAILED, saying so. The new attempt gets its own run."""
    info = rundir.read_json(run_dir / rundir.RUN_INFO) or {}
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
