"""A tracking store that cannot be reached or opened is refused in seconds, in one line, before any worker."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from conftest import FAST, processes_tagged, run_cli


@pytest.mark.slow
@pytest.mark.parametrize("uri, says", [
    ("http://127.0.0.1:9", "no MLflow server answers"),
    ("ftp://example.invalid/store", "MLflow cannot open this store"),
])
def test_unusable_store_fails_fast_in_one_line_and_leaves_no_process(uri: str, says: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    t0 = time.monotonic()
    proc = run_cli([*FAST, f"tracking.uri={uri}", f"hydra.run.dir={tmp_path}"], tag=tag, timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1 and elapsed < 15, (elapsed, proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: tracking error:"), proc.stderr
    assert f"tracking.uri={uri}" in lines[0] and says in lines[0] and "Exception" not in lines[0]
    assert not (tmp_path / "pids").exists()  # no worker started
    time.sleep(1)
    assert processes_tagged(tag) == []  # the prewarmed agent is gone too
