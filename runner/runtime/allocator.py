"""A CPU worker's host allocator, told to keep the memory it frees, as PyTorch's caching allocator does on a GPU.

Every training step allocates its buffers anew: the lookups' pooled output, the all-to-all's receive tensor, the
concatenated features. glibc's malloc hands large freed blocks back to the operating system (blocks it mapped on
their own, and the heap's top past its trim threshold), so each step maps the same sizes in again and pays a page
fault per page at first touch: 40-75% of a many-table forward on CPU (docs/calibration.md). Kept, the pages stay
mapped from one step to the next; a step's buffers are what they were, they are only not given back between
steps (:func:`give_back_freed_memory` does, where the memory a process holds is read). A worker's calibration is
measured the same way, so its constants hold for the jobs that plan with them.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's <malloc.h>
KEEP_UP_TO_BYTES = 2**31 - 1  # the largest trim threshold: freed memory at the heap's top stays mapped
USERS_OWN = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")


KEPT, AS_SET = "keeps freed memory", "as the environment sets it"


def host_allocator(device_kind: str) -> str:
    """How a worker of ``device_kind`` treats freed host memory, for the hardware's fingerprint: a calibration is
    only valid for jobs whose steps fault the same way."""
    if device_kind != "cpu" or any(os.environ.get(name) for name in USERS_OWN) or _libc("mallopt") is None:
        return AS_SET
    return KEPT


def _libc(name: str) -> Any:
    """glibc's allocator function ``name``; None where the C library has none."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):  # not glibc
        return None


def give_back_freed_memory() -> None:
    """Hand what the allocator keeps back to the operating system now (``malloc_trim(0)``, which applies whatever
    the trim threshold): before the resident memory is read as what the process holds."""
    trim = _libc("malloc_trim")
    if trim is not None:
        trim(0)


def keep_freed_memory() -> bool:
    """Large blocks from the heap rather than mappings of their own, and the heap not trimmed below
    :data:`KEEP_UP_TO_BYTES`; True where applied. Left as it is where the environment sets glibc's allocator itself
    (``MALLOC_*_``, ``GLIBC_TUNABLES``) or the C library has no ``mallopt``."""
    if host_allocator("cpu") != KEPT:
        return False
    mallopt = _libc("mallopt")
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_UP_TO_BYTES))
