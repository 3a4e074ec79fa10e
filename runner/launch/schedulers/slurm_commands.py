"""Slurm's own commands (``scontrol``, ``sinfo``, ``squeue``, ``scancel``), each failure one line."""

from __future__ import annotations

import re
import subprocess
from typing import List

from runner.config.errors import SchedulerError

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
