"""An agent started before the config exists, so that its imports overlap composing the config.

For a single training job, ``python -m runner`` starts node 0's agent at once: it sets OpenMP's thread
count, imports torch, TorchRec (where its workers are forked) and the runner (seconds: docs/benchmarks.md)
while the driver composes, checks and opens the MLflow run, then waits on stdin for its job. The driver hands
it the job only when the job needs the thread count it loaded torch with; otherwise, on a refused config, or
when the job starts no workers, it is killed. State is this driver process's own (one prewarmed agent at
most) and reached only through the functions below.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, List, Optional

from runner import STARTED
from runner.runtime.process_end import DRIVER_PID


class WarmAgent:
    """The prewarmed agent process and the OpenMP thread count it loaded torch with."""

    def __init__(self, threads: int) -> None:
        env = dict(os.environ, RUNNER_START_UNIX=str(STARTED),  # the start-up marks' origin
                   **{DRIVER_PID: str(os.getpid())})  # it dies with this driver
        self.threads = threads
        self.proc: Optional[subprocess.Popen] = spawn_agent(
            [sys.executable, "-m", "runner.launch.processes.agent", "--warm", str(threads)],
            stdin=subprocess.PIPE, start_new_session=True, env=env)
        self.taken = False

    def discard(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            kill_group(proc, signal.SIGKILL)
            proc.wait()

    def take(self, run_folder: Path, node: int, port: int, threads: int, rendezvous: str) -> Optional[subprocess.Popen]:
        """The process, handed this job, if it is alive and loaded torch with ``threads``; else None."""
        proc = self.proc
        if proc is None or proc.poll() is not None or self.threads != threads:
            self.discard()
            return None
        self.proc = None
        try:
            assert proc.stdin is not None  # started with a pipe
            proc.stdin.write((json.dumps([str(run_folder), node, port, rendezvous]) + "\n").encode())
            proc.stdin.close()
        except OSError:  # it ended meanwhile
            kill_group(proc, signal.SIGKILL)
            proc.wait()
            return None
        self.taken = True
        return proc


_agent: Optional[WarmAgent] = None


def spawn_agent(args: List[str], **kwargs: Any) -> subprocess.Popen:
    """Start an agent with the schedulers' early signals already ignored (an ignored signal stays ignored across
    exec; :func:`runner.launch.schedulers.early_signals`): an agent still importing torch (before it ignores them
    itself) would die of one."""
    from runner.launch.schedulers import early_signals

    if threading.current_thread() is not threading.main_thread():
        return subprocess.Popen(args, **kwargs)
    previous = [(s, signal.signal(s, signal.SIG_IGN)) for s in early_signals()]
    try:
        return subprocess.Popen(args, **kwargs)
    finally:
        for s, handler in previous:
            signal.signal(s, handler)


def kill_group(proc: subprocess.Popen, sig: int) -> None:
    """Signal ``proc``'s whole process group (an agent runs in its own session, with its workers)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def prewarm(threads: int) -> None:
    """Start node 0's agent now, loading torch with ``threads`` OpenMP threads; killed at exit if unused."""
    global _agent
    discard_warm()  # one at a time
    _agent = WarmAgent(threads)
    atexit.register(discard_warm)


def take_warm(run_folder: Path, node: int, port: int, threads: int, rendezvous: str) -> Optional[subprocess.Popen]:
    """The prewarmed agent handed this job, or None (none started, dead, or another thread count)."""
    return _agent.take(run_folder, node, port, threads, rendezvous) if _agent is not None else None


def took_warm() -> bool:
    """Whether a job of this driver ran on the prewarmed agent."""
    return _agent is not None and _agent.taken


def discard_warm() -> None:
    """Stop the prewarmed agent if no job took it."""
    if _agent is not None:
        _agent.discard()


def prewarm_for(args: List[str]) -> None:
    """Start node 0's agent now (:func:`prewarm`), for a training job or a sweep whose points run in this
    process (no other flag than ``-m``, no other launcher, no ``experiment=``), so that its imports overlap
    composing the config and opening the run (start-up)."""
    import re

    flags = [a for a in args if a.startswith("-") and a not in ("-m", "--multirun")]
    if flags or any(re.match(r"\+*(mode=(plan|write_data)|hydra/launcher=|experiment=)", a) for a in args):
        return
    from runner.config.schema import ClusterSchema
    from runner.runtime.affinity import threads_per_worker, workers_on_host

    c = ClusterSchema()  # the default cluster's count
    prewarm(threads_per_worker(None, workers_on_host(c.nodes, c.workers_per_node, c.node_rank)))
