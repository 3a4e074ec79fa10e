"""Which failures are faults (worth running again: ``sweep.retries``) and which are the job's own answers."""

from __future__ import annotations

from pathlib import Path

from runner.launch.supervisor import root_cause
from runner.runtime import rundir


def test_a_rank_killed_by_a_signal_is_a_fault_its_own_error_is_not(tmp_path: Path) -> None:
    killed, own = tmp_path / "killed", tmp_path / "own"
    # rank 1 killed (its agent says so), rank 0 then fails on the broken connection: the kill is the cause
    rundir.record_error(killed, "rank0", {"rank": 0, "time": 2.0, "error": "Connection closed by peer",
                                          "source": "worker"})
    rundir.record_error(killed, "agent0-rank1", {"rank": 1, "time": 1.0, "error": "killed by SIGKILL",
                                                 "source": "agent", "signal": "SIGKILL", "node": 0})
    failure = root_cause(killed)
    assert failure.fault and str(failure) == "rank 1 on node 0 failed: killed by SIGKILL"
    # a rank that raised (its code, its config) is the job's answer: running it again gives the same
    rundir.record_error(own, "rank0", {"rank": 0, "time": 1.0, "error": "plan error: no sharding plan fits",
                                       "source": "worker"})
    failure = root_cause(own)
    assert not failure.fault and "no sharding plan fits" in str(failure)
    assert not root_cause(tmp_path / "nothing").fault
