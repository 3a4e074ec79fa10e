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

import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

from runner.config.errors import SchedulerError
from runner.runtime import rundir

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig

TORCH_PORT = 29500  # torch's default rendezvous port; a job's port is this + its id modulo PORT_SPAN
PORT_SPAN = 2000


def slurm_command(cmd: List[str], context: str = "", hint: str = "", timeout: float = 30) -> str:
    """The output of one of Slurm's commands (``scontrol``, ``sinfo``, ``squeue``, ``scancel``); on failure a
    :class:`SchedulerError` in one line: ``context`` first, the command and why, then ``hint``."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        why = None if out.returncode == 0 else (out.stderr or out.stdout).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = str(exc)
    if why is not None:
        raise SchedulerError(f"{context}{' '.join(cmd)} failed: {why}{hint}")
    return out.stdout


def _scontrol(*args: str) -> str:
    return slurm_command(["scontrol", *args], hint=" (the runner needs Slurm's commands on every node to find the "
                                                   "job's nodes)")


def hostnames(nodelist: str) -> List[str]:
    """``n[1-2]`` -> ``["n1", "n2"]``, as Slurm expands it."""
    return _scontrol("show", "hostnames", nodelist).split()


def node_address(name: str) -> str:
    """The address Slurm reaches node ``name`` at (its ``NodeAddr``)."""
    m = re.search(r"\bNodeAddr=(\S+)", _scontrol("show", "node", name))
    if not m:
        raise SchedulerError(f"scontrol show node {name} gives no NodeAddr: cannot find the rendezvous host")
    return m.group(1)


@dataclass(frozen=True)
class SlurmTask:
    """This process as Slurm's task of a job step (what the environment says)."""

    job_id: str  # SLURM_JOB_ID: unique per array element too
    shown_id: str  # as squeue shows it: ``<array job>_<index>`` for an array element
    node_rank: int
    nodes: int
    tasks: int
    nodelist: str
    restarts: int = 0  # SLURM_RESTART_COUNT: times Slurm requeued the job (a lost node, scontrol requeue)

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


def task_for(cfg: RunnerConfig) -> Optional[SlurmTask]:
    """The Slurm task this job runs as, per ``cluster.scheduler`` (``auto``: when Slurm's environment says so)."""
    mode = cfg.cluster.scheduler
    task = SlurmTask.detect() if mode in ("auto", "slurm") else None
    if mode == "auto" and task is None and int(os.environ.get("SLURM_NNODES", "1")) > 1:
        print(f"[runner] warning: Slurm job {os.environ.get('SLURM_JOB_ID')} has {os.environ['SLURM_NNODES']} nodes "
              "but this runner is not one of its step's tasks (no srun): every node of cluster.nodes runs here; "
              "start it with srun --ntasks-per-node=1 (see experiments/train.sbatch)", flush=True)
    if mode == "slurm" and task is None:
        raise SchedulerError("cluster.scheduler=slurm but this process is not a task of a Slurm job step (no "
                             "SLURM_JOB_ID/SLURM_STEP_ID/SLURM_NODEID): start it with srun, or use "
                             "-m hydra/launcher=slurm")
    return task


def adopt(cfg: RunnerConfig, task: SlurmTask, run_dir: Path) -> Path:
    """Take node rank, rendezvous host and port from the Slurm job (one task per node, ``cluster.nodes``
    nodes); this node's run folder. Every node checkpoints into the job's folder (one distributed checkpoint)."""
    c = cfg.cluster
    if task.nodes != c.nodes:
        raise SchedulerError(f"cluster.nodes={c.nodes} but Slurm job {task.shown_id} has {task.nodes} node(s) "
                             f"({task.nodelist}); ask Slurm for cluster.nodes nodes (sbatch -N {c.nodes}; "
                             "hydra/launcher=slurm does) or set cluster.nodes")
    if task.tasks != task.nodes:
        raise SchedulerError(f"Slurm job {task.shown_id} runs {task.tasks} tasks on {task.nodes} node(s); the runner "
                             "needs one task per node (srun --ntasks-per-node=1): each task starts its node's "
                             "cluster.workers_per_node workers")
    names = task.node_names()
    c.scheduler = "slurm"
    c.node_rank = task.node_rank
    c.master_addr = node_address(names[0])
    if c.master_port is None:
        c.master_port = task.port
    if task.node_rank and not cfg.train.checkpoint.dir:
        cfg.train.checkpoint.dir = str(run_dir / rundir.CHECKPOINTS)
    return node_run_dir(run_dir, cfg)


def node_run_dir(run_dir: Path, cfg: RunnerConfig) -> Path:
    """Node 0 keeps the job's run folder; another node of a Slurm job keeps its files in ``node<k>/``."""
    k = cfg.cluster.node_rank
    return run_dir / rundir.NODE_DIR.format(k) if cfg.cluster.scheduler == "slurm" and k else run_dir


def run_tags(cfg: RunnerConfig) -> Dict[str, str]:
    """MLflow tags of a Slurm job's run."""
    task = SlurmTask.detect() if cfg.cluster.scheduler == "slurm" else None
    if task is None:
        return {}
    return {"runner.scheduler": "slurm", "runner.slurm_job_id": task.shown_id,
            "runner.slurm_nodes": ",".join(task.node_names())}


def _time_limit_reached(task: SlurmTask) -> bool:
    """Whether Slurm is ending the job for its time limit (its reason while it completes)."""
    try:
        return "TimeLimit" in slurm_command(["squeue", "-h", "-j", task.job_id, "-o", "%r"], timeout=10)
    except SchedulerError:
        return False


def _limit_text(task: SlurmTask) -> str:
    try:
        m = re.search(r"\bTimeLimit=(\S+)", _scontrol("show", "job", task.job_id))
    except SchedulerError:
        m = None
    return f" of {m.group(1)}" if m else ""


def stop_outcome(cfg: RunnerConfig, signame: str) -> Tuple[str, str]:
    """``(status, line)`` for a job stopped by ``signame``: KILLED, or FAILED when it is Slurm's time limit."""
    task = SlurmTask.detect() if cfg.cluster.scheduler == "slurm" else None
    if task is not None and signame == "SIGTERM" and _time_limit_reached(task):
        return "FAILED", (f"Slurm job {task.shown_id} reached its time limit{_limit_text(task)} (raise "
                          "hydra.launcher.timeout_min or sbatch --time, or go on from the latest checkpoint with "
                          "train.resume=latest)")
    scancel = f" (Slurm job {task.shown_id} was cancelled)" if task is not None and signame == "SIGTERM" else ""
    return "KILLED", f"stopped by {signame}{scancel}"


def on_time_limit_warning() -> None:
    """Slurm's early signal (SIGUSR2 ``hydra.launcher.signal_delay_s`` before the time limit): say so, go on."""
    def _say(signum: int, frame: Any) -> None:
        print("[runner] Slurm: the job's time limit is near (SIGUSR2); it will be stopped at the limit",
              flush=True)

    signal.signal(signal.SIGUSR2, _say)


def take_task(cfg: RunnerConfig, run_dir: Path) -> Tuple[Optional[SlurmTask], Path, bool]:
    """This job as a Slurm task, if it is one: signals as the command line has them (submitit's own handlers
    ignore SIGTERM) and a line on the time-limit warning; a training job's node rank, rendezvous and run
    folder taken from the job (:func:`adopt`). Returns the task (None outside Slurm), the run folder, and
    whether the job runs elsewhere (a plan or data job runs in node 0's task only)."""
    task = task_for(cfg)
    if task is None:
        return None, run_dir, False
    from runner.runtime import signals

    signals.install()
    on_time_limit_warning()
    if cfg.mode != "train" and task.node_rank > 0:
        print(f"[runner] node {task.node_rank}: mode={cfg.mode} runs in node 0's task only", flush=True)
        return task, run_dir, True
    if cfg.mode == "train":
        return task, adopt(cfg, task, run_dir), False
    cfg.cluster.scheduler = "slurm"  # the run's tags say where it ran
    return task, run_dir, False
