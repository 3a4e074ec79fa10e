"""Does the installed TorchRec behave as the runner's planner expects? Asked once per stack, remembered.

The runner's planner gives TorchRec's answers faster (:mod:`.compact_enumeration`, :mod:`.dp_proposer`,
:mod:`.greedy_proposers`, :mod:`.grid_search`). On a TorchRec it was not tested with, :func:`verdict` runs the
conformance check (:mod:`runner.launch.conformance_check`: the compact enumeration and each TorchRec-named
proposer against TorchRec's own, on a small built-in problem) in a subprocess of its own, so that this process
imports no adapter module when it fails and a running Hydra app is left alone, and remembers the answer per
stack and adapter source in the user's cache folder (``$XDG_CACHE_HOME/runner/``, or ``~/.cache/runner/``): a stack pays
for it once (about 10 s with the subprocess's imports). Imports nothing at module level but the standard library.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Tuple

_ADAPTER = Path(__file__).resolve().parent
_ROOT = _ADAPTER.parents[2]
_CHECK = "runner.launch.conformance_check"
CHECKING = "RUNNER_CONFORMANCE_CHECKING"
"""Set in the check's own process: its planners are the runner's, whatever the version (what it checks)."""


def stack_key() -> str:
    """The installed torch, FBGEMM and TorchRec, and a digest of the adapter's source: what a verdict is for."""
    from importlib import metadata

    def version(*dists: str) -> str:
        for d in dists:
            with contextlib.suppress(metadata.PackageNotFoundError):
                return metadata.version(d)
        return "none"
    sources = [*sorted(_ADAPTER.rglob("*.py")), _ROOT / "runner" / "launch" / "conformance_check.py"]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:12]
    return (f"torchrec-{version('torchrec')}_fbgemm-{version('fbgemm-gpu', 'fbgemm-gpu-cpu')}"
            f"_torch-{version('torch')}_adapter-{digest}")


def cache_folder() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "runner" / "torchrec-conformance"


def _remembered(path: Path) -> Optional[Tuple[bool, str]]:
    try:
        found = json.loads(path.read_text())
        return bool(found["passed"]), str(found["reason"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def verdict(say: Callable[[str], None]) -> Tuple[bool, str]:
    """(passed, reason) for the installed stack: remembered, or checked now in a subprocess (``say`` gets one
    line first: the check takes a few seconds). Several processes asking at once run it once (a file lock)."""
    folder = cache_folder()
    path = folder / f"{stack_key()}.json"
    found = _remembered(path)
    if found is not None:
        return found
    lock: Optional[Any] = None
    with contextlib.suppress(OSError):  # a read-only home: checked, not remembered
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / ".lock", "w")  # noqa: SIM115  (held until the answer is written)
    try:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
            found = _remembered(path)
            if found is not None:
                return found
        say("checking the installed TorchRec against the runner's planner (once per stack, a few seconds)")
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", _CHECK], cwd=_ROOT, capture_output=True, text=True,
                              timeout=600, env={**os.environ, "CUDA_VISIBLE_DEVICES": "", CHECKING: "1"})
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        passed = proc.returncode == 0
        reason = (lines[-1] if lines else f"the check exited {proc.returncode}: "
                  + (proc.stderr.strip().splitlines() or ["no output"])[-1])
        result = {"passed": passed, "reason": reason, "seconds": round(time.monotonic() - start, 1)}
        if lock is not None:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(result))
            tmp.replace(path)
        return passed, reason
    finally:
        if lock is not None:
            lock.close()

