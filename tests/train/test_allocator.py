"""A CPU worker's allocator keeps what it frees: a step's buffers, allocated anew each step, fault in once."""

from __future__ import annotations

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
