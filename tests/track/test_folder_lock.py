"""A sweep folder has one owner at a time: a live holder refuses others in one line naming it; a holder that
died leaves a lock that is taken over, with a line that says so."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.runtime import folder_lock
from runner.runtime.folder_lock import FolderBusy, hold

HOLD = ("import sys, time; from pathlib import Path; from runner.runtime.folder_lock import hold; "
        "hold(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)")


def test_a_live_holder_refuses_and_a_dead_one_is_taken_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(folder_lock, "_HELD", {})
    other = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        with pytest.raises(FolderBusy) as refused:
            hold(tmp_path)
        assert f"the sweep folder {tmp_path} is in use by process {other.pid}" in str(refused.value)
        assert "\n" not in str(refused.value) and "python -m runner resume" in str(refused.value)
    finally:
        other.send_signal(signal.SIGKILL)  # dies holding it: the kernel releases the lock
        other.wait(10)
    deadline = time.time() + 10
    while True:
        try:
            note = hold(tmp_path)
            break
        except FolderBusy:
            assert time.time() < deadline
            time.sleep(0.1)
    assert note == f"[runner] the sweep folder's lock was held by process {other.pid}, which is gone: taken over"
    assert hold(tmp_path) is None  # this process holds it already
