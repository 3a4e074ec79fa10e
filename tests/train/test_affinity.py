"""Core binding of CPU workers: each worker of a host gets its own slice of the allowed cores."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from runner.runtime.affinity import host_slot, threads_per_worker, worker_cores


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
