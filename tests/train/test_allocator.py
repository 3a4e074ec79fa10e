"""A CPU worker's allocator keeps what it frees: a step's buffers, allocated anew each step, fault in once."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STEPS = """
import json, resource, sys
from runner.runtime.allocator import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
faults = []
for step in range(8):  # a step's output buffer: 32 MiB allocated, written, freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffer = bytearray(32 << 20)
    for page in range(0, len(buffer), 4096):
        buffer[page] = 1
    del buffer
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": faults}))
"""


def _steps(how: str, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", STEPS, how], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    return json.loads(out.stdout)


def test_kept_buffers_fault_in_once_where_released_ones_fault_every_step() -> None:
    released, kept = _steps("release"), _steps("keep")
    assert kept["applied"] and not released["applied"]
    pages = (32 << 20) // 4096
    assert min(released["faults"][1:]) > pages // 2  # glibc unmaps a freed 32 MiB block: every step faults it in
    assert max(kept["faults"][1:]) < pages // 20  # kept mapped: the later steps touch pages already there


def test_the_users_own_allocator_settings_are_left_alone() -> None:
    assert not _steps("keep", MALLOC_MMAP_MAX_="65536")["applied"]


def test_memory_held_leaves_out_tensors_only_a_reference_cycle_keeps() -> None:
    """What a rank holds is read after Python's cycle collector: a 64 MiB tensor kept only by a reference cycle
    (as a timed lookup's output and its ids are) is garbage, not memory the job holds."""
    import torch

    from runner.train.evaluate import memory_now_bytes

    cpu = torch.device("cpu")
    gc_was = gc.isenabled()
    gc.disable()  # the cycle stays until memory_now_bytes collects it
    try:
        before = memory_now_bytes(cpu)
        cycle: list = [torch.ones(16 << 20)]  # 64 MiB, written
        cycle.append(cycle)
        del cycle
        after = memory_now_bytes(cpu)
        kept = [torch.ones(16 << 20)]
        held = memory_now_bytes(cpu)
    finally:
        if gc_was:
            gc.enable()
    assert after - before < 8 << 20, (before, after)
    assert held - before > 56 << 20, (before, held)  # a tensor still referenced is held
    del kept
