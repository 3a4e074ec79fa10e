"""The rendezvous port: a free one picked for the job, or the configured one checked before launch.

A taken ``cluster.master_port`` would otherwise surface as a 30-line traceback from torch elastic's
agent followed by "a worker process failed without recording an error"; here it is one line that names
the port and, when this host can tell, the process holding it.
"""

from __future__ import annotations

import errno
import socket
from typing import Optional

from runner.config.errors import ConfigError


def free_port() -> int:
    """A port the OS says is free now (the job's agents bind it within seconds)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_holder(port: int) -> Optional[str]:
    """``pid N (command)`` of the process listening on ``port`` on this host, where psutil can tell (another
    user's process may be hidden: then None)."""
    import psutil

    try:
        pids = {c.pid for c in psutil.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
    except (psutil.Error, OSError):
        return None
    for pid in sorted(pids):
        try:
            cmd = " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            continue
        return f"pid {pid} ({cmd[:120]})"
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
