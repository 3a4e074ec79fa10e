"""A job as a task of a Slurm job step: one task per node, each starting its node's elastic agent.

``hydra/launcher=slurm`` (one Slurm job per sweep point) and a hand-written ``srun python -m runner ...``
both land here. The node rank is ``SLURM_NODEID``; the rendezvous host is the job's first node, at the
address Slurm knows it by (``scontrol show node``'s ``NodeAddr``, never a silent fallback: a node that
rendezvoused with itself would form a world of one and wait); the port comes from the job id, so two jobs
on one host never collide. The agents use torch elastic's static rendezvous (``rank`` = node rank, as
torchrun does with ``--node-rank``), so rank 0 is always on node 0, whose task alone opens the MLflow run.
Other nodes keep their files in ``<run folder>/node<k>/``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

from runner.config.place import Place
from runner.config.schema import WORKER_MODES
from runner.launch.schedulers import Scheduler, Task
from runner.launch.schedulers.slurm_commands import LABEL, SlurmError, _scontrol, hostnames, node_address, slurm_command
from runner.runtime import rundir

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from runner.config.schema import ClusterSchema

TORCH_PORT = 29500  # torch's default rendezvous port; a job's port is this + its id modulo PORT_SPAN
PORT_SPAN = 2000


@dataclass(frozen=True)
class SlurmTask(Task):
    """This process as Slurm's task of a job step (what the environment says)."""

    job_id: str  # SLURM_JOB_ID: unique per array element too
    shown_id: str  # as squeue shows it: ``<array job>_<index>`` for an array element
    node_rank: int
    nodes: int
    tasks: int
    nodelist: str
    restarts: int = 0  # SLURM_RESTART_COUNT: times Slurm requeued the job (a lost node, scontrol requeue)
    label = LABEL  # not a field: how messages name the scheduler

    @classmethod
    def detect(cls, env: Mapping[str, str] = os.environ) -> Optional["SlurmTask"]:
        """The task, when this process runs in a Slurm job step (``srun``, or submitit's); else None."""
        if not all(k in env for k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_NODEID", "SLURM_NNODES")):
            return None
        array, index = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
        shown = f"{array}_{index}" if array and index else env["SLURM_JOB_ID"]
        return cls(env["SLURM_JOB_ID"], shown, int(env["SLURM_NODEID"]), int(env["SLURM_NNODES"]),
                   int(env.get("SLURM_NTASKS", env["SLURM_NNODES"])),
                   env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", "")),
                   int(env.get("SLURM_RESTART_COUNT", "0") or 0))

    @property
    def port(self) -> int:
        digits = re.sub(r"\D", "", self.job_id) or "0"
        return TORCH_PORT + int(digits) % PORT_SPAN

    def node_names(self) -> List[str]:
        return hostnames(self.nodelist)


NODE_DIR = "node{}"  # node k > 0 keeps its files in node<k>/ of the job's run folder


def adopt(c: ClusterSchema, checkpoint_dir: Optional[str], task: SlurmTask, run_dir: Path) -> Tuple[Place, Path]:
    """The job's place as the Slurm job gives it (one task per node, ``cluster.nodes`` nodes): node rank,
    rendezvous host and port; every node checkpoints into the job's folder (one distributed checkpoint) unless
    ``train.checkpoint.dir`` (``checkpoint_dir``) names one. Also this node's run folder."""
    if task.nodes != c.nodes:
        raise SlurmError(f"cluster.nodes={c.nodes} but Slurm job {task.shown_id} has {task.nodes} node(s) "
                             f"({task.nodelist}); ask Slurm for cluster.nodes nodes (sbatch -N {c.nodes}; "
                             "hydra/launcher=slurm does) or set cluster.nodes")
    if task.tasks != task.nodes:
        raise SlurmError(f"Slurm job {task.shown_id} runs {task.tasks} tasks on {task.nodes} node(s); the runner "
                             "needs one task per node (srun --ntasks-per-node=1): each task starts its node's "
                             "cluster.workers_per_node workers")
    shared = str(run_dir / rundir.CHECKPOINTS) if task.node_rank and not checkpoint_dir else None
    place = Place(SCHEDULER.name, task.node_rank, node_address(task.node_names()[0]),
                  c.master_port if c.master_port is not None else task.port, shared)
    return place, SCHEDULER.node_run_dir(run_dir, task.node_rank)


def _time_limit_reached(task: SlurmTask) -> bool:
    """Whether Slurm is ending the job for its time limit (its reason while it completes)."""
    try:
        return "TimeLimit" in slurm_command(["squeue", "-h", "-j", task.job_id, "-o", "%r"], timeout=10)
    except SlurmError:
        return False


def _limit_text(task: SlurmTask) -> str:
    try:
        m = re.search(r"\bTimeLimit=(\S+)", _scontrol("show", "job", task.job_id))
    except SlurmError:
        m = None
    return f" of {m.group(1)}" if m else ""


def on_time_limit_warning() -> None:
    """Slurm's early signal (SIGUSR2 ``hydra.launcher.signal_delay_s`` before the time limit): say so, go on."""
    def _say(signum: int, frame: Any) -> None:
        print("[runner] Slurm: the job's time limit is near (SIGUSR2); it will be stopped at the limit", flush=True)

    signal.signal(signal.SIGUSR2, _say)


class SlurmScheduler(Scheduler):
    """A Slurm job step, one task per node (see the module doc); ``hydra/launcher=slurm`` submits to it."""

    name = "slurm"
    label = LABEL
    launcher = "slurm"
    has_tasks = True
    static_rendezvous = True
    early_signals = ("SIGUSR2",)  # its time-limit warning, ``hydra.launcher.signal_delay_s`` ahead

    def task(self) -> Optional[SlurmTask]:
        task = SlurmTask.detect()
        if task is None and int(os.environ.get("SLURM_NNODES", "1")) > 1 and not _SAID:
            _SAID.append(True)
            print(f"[runner] warning: Slurm job {os.environ.get('SLURM_JOB_ID')} has {os.environ['SLURM_NNODES']} "
                  "nodes but this runner is not one of its step's tasks (no srun): every node of cluster.nodes runs "
                  "here; start it with srun --ntasks-per-node=1 (see experiments/train.sbatch)", flush=True)
        return task

    def allocated_memory(self) -> Optional[Tuple[int, str]]:
        with contextlib.suppress(ValueError):
            if os.environ.get("SLURM_MEM_PER_NODE"):  # MiB
                return int(os.environ["SLURM_MEM_PER_NODE"]) * 2**20, "Slurm's allocation (SLURM_MEM_PER_NODE)"
        return None

    def no_task(self) -> SlurmError:
        return SlurmError("cluster.scheduler=slurm but this process is not a task of a Slurm job step (no "
                              "SLURM_JOB_ID/SLURM_STEP_ID/SLURM_NODEID): start it with srun, or use "
                              "-m hydra/launcher=slurm")

    def take(self, mode: str, cluster: ClusterSchema, checkpoint_dir: Optional[str], run_dir: Path,
             task: Task) -> Tuple[Path, bool, Place]:
        """Signals as the command line has them (submitit's own handlers ignore SIGTERM) and a line on the
        time-limit warning; a training job's node rank, rendezvous and run folder taken from the job
        (:func:`adopt`)."""
        from runner.runtime import signals

        assert isinstance(task, SlurmTask)
        signals.install()
        on_time_limit_warning()
        if mode not in WORKER_MODES and task.node_rank > 0:
            print(f"[runner] node {task.node_rank}: mode={mode} runs in node 0's task only", flush=True)
            return run_dir, True, Place(self.name)
        if mode in WORKER_MODES:
            place, run_dir = adopt(cluster, checkpoint_dir, task, run_dir)
            return run_dir, False, place
        return run_dir, False, Place(self.name)  # the run's tags say where it ran

    def node_run_dir(self, run_dir: Path, node_rank: Optional[int]) -> Path:
        """Node 0 keeps the job's run folder; another node keeps its files in ``node<k>/``."""
        return run_dir / NODE_DIR.format(node_rank) if node_rank else run_dir

    def run_tags(self) -> Dict[str, str]:
        task = SlurmTask.detect()
        if task is None:
            return {}
        return {"runner.scheduler": self.name, "runner.slurm_job_id": task.shown_id,
                "runner.slurm_nodes": ",".join(task.node_names())}

    def stop_outcome(self, signame: str) -> Tuple[str, str]:
        """KILLED, or FAILED when the stop is Slurm's time limit."""
        task = SlurmTask.detect()
        if task is not None and signame == "SIGTERM" and _time_limit_reached(task):
            return "FAILED", (f"Slurm job {task.shown_id} reached its time limit{_limit_text(task)} (raise "
                              "hydra.launcher.timeout_min or sbatch --time, or go on from the latest checkpoint "
                              "with train.resume=latest)")
        scancel = f" (Slurm job {task.shown_id} was cancelled)" if task is not None and signame == "SIGTERM" else ""
        return "KILLED", f"stopped by {signame}{scancel}"

    def check_submission(self, hydra: DictConfig, mode: str, cluster: ClusterSchema, store_uri: Optional[str]) -> None:
        from runner.launch.schedulers.slurm_submit import check_submission

        check_submission(hydra, mode, cluster, store_uri)

    def cancel_pending(self) -> None:
        array = os.environ.get("SLURM_ARRAY_JOB_ID")
        if array:  # the array's tasks that have not started (those running stop by themselves)
            subprocess.run(["scancel", "--state=PENDING", array], capture_output=True, timeout=30)

    def run_folder_name(self) -> Optional[str]:
        """The tasks of one job step (``srun python -m runner``) share ``slurm/<job id>.<step id>``."""
        if "SLURM_JOB_ID" in os.environ and "SLURM_STEP_ID" in os.environ:
            return f"slurm/{os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}"
        return None


_SAID: List[bool] = []
SCHEDULER = SlurmScheduler()
