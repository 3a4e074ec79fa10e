"""A single plan-only job plans in a fork while its driver opens the run (:func:`runner.launch.job.plan_only.
plan_beside`): what the fork answers comes back as the job would have seen it in one process."""

from __future__ import annotations

import os
import signal
import time
import weakref

import pytest

from runner.config.errors import ConfigError, SchedulerError, WorkerFailure
from runner.runtime import signals
from runner.runtime.process_end import answer_of, fork_answer, keep_until_exit


def _gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_a_forked_answer_comes_back_as_its_value_its_error_or_how_its_process_ended() -> None:
    def slow() -> dict:
        time.sleep(0.4)
        return {"plan_status": "feasible", "est_step_ms": 38.062}

    calls: list = []
    pid, fd = fork_answer(slow)
    assert answer_of(pid, fd, lambda: calls.append(1), every_s=0.05) == {"plan_status": "feasible",
                                                                         "est_step_ms": 38.062}
    assert len(calls) >= 3 and _gone(pid)  # the driver's work went on meanwhile; the process reaped

    def refused() -> None:
        raise ConfigError("sharding.proposer", "nope", "one of balanced, dynamic_programming")

    pid, fd = fork_answer(refused)
    with pytest.raises(ConfigError, match=r"^sharding.proposer='nope' is not allowed") as info:
        answer_of(pid, fd, lambda: None)
    assert info.value.key == "sharding.proposer"  # the same error, as the job's one line is made from it
    assert any("in refused" in note for note in info.value.__notes__)  # where the fork raised it

    def with_state() -> None:
        raise SchedulerError("slurm: no partition named gpu", scheduler="slurm")

    pid, fd = fork_answer(with_state)
    with pytest.raises(SchedulerError) as state:
        answer_of(pid, fd, lambda: None)
    assert state.value.scheduler == "slurm"

    def unpicklable() -> None:
        class Local(Exception):  # a class pickle cannot name
            pass

        raise Local("the planner's own error")

    pid, fd = fork_answer(unpicklable)
    with pytest.raises(RuntimeError, match="Local: the planner's own error"):
        answer_of(pid, fd, lambda: None)

    pid, fd = fork_answer(lambda: os.kill(os.getpid(), signal.SIGKILL))  # e.g. the OOM killer
    killed = r"^the planner \(pid \d+\) ended with no answer: killed by SIGKILL"
    with pytest.raises(WorkerFailure, match=killed) as dead:
        answer_of(pid, fd, lambda: None, name="the planner")
    assert dead.value.fault  # not the job's own error: a sweep's retry may run it
    assert _gone(pid)


def test_a_forked_process_stopped_or_given_up_on_ends_as_a_stop_and_is_never_left_behind() -> None:
    pid, fd = fork_answer(lambda: os.kill(os.getpid(), signal.SIGTERM))  # a stop sent to it alone
    with pytest.raises(signals.Stopped) as stop:
        answer_of(pid, fd, lambda: None)
    assert stop.value.signum == signal.SIGTERM and _gone(pid)

    def stopped() -> None:
        raise signals.Stopped(signal.SIGHUP)

    pid, fd = fork_answer(stopped)  # the runner's stop, raised there: the same stop here (it pickles by number)
    with pytest.raises(signals.Stopped) as raised:
        answer_of(pid, fd, lambda: None)
    assert raised.value.signum == signal.SIGHUP

    def boom() -> None:
        raise OSError("the store went away")

    pid, fd = fork_answer(lambda: time.sleep(60))  # this side fails while it works: killed and reaped at once
    t0 = time.monotonic()
    with pytest.raises(OSError, match="the store went away"):
        answer_of(pid, fd, boom)
    assert _gone(pid) and time.monotonic() - t0 < 10


class _Plan:
    """Stands for a chosen plan's objects (a weak reference says whether they are still alive)."""


def test_a_forked_answer_keeps_what_it_is_asked_to_until_it_exits_and_this_process_does_not() -> None:
    def work() -> bool:
        plan = _Plan()
        alive = weakref.ref(plan)
        keep_until_exit(plan)
        del plan
        return alive() is not None

    pid, fd = fork_answer(work)
    assert answer_of(pid, fd, lambda: None) is True
    assert work() is False  # here (no fork_answer process) nothing is kept: freed as usual


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_helper_fork_that_cannot_be_made_leaves_all_the_work_here_and_nothing_open(monkeypatch) -> None:
    from runner.plan.torchrec_adapter import parallel_estimates

    class Option:
        def __init__(self) -> None:
            self.shards: list = []

    class Estimator:
        def estimate(self, chunk: list, **_: object) -> None:
            for option in chunk:
                option.estimated = True

    def no_fork() -> int:
        raise OSError(11, "Resource temporarily unavailable")

    options = [Option() for _ in range(10)]
    monkeypatch.setattr(parallel_estimates, "may_fork", lambda: True)
    monkeypatch.setattr(os, "fork", no_fork)
    before = _open_fds()
    parallel_estimates.estimate([Estimator()], options, {}, fork_min=2)
    assert all(getattr(o, "estimated", False) for o in options) and _open_fds() == before


def test_a_bound_fork_stopped_alone_leaves_the_bound_to_this_process() -> None:
    from types import SimpleNamespace

    import numpy as np

    from runner.plan.torchrec_adapter.balanced import bound as bound_ahead
    from runner.plan.torchrec_adapter.balanced.problem import Problem

    device = SimpleNamespace(storage=SimpleNamespace(hbm=8, ddr=0, ssd=0))
    reserved = SimpleNamespace(devices=[device, device], local_world_size=2)
    space: list = []
    bound_ahead.start_bound(space, Problem([], np.array([[8, 0, 0]] * 2), 2), lambda _: (time.sleep(60), (1.0, ""))[1])
    os.kill(bound_ahead._AHEAD[2], signal.SIGTERM)  # the helper alone (a stop signal: at its default there)
    assert bound_ahead.taken(space, reserved) is None and not bound_ahead._AHEAD


def test_a_fork_keeps_a_stop_signal_this_process_ignores_ignored_and_the_others_at_their_defaults() -> None:
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        pid, fd = fork_answer(lambda: (signal.getsignal(signal.SIGHUP), signal.getsignal(signal.SIGTERM)))
        assert answer_of(pid, fd, lambda: None) == (signal.SIG_IGN, signal.SIG_DFL)
    finally:
        signal.signal(signal.SIGHUP, before)


def test_an_estimating_fork_is_ended_and_reaped_where_this_process_s_half_fails(monkeypatch) -> None:
    from runner.plan.torchrec_adapter import parallel_estimates

    class Option:
        def __init__(self) -> None:
            self.shards: list = []

    here = os.getpid()
    started: list = []
    real_fork = os.fork

    def fork() -> int:
        pid = real_fork()
        if pid:
            started.append(pid)
        return pid

    class Estimator:
        def estimate(self, chunk: list, **_: object) -> None:
            if os.getpid() == here:
                raise RuntimeError("an estimator failed")
            time.sleep(60)  # the fork's half: would outlive the plan if left

    monkeypatch.setattr(parallel_estimates, "may_fork", lambda: True)
    monkeypatch.setattr(os, "fork", fork)
    before = _open_fds()
    with pytest.raises(RuntimeError, match="an estimator failed"):
        parallel_estimates.estimate([Estimator()], [Option() for _ in range(10)], {}, fork_min=2)
    assert len(started) == 1 and _gone(started[0]) and _open_fds() == before
