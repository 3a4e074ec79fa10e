"""Core binding of CPU workers: each worker of a host gets its own slice of the allowed cores."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from runner.runtime.affinity import GLOO_LOOP, host_slot, threads_per_worker, worker_cores


def test_each_worker_gets_its_own_slice_of_the_allowed_cores() -> None:
    allowed = [2, 3, 5, 7, 8, 9, 10, 11]  # e.g. a taskset/cgroup limit
    slices = [worker_cores(s, 4, allowed) for s in range(4)]
    assert slices == [[2, 3], [5, 7], [8, 9], [10, 11]]
    assert worker_cores(0, 3, allowed) == [2, 3] and worker_cores(2, 3, allowed) == [8, 9]  # 2 cores left over
    assert worker_cores(0, 3, [0, 1]) is None  # fewer cores than workers: nothing bound
    assert threads_per_worker(None, 4, slices[1]) == 2 and threads_per_worker(3, 4, slices[1]) == 3


def test_host_slots_are_distinct_for_emulated_and_real_nodes() -> None:
    # 2 emulated nodes x 2 workers on one host: ranks 0..3, local ranks 0..1 twice
    assert sorted(host_slot(rank, rank % 2, 2, 4) for rank in range(4)) == [0, 1, 2, 3]
    # one node per host: the local rank
    assert [host_slot(rank, local, 2, 2) for rank, local in ((6, 0), (7, 1))] == [0, 1]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_bind_applies_to_existing_and_later_threads() -> None:
    code = """
import os, threading
from runner.runtime.affinity import bind
seen = {}
ready, go = threading.Event(), threading.Event()
def early():
    ready.set(); go.wait(); seen['early'] = sorted(os.sched_getaffinity(0))
t = threading.Thread(target=early); t.start(); ready.wait()
core = sorted(os.sched_getaffinity(0))[-1]
bind([core])
late = threading.Thread(target=lambda: seen.__setitem__('late', sorted(os.sched_getaffinity(0)))); late.start()
go.set(); t.join(); late.join()
print(core, seen['early'], seen['late'], sorted(os.sched_getaffinity(0)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(" ", 1)
    core = int(out[0])
    assert out[1].strip() == f"[{core}] [{core}] [{core}]"


def test_gloo_event_loops_are_lowered_and_nothing_else() -> None:
    """cluster.gloo_loop_priority=low: every gloo event loop of the process at nice 19, also a later
    group's; the training thread and gloo's collective threads keep their priority."""
    code = """
import os, tempfile, time, torch.distributed as dist
from runner.runtime.affinity import gloo_loops, lower_gloo_loops
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
first = lower_gloo_loops(expect=1)
dist.new_group(backend="gloo")  # a second group: its own event loop, at normal priority until lowered
deadline = time.monotonic() + 10
while len(gloo_loops()) < 2 and time.monotonic() < deadline:  # a new loop names itself once it runs
    time.sleep(0.005)
before = sorted(os.getpriority(os.PRIO_PROCESS, t) for t in gloo_loops())
second = lower_gloo_loops(expect=2)
for t in os.listdir("/proc/self/task"):
    print(open(f"/proc/self/task/{t}/comm").read().strip(), os.getpriority(os.PRIO_PROCESS, int(t)))
print("counts", first, second, before)
"""
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert lines[-1] == "counts 1 2 [0, 19]"
    nice = [line.rsplit(" ", 1) for line in lines[:-1]]
    assert sorted(int(n) for name, n in nice if name == GLOO_LOOP) == [19, 19]
    assert {int(n) for name, n in nice if name != GLOO_LOOP} == {0}
    assert any(name == "pt_gloo_runloop" for name, _ in nice)


def test_a_cuda_worker_is_bound_to_its_gpus_socket() -> None:
    """The cores of a GPU's socket, from its PCI device's local_cpulist, within the cores the job may use."""
    from runner.runtime.affinity import gpu_local_cores

    allowed = list(range(0, 96))
    assert gpu_local_cores("0-23,48-71\n", allowed) == [*range(0, 24), *range(48, 72)]
    assert gpu_local_cores("24-47,72-95", list(range(40, 60))) == list(range(40, 48))  # a job's slice
    assert gpu_local_cores("", allowed) == allowed  # no list (not Linux, a virtual GPU): every allowed core
    assert gpu_local_cores("0-3", [8, 9]) == [8, 9]  # none of the socket's cores allowed: the allowed ones


def test_the_plan_chart_is_drawn_beside_training_only_on_a_core_the_workers_leave() -> None:
    """matplotlib's second of one core, drawn while the workers train, came out of a short job's timed steps on 2
    cores with 2 workers (14.2-14.4 ms a step against 10.4-10.8): there it waits for the job's end."""
    from runner.launch.job.driver import chart_beside_training

    cores = len(os.sched_getaffinity(0))
    assert not chart_beside_training(cores, 1) and not chart_beside_training(1, cores)
    assert chart_beside_training(cores - 1, 1) == (cores > 1)
