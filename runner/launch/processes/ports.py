"""The rendezvous port: a free one picked for the job, or the configured one checked before launch.

A taken ``cluster.master_port`` would otherwise surface as a 30-line traceback from torch elastic's
agent followed by "a worker process failed without recording an error"; here it is one line that names
the port and, when this host can tell, the process holding it.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path
from typing import Optional

from runner.config.errors import ConfigError


def free_port() -> int:
    """A port the OS says is free now (the job's agents bind it within seconds)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _socket_inodes(port: int) -> set:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                inodes.add(fields[9])
    return inodes


def port_holder(port: int) -> Optional[str]:
    """``pid N (command)`` of the process listening on ``port`` on this host, when /proc shows it."""
    inodes = _socket_inodes(port)
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                    return f"pid {proc.name} ({cmd[:120]})"
        except OSError:
            continue
    return None


def check_master_port(addr: str, port: int) -> None:
    """Refuse a ``cluster.master_port`` that another process holds on this host, in one line."""
    host = "0.0.0.0" if addr in ("localhost", "127.0.0.1", "0.0.0.0") else addr
    with socket.socket() as s:
        # as torch's TCPStore binds it: a port left in TIME_WAIT by an earlier job (a requeued Slurm job gets
        # its first attempt's port) is free to listen on; only a listening process holds it
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return  # the rendezvous host is another machine: its agent binds the port there
            if exc.errno != errno.EADDRINUSE:
                raise
            holder = port_holder(port)
            who = f"held by {holder}" if holder else "held by another process (another job's rendezvous?)"
            raise ConfigError("cluster.master_port", port,
                              f"a free port: it is in use on {addr}, {who}; pick another or set "
                              "cluster.master_port=null to let the runner pick a free one") from None
