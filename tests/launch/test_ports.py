"""The rendezvous port check, in-process: a port a process listens on is refused in one line naming the
holder; a port an earlier job left in TIME_WAIT (a requeued Slurm job gets its first attempt's port back) is
free, as it is for torch's TCPStore."""

from __future__ import annotations

import os
import socket

import pytest

from runner.config.errors import ConfigError
from runner.launch.processes.ports import check_master_port


def test_a_listening_port_is_refused_naming_its_holder() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ConfigError) as err:
            check_master_port("127.0.0.1", port)
    line = str(err.value)
    assert f"cluster.master_port={port}" in line and "in use" in line and f"pid {os.getpid()}" in line


def test_a_port_left_in_time_wait_is_free() -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # the server side closes first: its end of the connection stays in TIME_WAIT
    client.close()
    server.close()
    with socket.socket() as plain:  # what the check did before: a bind without SO_REUSEADDR is refused
        with pytest.raises(OSError):
            plain.bind(("0.0.0.0", port))
    check_master_port("127.0.0.1", port)  # no listener: free
