"""Where a job's nodes run: the one interface everything scheduler-specific sits behind.

A :class:`Scheduler` answers every question the rest of the runner has about where a job runs: whether this
process is one of a scheduler's tasks (and that task's node, rendezvous and run folder), what runs before
anything is submitted, how a stop ends the job, the run's tags, whether rank 0 is known to be on node 0
(a static rendezvous), which signals it sends early, and what a stopped sweep cancels. Two implement it:
:mod:`.local` (this host's agents, nodes emulated or one host of a multi-host job under torch elastic) and
:mod:`.slurm` (a Slurm job step, one task per node, and ``hydra/launcher=slurm``'s submission). A job's
scheduler is resolved once, where it takes its place (:func:`runner.launch.job.hydra_call.run_job`), and handed
down from there.

Each module of this package that defines a ``SCHEDULER`` is registered, by its name, when the package is first
asked (no list to edit): a new scheduler is its module here (what it must write: :class:`Scheduler`'s doc), its
Hydra launcher plugin and conf file under ``conf/hydra/launcher/`` where it submits a sweep's points, and its
test (docs/architecture.md). Outside this package nothing tests a scheduler's or a launcher's name
(``tests/launch/test_schedulers.py``).
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from runner.config.errors import ConfigError
from runner.config.place import Place

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from runner.config.schema import ClusterSchema


class Task:
    """This process as one task of a scheduler's job (one per node)."""

    node_rank: int
    restarts: int  # times the scheduler started the job again (a lost node)
    shown_id: str  # the job as the scheduler's own commands show it
    label: str = "the scheduler"  # how messages name its scheduler (``Scheduler.label``)


class Scheduler:
    """Where a job's nodes run (see the module doc); the defaults are this host's (:mod:`.local`).

    A new scheduler writes ``name`` and ``label``; ``task`` (this process as one of its tasks) and ``take`` (the
    job's place as that task) where its jobs run as tasks (``has_tasks``); ``launcher`` where a Hydra launcher
    submits a sweep's points to it; and, where they differ from this host's, ``static_rendezvous``,
    ``early_signals``, ``node_run_folder``, ``run_tags``, ``stop_outcome``, ``check_submission``, ``cancel_pending``,
    ``run_folder_name`` and ``allocated_memory``."""

    name = ""
    label = "the scheduler"
    """How messages and tags name it (``Slurm``)."""
    launcher: Optional[str] = None
    """The ``hydra/launcher`` choice that submits a command's jobs to it (None: Hydra's local launchers)."""
    has_tasks = False
    """Its jobs run as its tasks (one per node): naming it while this process is none of them is refused."""
    static_rendezvous = False
    """Rank 0 is on node 0 (torch elastic's static rendezvous), so node 0's process opens the run at once."""
    early_signals: Tuple[str, ...] = ()
    """Signals it sends every process of a job ahead of a stop (Slurm's time-limit warning): the agents ignore
    them, from before they import torch (:func:`early_signals`)."""

    def task(self) -> Optional[Task]:
        """This process as one of the scheduler's tasks, from its environment; None when it is not one."""
        return None

    def no_task(self) -> Exception:
        """The error when ``cluster.scheduler`` names this scheduler but this process is not one of its tasks."""
        return ConfigError("cluster.scheduler", self.name, "auto where this process is not a scheduler's task")

    @property
    def points_here(self) -> bool:
        """A sweep's points run in this process or its joblib workers (so the next one can be prepared here, and a
        grid of plan-only points planned together before they start): a scheduler no launcher submits to."""
        return self.launcher is None

    def take(self, mode: str, cluster: ClusterSchema, checkpoint_dir: Optional[str], run_folder: Path,
             task: Task) -> Tuple[Path, bool, Place]:
        """Take the place of a job of ``mode`` on ``cluster`` (its ``train.checkpoint.dir``: ``checkpoint_dir``)
        as ``task``: the node's run folder, whether the job runs elsewhere (a plan or data job runs in node 0's
        task only), and the job's place (:class:`runner.config.place.Place`: node rank, rendezvous, shared
        checkpoint folder), which the job's config then carries."""
        return run_folder, False, Place(self.name)

    def node_run_folder(self, run_folder: Path, node_rank: Optional[int]) -> Path:
        """Where node ``node_rank`` keeps its files (the job's run folder, or a folder in it)."""
        return run_folder

    def run_tags(self) -> Dict[str, str]:
        """The MLflow tags of a run on it."""
        return {}

    def stop_outcome(self, signame: str) -> Tuple[str, str]:
        """``(status, line)`` of a job stopped by ``signame``."""
        return "KILLED", f"stopped by {signame}"

    def check_submission(self, hydra: DictConfig, mode: str, cluster: ClusterSchema, store_uri: Optional[str]) -> None:
        """What must hold before a point of ``mode`` on ``cluster`` is submitted (``hydra``: Hydra's config of the
        point, its launcher and sweep folder; ``store_uri``: ``tracking.uri``); raises :class:`SchedulerError` in
        one line."""

    def cancel_pending(self) -> None:
        """A stopped sweep: the points the scheduler has not started yet are cancelled."""

    def run_folder_name(self) -> Optional[str]:
        """The run folder (under outputs/runs) every task of one job step shares; None: a dated one."""
        return None

    def allocated_memory(self) -> Optional[Tuple[int, str]]:
        """The host memory its allocation gives this node, in bytes, and what says so; None where it sets none."""
        return None


_REGISTRY: Dict[str, Scheduler] = {}


def registered() -> Dict[str, Scheduler]:
    """Every scheduler of this package, by name (its modules imported once)."""
    if not _REGISTRY:
        for info in pkgutil.iter_modules(__path__):
            found = getattr(importlib.import_module(f"{__name__}.{info.name}"), "SCHEDULER", None)
            if isinstance(found, Scheduler):
                _REGISTRY[found.name] = found
    return _REGISTRY


def names() -> List[str]:
    """``cluster.scheduler``'s allowed values: ``auto``, every scheduler's name, and ``none`` (this host's)."""
    return ["auto", *sorted(registered()), "none"]


def named(name: str) -> Scheduler:
    """The scheduler ``cluster.scheduler`` names (``auto``: this host's, until a task says otherwise)."""
    found = registered().get("local" if name in ("auto", "none") else name)  # none: this host's, as before
    if found is None:
        raise ConfigError("cluster.scheduler", name, ", ".join(names()))
    return found


def allocations() -> List[Tuple[int, str]]:
    """The memory each scheduler's allocation gives this node (:meth:`Scheduler.allocated_memory`), for
    :func:`runner.runtime.cores.job_memory`."""
    return [m for m in (s.allocated_memory() for s in registered().values()) if m is not None]


def task_of(name: str) -> Tuple[Scheduler, Optional[Task]]:
    """The scheduler this job runs on and this process's task of it: ``cluster.scheduler`` (``name``)'s, or with
    ``auto`` the first whose task this process is (this host's when none)."""
    if name != "auto":
        scheduler = named(name)
        task = scheduler.task()
        if task is None and scheduler.has_tasks:
            raise scheduler.no_task()
        return scheduler, task
    return next(((s, found) for s in registered().values() if (found := s.task()) is not None), (named("local"), None))


def early_signals() -> List[int]:
    """Every scheduler's early signals (:attr:`Scheduler.early_signals`), as numbers."""
    import signal

    return sorted({int(getattr(signal, name)) for s in registered().values() for name in s.early_signals})


def launchers() -> List[str]:
    """The ``hydra/launcher`` choices that submit a sweep's points to a scheduler (``slurm``)."""
    return sorted(s.launcher for s in registered().values() if s.launcher is not None)


def of_command(args: Sequence[str]) -> Scheduler:
    """The scheduler a command's ``hydra/launcher=<choice>`` submits its jobs to (this host's by default)."""
    chosen = {a.split("=", 1)[1] for a in args if a.startswith("hydra/launcher=")}
    return next((s for s in registered().values() if s.launcher is not None and s.launcher in chosen), named("local"))


def run_folder_name() -> Optional[str]:
    """A single run's folder shared by every task of one job step, when this process is one (else None)."""
    return next((name for s in registered().values() if (name := s.run_folder_name())), None)


def in_a_task() -> bool:
    """Whether this process is one of a scheduler's tasks (its environment says so), whatever the config says."""
    return any(s.has_tasks and s.task() is not None for s in registered().values())

