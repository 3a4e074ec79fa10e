"""Start and supervise this host's elastic agents; leave no process behind, whatever happens.

Each agent runs in its own session (process group) with its workers, so that stopping a job is
one signal per node: SIGTERM first (the agent stops its workers), SIGKILL after a grace period.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, List, Optional

GRACE_S = 5.0  # after the first failure or a stop request, before SIGKILL
TICK_S = 0.2  # supervision: how soon a failed agent is noticed
PUMP_S = 2.0  # how often rank 0's MLflow events are written (the store's work competes with training)


class WorkerFailure(RuntimeError):
    """A worker (or agent) failed; ``str()`` names the rank and the error, in one line."""


_warm: dict = {}  # the agent started by prewarm(): {"proc": Popen, "threads": int}


def prewarm(threads: int) -> None:
    """Start node 0's agent before the config is composed: it imports torch, TorchRec and the runner
    (about 4 s) while the driver composes, checks and opens the MLflow run, then waits on stdin for
    its job. ``threads`` is the OpenMP thread count it loads torch with; :func:`launch` uses it only
    for a job that needs that count, and any agent not used is killed when the driver exits."""
    import atexit

    from runner import STARTED

    env = dict(os.environ, RUNNER_START_UNIX=str(STARTED))  # the start-up marks' origin (driver._mark_start)
    _warm["proc"] = subprocess.Popen([sys.executable, "-m", "runner.agent", "--warm", str(threads)],
                                     stdin=subprocess.PIPE, start_new_session=True, env=env)
    _warm["threads"] = threads
    atexit.register(discard_warm)


def took_warm() -> bool:
    """Whether a job of this driver ran on the prewarmed agent."""
    return bool(_warm.get("taken"))


def discard_warm() -> None:
    """Stop the prewarmed agent if no job took it."""
    proc = _warm.pop("proc", None)
    if proc is not None:
        _kill_group(proc, signal.SIGKILL)
        proc.wait()


def _take_warm(run_dir: Path, node: int, port: int, threads: int) -> Optional[subprocess.Popen]:
    """The prewarmed agent, handed this job, if it is alive and loaded torch with ``threads``."""
    proc = _warm.get("proc")
    if proc is None or proc.poll() is not None or _warm["threads"] != threads:
        discard_warm()
        return None
    del _warm["proc"]
    try:
        proc.stdin.write((json.dumps([str(run_dir), node, port]) + "\n").encode())
        proc.stdin.close()
    except OSError:  # it ended meanwhile
        _kill_group(proc, signal.SIGKILL)
        proc.wait()
        return None
    _warm["taken"] = True
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_all(procs: List[subprocess.Popen]) -> None:
    for p in procs:
        _kill_group(p, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    for p in procs:  # the agent may be gone while its workers linger: kill the whole group
        _kill_group(p, signal.SIGKILL)
        p.wait()


def root_cause(run_dir: Path) -> str:
    """The earliest recorded error: the failing rank's own, not its peers' broken connections."""
    records = []
    for f in (run_dir / "errors").glob("*.json"):
        try:
            records.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    if not records:
        return "a worker process failed without recording an error (see the output above)"
    # A rank killed by a signal records nothing itself; its agent's record names it, and outranks the
    # peers' errors about the broken connection. A rank that recorded its own error is judged by that.
    workers = [r for r in records if r.get("source") == "worker"]
    spoke = {str(r["rank"]) for r in workers}
    killed = [r for r in records if r.get("signal") and str(r["rank"]) not in spoke]
    first = min(killed or workers or records, key=lambda r: r["time"])
    return f"rank {first['rank']} failed: {first['error']}"


def nodes_on_this_host(cluster: Any) -> List[int]:
    """Every node when nodes are emulated on this host, else just ``cluster.node_rank``."""
    return list(range(cluster.nodes)) if cluster.node_rank is None else [cluster.node_rank]


def launch(cluster: Any, run_dir: Path, port: int, while_starting: Optional[Callable[[], None]] = None,
           pump: Optional[Callable[[], None]] = None, threads: Optional[int] = None) -> None:
    """Run the job's agents on this host until all finish; raise :class:`WorkerFailure` if one fails.

    The first node's agent is the prewarmed one when there is one and it loaded torch with
    ``threads`` OpenMP threads (what this job's agent would set).

    ``while_starting`` runs once the agents are started (workers import and rendezvous meanwhile);
    if it raises, the agents are stopped. ``pump`` runs every supervision tick.
    """
    procs: List[subprocess.Popen] = []

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        for i, node in enumerate(nodes_on_this_host(cluster)):
            warm = _take_warm(run_dir, node, port, threads) if i == 0 and threads is not None else None
            procs.append(warm or subprocess.Popen(
                [sys.executable, "-m", "runner.agent", str(run_dir), str(node), str(port)],
                start_new_session=True,
            ))
        if while_starting is not None:
            while_starting()
        next_pump = time.monotonic() + PUMP_S
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                failed = next(i for i, c in enumerate(codes) if c not in (None, 0))
                deadline = time.monotonic() + GRACE_S  # peers usually fail on their own: let them report
                while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                    time.sleep(0.1)
                _stop_all(procs)
                raise WorkerFailure(root_cause(run_dir) + f" (node {nodes_on_this_host(cluster)[failed]})")
            if all(c == 0 for c in codes):
                return
            if pump is not None and time.monotonic() >= next_pump:
                pump()
                next_pump = time.monotonic() + PUMP_S
            time.sleep(TICK_S)
    finally:
        _stop_all(procs)
        signal.signal(signal.SIGTERM, previous)
