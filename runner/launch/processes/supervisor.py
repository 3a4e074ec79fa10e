"""Start and supervise this host's elastic agents; leave no process behind, whatever happens.

Each agent runs in its own session (process group) with its workers, so that stopping a job is
one signal per node: SIGTERM first (the agent stops its workers), SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from runner.config.errors import WorkerFailure
from runner.launch.processes.prewarm import kill_group, spawn_agent, take_warm
from runner.launch.sweep import stop as sweep_stop
from runner.runtime import run_files, signals
from runner.runtime.process_end import DRIVER_PID
from runner.track.sweep_points import sweep_of

if TYPE_CHECKING:
    from runner.config.schema import ClusterSchema
    from runner.launch.schedulers import Scheduler

GRACE_S = 5.0  # after the first failure or a stop request, before SIGKILL
TICK_S = 0.2  # supervision: how soon a failed agent is noticed
PUMP_S = 2.0  # how often rank 0's MLflow events are written (the store's work competes with training)
PEER_REPORT_S = 3.0  # how long a scheduler's job's node 0 waits for the other nodes' failure reports


def _stop_all(procs: List[subprocess.Popen]) -> None:
    """SIGTERM to every agent's group (an agent stops its workers), SIGKILL after the grace period, or at
    once on a second Ctrl-C."""
    try:
        for p in procs:
            kill_group(p, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.1)
    except KeyboardInterrupt:  # asked twice: no more grace
        pass
    finally:
        for p in procs:  # the agent may be gone while its workers linger: kill the whole group
            kill_group(p, signal.SIGKILL)
            p.wait()


ECHOES = ("SIGTERM", "SIGABRT")  # signal deaths that follow a peer's failure rather than cause one


def _first_failure(run_folder: Path) -> Optional[Dict[str, Any]]:
    """The earliest recorded error: the failing rank's own, not its peers' broken connections."""
    reports = [r for r in run_files.error_reports(run_folder) if "rank" in r and "time" in r]
    if not reports:
        return None
    # A rank killed by a signal reports nothing itself; its agent's report names it, and outranks the
    # peers' errors about the broken connection. A rank that recorded its own error is judged by that.
    workers = [r for r in reports if r.get("source") == "worker"]
    spoke = {str(r["rank"]) for r in workers}
    # a rank a peer waited for in vain (:mod:`runner.train.heartbeat`) is named by that peer's report; its
    # agent's stop of it afterwards is not the story
    unanswered = {str(u["rank"]) for r in workers for u in r.get("unanswered", ())}
    if unanswered:
        return min((r for r in workers if r.get("unanswered")), key=lambda r: r["time"])
    killed = [r for r in reports if r.get("signal") and str(r["rank"]) not in spoke]
    # Echoes, unless nothing else was recorded: SIGTERM is what stopping the others after a failure sends;
    # SIGABRT is what NCCL's watchdog sends a surviving rank whose peer left (a rank that aborts by itself, a
    # failed C++ check, reports nothing else and is still named when no worker spoke)
    killed = [r for r in killed if r["signal"] not in ECHOES] or (killed if not workers else [])
    return min(killed or workers or reports, key=lambda r: r["time"])


FULL_BELOW = 64 * 1024  # bytes free: a run folder this full could not take a failed rank's report


def root_cause(run_folder: Path) -> Exception:
    """The job's failure, named by its earliest recorded error; a fault when that rank was killed by a signal.
    Where no rank could record its error because the run folder's disk is full, that full disk."""
    first = _first_failure(run_folder)
    if first is None:
        import errno
        import shutil

        try:
            full = shutil.disk_usage(run_folder).free < FULL_BELOW
        except OSError:
            full = False
        if full:  # named as every full disk is (config.errors.disk_full): the folder and its free space
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(run_folder))
        return WorkerFailure(f"a worker process failed without recording an error (see {run_folder / run_files.LOG})")
    if first.get("unanswered"):
        named = first["unanswered"][0]
        others = "".join(f", rank {u['rank']} on node {u['node']}" for u in first["unanswered"][1:])
        return WorkerFailure(f"rank {named['rank']} on node {named['node']}{others} {first['error']}")
    where = f" on node {first['node']}" if "node" in first else ""
    trace = run_folder / run_files.ERRORS / f"rank{first['rank']}.traceback.txt"
    unexpected = str(first["error"]).startswith("unexpected error")
    more = f" (traceback: {trace})" if unexpected and trace.exists() else ""
    return WorkerFailure(f"rank {first['rank']}{where} failed: {first['error']}{more}", fault=bool(first.get("signal")))


def _agent_death(proc: subprocess.Popen, node: int) -> Optional[str]:
    """The line for an agent that was killed by a signal (its workers died with it), else None."""
    if proc.returncode is None or proc.returncode >= 0:
        return None
    try:
        name = signal.Signals(-proc.returncode).name
    except ValueError:
        name = f"signal {-proc.returncode}"
    return f"node {node}'s agent (pid {proc.pid}) was killed by {name}; its workers were stopped with it"


def nodes_on_this_host(cluster: ClusterSchema) -> List[int]:
    """Every node when nodes are emulated on this host, else just ``cluster.node_rank``."""
    return list(range(cluster.nodes)) if cluster.node_rank is None else [cluster.node_rank]


def _start_agents(cluster: ClusterSchema, run_folder: Path, port: int, threads: Optional[int],
                  rendezvous: str) -> List[subprocess.Popen]:
    """One agent per node on this host; node 0's is the prewarmed one when it loaded torch with ``threads``.
    ``rendezvous``: torch elastic's (``static`` or ``c10d``)."""
    procs = []
    for i, node in enumerate(nodes_on_this_host(cluster)):
        warm = take_warm(run_folder, node, port, threads, rendezvous) if i == 0 and threads is not None else None
        procs.append(warm or spawn_agent(
            [sys.executable, "-m", "runner.launch.processes.agent", str(run_folder), str(node), str(port), rendezvous],
            start_new_session=True, env=dict(os.environ, **{DRIVER_PID: str(os.getpid())}),
        ))
    return procs


def _await_other_nodes(cluster: ClusterSchema, run_folder: Path, scheduler: Scheduler) -> None:
    """A job whose other nodes are a scheduler's tasks on other hosts record their ranks' failures in their
    folders inside the job's (shared) run folder (:meth:`Scheduler.node_run_folder`): give them a moment, so that
    the root cause is the rank that failed there, not this node's broken connections."""
    if not (scheduler.has_tasks and cluster.nodes > 1):
        return
    deadline = time.monotonic() + PEER_REPORT_S
    while time.monotonic() < deadline and not run_files.node_error_files(run_folder):
        time.sleep(0.2)


def _supervise(procs: List[subprocess.Popen], cluster: ClusterSchema, run_folder: Path, scheduler: Scheduler,
               pump: Optional[Callable[[], None]]) -> None:
    """Until every agent has exited 0; on the first failure let the peers report, then raise."""
    next_pump = time.monotonic() + PUMP_S
    while True:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            failed = next(i for i, c in enumerate(codes) if c not in (None, 0))
            deadline = time.monotonic() + GRACE_S  # peers usually fail on their own: let them report
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.1)
            _stop_all(procs)
            node = nodes_on_this_host(cluster)[failed]
            _await_other_nodes(cluster, run_folder, scheduler)
            death = _agent_death(procs[failed], node)
            raise WorkerFailure(death, fault=True) if death else root_cause(run_folder)
        if all(c == 0 for c in codes):
            return
        if time.monotonic() >= next_pump:
            if pump is not None:
                pump()
            sweep_stop.raise_if_stopped(sweep_of(run_folder))
            next_pump = time.monotonic() + PUMP_S
        signals.check()  # a Ctrl-C or SIGTERM whose raise was swallowed (e.g. inside a finalizer)
        time.sleep(TICK_S)


def launch(cluster: ClusterSchema, run_folder: Path, port: int, scheduler: Scheduler,
           while_starting: Optional[Callable[[], None]] = None, pump: Optional[Callable[[], None]] = None,
           threads: Optional[int] = None) -> None:
    """Run the job's agents on this host until all finish (``scheduler``: the job's, which places its nodes);
    raise :class:`WorkerFailure` if one fails.

    ``threads`` is the OpenMP thread count this job's agents load torch with (the prewarmed agent is
    used only when it matches). ``while_starting`` runs once the agents are started (workers import and
    rendezvous meanwhile); if it raises, the agents are stopped. ``pump`` runs every few seconds.
    """
    procs: List[subprocess.Popen] = []
    try:
        procs = _start_agents(cluster, run_folder, port, threads, "static" if scheduler.static_rendezvous else "c10d")
        if while_starting is not None:
            while_starting()
        _supervise(procs, cluster, run_folder, scheduler, pump)
    finally:  # also on Ctrl-C or SIGTERM (raised as runner.runtime.signals.Stopped)
        _stop_all(procs)
