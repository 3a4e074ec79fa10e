"""Which failures are faults (worth running again: ``sweep.retries``) and which are the job's own answers."""

from __future__ import annotations

from pathlib import Path

from runner.launch.processes.supervisor import root_cause
from runner.runtime import run_files


def test_a_rank_killed_by_a_signal_is_a_fault_its_own_error_is_not(tmp_path: Path) -> None:
    killed, own = tmp_path / "killed", tmp_path / "own"
    # rank 1 killed (its agent says so), rank 0 then fails on the broken connection: the kill is the cause
    run_files.write_error(killed, "rank0", {"rank": 0, "time": 2.0, "error": "Connection closed by peer",
                                         "source": "worker"})
    run_files.write_error(killed, "agent0-rank1", {"rank": 1, "time": 1.0, "error": "killed by SIGKILL",
                                                "source": "agent", "signal": "SIGKILL", "node": 0})
    failure = root_cause(killed)
    assert failure.fault and str(failure) == "rank 1 on node 0 failed: killed by SIGKILL"
    # a rank that raised (its code, its config) is the job's answer: running it again gives the same
    run_files.write_error(own, "rank0", {"rank": 0, "time": 1.0, "error": "plan error: no sharding plan fits",
                                      "source": "worker"})
    failure = root_cause(own)
    assert not failure.fault and "no sharding plan fits" in str(failure)
    assert not root_cause(tmp_path / "nothing").fault


def test_a_rank_s_own_error_wins_over_the_sigabrt_it_causes_in_its_peers(tmp_path: Path) -> None:
    """Under NCCL, a rank that raises and exits makes the watchdog of every surviving rank abort it (SIGABRT),
    recorded by their agents after or even before the error: the raised error is the cause, not a fault."""
    for abort_time in (0.5, 3.0):  # the agent's record may carry an earlier time than the worker's own
        folder = tmp_path / str(abort_time)
        run_files.write_error(folder, "rank1", {"rank": 1, "time": 2.0, "source": "worker",
                                             "error": "config error: train.batch_size=0 must be positive"})
        run_files.write_error(folder, "agent0-rank0", {"rank": 0, "time": abort_time, "error": "killed by SIGABRT",
                                                    "source": "agent", "signal": "SIGABRT", "node": 0})
        failure = root_cause(folder)
        assert not failure.fault and str(failure) == "rank 1 failed: config error: train.batch_size=0 must be positive"
    # a rank that aborts by itself (a failed C++ check) records nothing else: it is named, as a fault
    alone = tmp_path / "alone"
    run_files.write_error(alone, "agent0-rank1", {"rank": 1, "time": 1.0, "error": "killed by SIGABRT",
                                               "source": "agent", "signal": "SIGABRT", "node": 0})
    run_files.write_error(alone, "agent0-rank0", {"rank": 0, "time": 1.5, "error": "killed by SIGTERM",
                                               "source": "agent", "signal": "SIGTERM", "node": 0})
    failure = root_cause(alone)
    assert failure.fault and str(failure) == "rank 1 on node 0 failed: killed by SIGABRT"


def test_a_failed_rank_ends_its_process_group_within_seconds(tmp_path: Path, monkeypatch) -> None:
    """After a failure a rank does not wait on its process group (NCCL's destroy can wait on peers' collectives
    until ``cluster.pg_timeout_s``): it ends the group, or gives up after a bound and exits with its error."""
    import time

    import torch.distributed as dist

    from runner.train.worker import end_process_group

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    assert end_process_group(failed=True) and not dist.is_initialized()  # a real group ends at once
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous2'}", rank=0, world_size=1)
    real = dist.destroy_process_group
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a: time.sleep(30))  # a peer that never answers
    t0 = time.monotonic()
    assert end_process_group(failed=True, within_s=0.5) is False
    assert time.monotonic() - t0 < 3
    monkeypatch.setattr(dist, "destroy_process_group", real)
    real()
