"""Slurm as the runner's scheduler: a job's nodes as the tasks of a Slurm job step, one per node, each starting
its node's elastic agent; and ``hydra/launcher=slurm``, every sweep point one Slurm job of ``cluster.nodes`` nodes.

One concept: the Slurm scheduler. :class:`Scheduler`'s interface spans both ends of a Slurm job, submitting it
(:meth:`SlurmScheduler.check_submission`, :func:`submit_points`) and running as its tasks (the place, the time
limit, a stop's outcome), and both ends speak to Slurm through the same commands and their one-line :class:`SlurmError`.

A task: a point's job of ``hydra/launcher=slurm`` and a hand-written ``srun python -m runner ...`` alike
land here. The node rank is ``SLURM_NODEID``; the rendezvous host is the job's first node, at the
address Slurm knows it by (``scontrol show node``'s ``NodeAddr``, never a silent fallback: a node that
rendezvoused with itself would form a world of one and wait); the port comes from the job id, so two jobs
on one host never collide. The agents use torch elastic's static rendezvous (``rank`` = node rank, as
torchrun does with ``--node-rank``), so rank 0 is always on node 0, whose task alone opens the MLflow run.
Other nodes keep their files in ``<run folder>/node<k>/``.

The launcher (``conf/hydra/launcher/slurm.yaml``, on hydra-submitit-launcher) submits the points as job
arrays through submitit, one array per distinct shape (nodes, CPUs, GPUs per node), and waits, printing
each point's outcome as it ends. A point's outcome is its run folder's ``status.json`` (what the sweep's
report reads), not submitit's result pickle: a job that Slurm killed before the runner could record an
outcome is recorded FAILED here, with its state and log. Ctrl-C while waiting cancels the jobs.
:meth:`SlurmScheduler.check_submission` refuses, before any submission, a store or sweep folder the nodes cannot reach.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf, open_dict

from runner import PLUGINS
from runner.config.errors import SchedulerError, first_line
from runner.config.modes import MODES
from runner.config.place import Place
from runner.launch.schedulers import Scheduler, Task
from runner.runtime import run_files, signals
from runner.track.store import sqlite_folder, tracking_uri

if TYPE_CHECKING:
    from runner.config.schema import ClusterSchema

# Slurm's own commands (``scontrol``, ``sinfo``, ``squeue``, ``scancel``), each failure one line.

LABEL = "Slurm"  # how messages name this scheduler


class SlurmError(SchedulerError):
    """Slurm cannot run the job as asked (the error's kind: ``Slurm error``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, LABEL)


def slurm_command(cmd: List[str], context: str = "", hint: str = "", timeout: float = 30) -> str:
    """The output of one of Slurm's commands (``scontrol``, ``sinfo``, ``squeue``, ``scancel``); on failure a
    :class:`SlurmError` in one line: ``context`` first, the command and why, then ``hint``."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        why = None if out.returncode == 0 else (out.stderr or out.stdout).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = str(exc)
    if why is not None:
        raise SlurmError(f"{context}{' '.join(cmd)} failed: {why}{hint}")
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
        raise SlurmError(f"scontrol show node {name} gives no NodeAddr: cannot find the rendezvous host")
    return m.group(1)


# A task of a job step: its place, the time limit.

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


def adopt(c: ClusterSchema, checkpoint_dir: Optional[str], task: SlurmTask, run_folder: Path) -> Tuple[Place, Path]:
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
    shared = str(run_folder / run_files.CHECKPOINTS) if task.node_rank and not checkpoint_dir else None
    place = Place(SCHEDULER.name, task.node_rank, node_address(task.node_names()[0]),
                  c.master_port if c.master_port is not None else task.port, shared)
    return place, SCHEDULER.node_run_folder(run_folder, task.node_rank)


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


# hydra/launcher=slurm: the points submitted as jobs, their outcomes awaited.

# Filesystems that every node of a cluster mounts alike (the store and the sweep folder must be on one).
SHARED_FS = {"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "glusterfs", "fuse.glusterfs", "cifs",
             "smb3", "9p", "virtiofs", "wekafs", "panfs", "fuse.sshfs", "fuse.juicefs", "fuse.s3fs", "orangefs"}
POLL_S = 2.0
UNLISTED_S = 60.0  # a job squeue has never listed counts as ended after this long


def _run(cmd: List[str]) -> str:
    return slurm_command(cmd, "hydra/launcher=slurm: ", " (are Slurm's commands installed and slurmctld up? make "
                         "slurm-up starts a 2-node cluster on this machine)")


def partition_nodes(partition: Optional[str]) -> List[str]:
    """The nodes a job of ``partition`` (None: the default one) may run on."""
    out = _run(["sinfo", "-h", "-N", "-o", "%N %P", *(["-p", partition] if partition else [])])
    rows = [line.split() for line in out.splitlines() if line.strip()]
    if not partition:  # the default partition is marked with a *
        rows = [r for r in rows if r[1].endswith("*")] or rows
    if not rows:
        known = sorted({p.rstrip("*") for p in _run(["sinfo", "-h", "-o", "%P"]).split()})
        raise SlurmError(f"hydra.launcher.partition={partition!r} is not a partition of this Slurm; expected one "
                             f"of {', '.join(known)}")
    return sorted({r[0] for r in rows})


def _this_host(addr: str) -> bool:
    if addr in ("localhost", "::1") or addr.startswith("127."):
        return True
    names = {socket.gethostname(), socket.getfqdn()}
    with contextlib.suppress(OSError):
        names.update(socket.gethostbyname_ex(socket.gethostname())[2])
    return addr in names


def filesystem_type(path: Path) -> str:
    """The type of the filesystem ``path`` is on (the mount, of psutil's, with the longest mount point above it)."""
    import psutil

    try:
        mounts = psutil.disk_partitions(all=True)
    except (OSError, RuntimeError):
        return "unknown"
    above = [m for m in mounts if (str(path.resolve()) + "/").startswith(m.mountpoint.rstrip("/") + "/")]
    return max(above, key=lambda m: len(m.mountpoint)).fstype if above else "unknown"


@dataclass
class Point:
    num: int
    overrides: List[str]
    run_folder: Path
    shape: Tuple[int, int, Optional[int]]  # nodes, CPUs per task, GPUs per node
    job: Any = None
    refused: Optional[str] = None  # why sbatch did not take it


CPUS_PER_GPU_WORKER = 4  # a GPU worker's share of a node's CPUs by default: its data path needs room


def parse_node_resources(sinfo_out: str) -> Tuple[int, int]:
    """(fewest CPUs, fewest GPUs) over a partition's node lines ``"<cpus> <gres>"`` (``sinfo -o "%c %G"``);
    gres is ``(null)``, ``gpu:8``, ``gpu:a100:8(S:0-1)`` or a comma-separated list of such."""
    cpus, gpus = [], []
    for line in sinfo_out.splitlines():
        if not line.strip():
            continue
        count, _, gres = line.strip().partition(" ")
        cpus.append(int(count.rstrip("+")))
        parts = [item.split("(")[0].split(":") for item in gres.split(",")]
        gpus.append(sum(int(p[-1]) for p in parts if p[0] == "gpu" and len(p) > 1 and p[-1].isdigit()))
    return (min(cpus), min(gpus)) if cpus else (0, 0)


def partition_resources(partition: Optional[str]) -> Tuple[int, int]:  # (CPUs, GPUs) every node of it has
    return parse_node_resources(_run(["sinfo", "-h", "-o", "%c %G", *(["-p", partition] if partition else [])]))


def job_shape(mode: str, c: ClusterSchema, params: Dict[str, Any], node_cpus: int, node_gpus: int
              ) -> Tuple[int, int, Any]:
    """Nodes, CPUs per task and GPUs per node of a point's job (of ``mode`` on cluster ``c``). Workers use CUDA with
    ``cluster.device=cuda``, or ``auto`` on a partition whose nodes have GPUs: then each worker gets one and, unless
    ``hydra.launcher.cpus_per_task`` says otherwise, ``CPUS_PER_GPU_WORKER`` CPUs (at most the node's)."""
    train, workers = MODES[mode].on_workers, int(c.workers_per_node)
    nodes = int(c.nodes) if train else 1
    gpus = params.get("gpus_per_node")
    if gpus is None and train and (c.device == "cuda" or c.device == "auto" and node_gpus > 0):
        gpus = workers
    cpus = params.get("cpus_per_task")
    if not cpus:
        cpus = (max(workers, min(node_cpus, CPUS_PER_GPU_WORKER * workers)) if gpus else workers) if train else 1
    return nodes, int(cpus), gpus


def _points(launcher: Any, job_overrides: Sequence[Sequence[str]], first: int) -> List[Point]:
    points = []
    node_cpus, node_gpus = partition_resources(launcher.params.get("partition"))
    for i, overrides in enumerate(job_overrides):
        cfg = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.num = first + i
        run_folder = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
        points.append(Point(first + i, list(overrides), run_folder,
                            job_shape(str(cfg.mode), cfg.cluster, launcher.params, node_cpus, node_gpus)))
    return points


def _submit(launcher: Any, points: List[Point]) -> None:
    import submitit
    from hydra.core.singleton import Singleton
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    params = dict(launcher.params)
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    init_keys = {"submitit_folder", "max_num_timeout"}
    for shape in sorted({p.shape for p in points}, key=str):
        group = [p for p in points if p.shape == shape]
        executor = submitit.AutoExecutor(cluster="slurm", folder=params["submitit_folder"],
                                         slurm_max_num_timeout=params.get("max_num_timeout", 0))
        nodes, cpus, gpus = shape
        # --kill-on-bad-exit: a node's failed task ends the others at once (not on the rendezvous for 300 s)
        chosen = {**params, "nodes": nodes, "tasks_per_node": 1, "cpus_per_task": cpus, "gpus_per_node": gpus,
                  "srun_args": ["--kill-on-bad-exit=1"],  # and the runner's plugins importable before the runner:
                  "setup": [*(params.get("setup") or []), f"export PYTHONPATH={PLUGINS}${{PYTHONPATH:+:$PYTHONPATH}}"]}
        executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in chosen.items()
                                      if k not in init_keys and v is not None})
        try:
            jobs = executor.map_array(launcher, [p.overrides for p in group], ["hydra.sweep.dir"] * len(group),
                                      [p.num for p in group], [f"job_id_for_{p.num}" for p in group],
                                      [Singleton.get_state()] * len(group))
        except Exception as exc:  # sbatch refused (resources, account, partition limits): an answer per point
            said = [ln.strip() for ln in str(exc).splitlines() if "error:" in ln] or [first_line(exc)]
            for p in group:
                p.refused = f"Slurm refused the job: {'; '.join(said)}"
                run_files.write_status(p.run_folder, "FAILED", p.refused)
            continue
        for p, job in zip(group, jobs, strict=True):
            p.job = job


def _ended(p: Point, state: str) -> Dict[str, Any]:
    """The point's outcome; recorded FAILED when the job ended without one (killed before the runner could)."""
    status = run_files.read_status(p.run_folder)
    if status is None:
        line = (f"Slurm job {p.job.job_id} ended {state} before the runner recorded an outcome "
                f"(log: {p.job.paths.stdout})")
        status = {"status": "FAILED", "error": line, "slurm_state": state}
        run_files.write_status(p.run_folder, "FAILED", line, slurm_state=state)
    return status


ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING",
          "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "STOPPED"}


def job_states() -> Optional[Dict[str, str]]:
    """Slurm's state of every job it still lists (``squeue``; no accounting daemon needed), by job id; None
    when squeue did not answer (asked again at the next poll)."""
    try:
        out = _run(["squeue", "-h", "-r", "--states=all", "-o", "%i %T"])
    except SlurmError:
        return None
    return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)


def _job_return(p: Point) -> Any:
    from hydra.core.utils import JobReturn, JobStatus

    task0 = None if p.job is None else p.job.task(0) if p.job.num_tasks > 1 else p.job
    if task0 is not None and task0.paths.result_pickle.exists():
        with contextlib.suppress(Exception):  # the outcome is in status.json; submitit's pickle holds a traceback
            ret = task0.result()
            if isinstance(ret, JobReturn):
                return ret
    ret = JobReturn(overrides=p.overrides, working_dir=str(p.run_folder), status=JobStatus.COMPLETED)
    ret.return_value = None
    return ret


def _wait(points: List[Point]) -> None:
    for p in points:
        if p.refused:
            print(f"[runner] point {p.num} FAILED: error: {p.refused}", flush=True)
    pending, since = [p for p in points if p.job is not None], time.monotonic()
    seen: set = set()
    while pending:
        states = job_states()
        if states is None:
            time.sleep(POLL_S)
            continue
        seen.update(states)
        for p in [p for p in pending if states.get(p.job.job_id) not in ACTIVE]:
            if p.job.job_id not in states and p.job.job_id not in seen and time.monotonic() - since < UNLISTED_S:
                continue  # not listed yet
            pending.remove(p)
            status = _ended(p, states.get(p.job.job_id, "(no longer listed by squeue)"))
            said = status.get("summary", "").replace("[runner] ", "", 1) or f"error: {status.get('error')}"
            print(f"[runner] point {p.num} (Slurm job {p.job.job_id}) {status.get('status')}: {said}", flush=True)
        if pending:
            time.sleep(POLL_S)


def submit_points(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> List[Any]:
    """Submit every point, wait for all, return Hydra's job returns (the outcome is in each ``status.json``)."""
    import logging

    logging.getLogger("submitit").setLevel(logging.ERROR)  # its job watcher's sacct warnings: we ask squeue
    sweep_folder = Path(str(launcher.config.hydra.sweep.dir))
    sweep_folder.mkdir(parents=True, exist_ok=True)
    points = _points(launcher, job_overrides, initial_job_idx)
    _submit(launcher, points)
    submitted = [p for p in points if p.job is not None]
    # asynchronous Optuna trials submit from several threads
    with run_files.exclusive(sweep_folder / ".scheduler.lock"):
        earlier = (run_files.read_json(sweep_folder / run_files.SCHEDULER) or {}).get("job_ids", [])
        run_files.write_json(sweep_folder / run_files.SCHEDULER, {"scheduler": "slurm",
                                                         "job_ids": earlier + [p.job.job_id for p in submitted]})
    listed = ", ".join(f"{p.job.job_id} (point {p.num}: {' '.join(p.overrides) or 'defaults'})" for p in submitted)
    folder = str(launcher.params["submitit_folder"]).replace("%j", "<job id>")
    if submitted:
        print(f"[runner] Slurm: submitted {listed}; logs in {folder}", flush=True)
    try:
        _wait(points)
    except KeyboardInterrupt:
        ids = [p.job.job_id for p in submitted]
        with contextlib.suppress(SlurmError):  # what is left of the jobs, Slurm ends at their time limit
            slurm_command(["scancel", *ids])
        print(f"[runner] Slurm: cancelled {', '.join(ids)}", flush=True)
        raise
    return [_job_return(p) for p in points]


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

    def take(self, mode: str, cluster: ClusterSchema, checkpoint_dir: Optional[str], run_folder: Path,
             task: Task) -> Tuple[Path, bool, Place]:
        """Signals as the command line has them (submitit's own handlers ignore SIGTERM) and a line on the
        time-limit warning; a training job's node rank, rendezvous and run folder taken from the job
        (:func:`adopt`)."""
        assert isinstance(task, SlurmTask)
        signals.install()
        on_time_limit_warning()
        if not MODES[mode].on_workers and task.node_rank > 0:
            print(f"[runner] node {task.node_rank}: mode={mode} runs in node 0's task only", flush=True)
            return run_folder, True, Place(self.name)
        if MODES[mode].on_workers:
            place, run_folder = adopt(cluster, checkpoint_dir, task, run_folder)
            return run_folder, False, place
        return run_folder, False, Place(self.name)  # the run's tags say where it ran

    def node_run_folder(self, run_folder: Path, node_rank: Optional[int]) -> Path:
        """Node 0 keeps the job's run folder; another node keeps its files in ``node<k>/``."""
        return run_folder / NODE_DIR.format(node_rank) if node_rank else run_folder

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
        """What the nodes of a point's job must reach (``hydra``: Hydra's config of the point; ``store_uri``:
        ``tracking.uri``): its store and sweep folder (on a local disk only where every node is this host)."""
        partition = hydra.launcher.get("partition")
        nodes = partition_nodes(partition)
        if MODES[mode].on_workers and cluster.nodes > len(nodes):
            raise SlurmError(f"cluster.nodes={cluster.nodes} but the Slurm partition {partition or '(default)'} "
                             f"has {len(nodes)} node(s) ({', '.join(nodes)}); lower cluster.nodes or choose a larger "
                             "partition with hydra.launcher.partition")
        if all(_this_host(node_address(n)) for n in nodes):
            return
        where = f"the Slurm nodes ({', '.join(nodes)}) are other hosts"
        uri = tracking_uri(store_uri)
        folder = sqlite_folder(uri) or (Path(uri[len("file://"):]) if uri.startswith("file://") else None)
        if folder is None and "://" not in uri:
            folder = Path(uri)
        kind = filesystem_type(folder) if folder is not None else None
        if kind is not None and kind not in SHARED_FS:
            raise SlurmError(f"tracking.uri={uri} is on this host's {kind} disk and {where}: run an mlflow server they "
                             "reach (mlflow server --host 0.0.0.0 --port 5000 --backend-store-uri sqlite:///<path>; "
                             "tracking.uri=http://<this host>:5000) or put the store on a shared filesystem")
        host = uri.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
        if uri.startswith(("http://", "https://")) and (host in ("localhost", "::1") or host.startswith("127.")):
            raise SlurmError(f"tracking.uri={uri} is this host's loopback and {where}: give the server's address "
                             "the nodes reach (and start it with --host 0.0.0.0)")
        sweep_folder = Path(str(hydra.sweep.dir))
        if filesystem_type(sweep_folder.parent if not sweep_folder.exists() else sweep_folder) not in SHARED_FS:
            raise SlurmError(f"hydra.sweep.dir={sweep_folder} is on a local disk and {where}: set hydra.sweep.dir to a "
                             "shared filesystem (the points' run folders and the sweep's report live there)")

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
