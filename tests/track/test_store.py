"""A tracking store that cannot be reached or opened is refused in seconds, in one line, before any worker;
one that can holds every run of jobs started at once (a sweep against a server: test_remote_tracking.py)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from conftest import FAST, ROOT, processes_tagged, run_cli

from runner.track.store import PROBE_TIMEOUT_S


def _import_floor() -> float:
    """The benchmarks' import floor (``python -c "import torchrec.distributed.planner, mlflow, hydra"``, s), now."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from plan_scale import import_floor

    return import_floor()


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
    assert proc.returncode == 1, proc.stderr[-2000:]
    # refused by the store's probe (PROBE_TIMEOUT_S), not after MLflow's retries (over a minute): within 15 s, or
    # on a slow day within twice the time this machine takes to import the job's libraries, measured now
    assert elapsed < 15 or elapsed < 2 * _import_floor() + PROBE_TIMEOUT_S, (elapsed, proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: tracking error:"), proc.stderr
    assert f"tracking.uri={uri}" in lines[0] and says in lines[0] and "Exception" not in lines[0]
    assert not (tmp_path / "pids").exists()  # no worker started
    time.sleep(1)
    assert processes_tagged(tag) == []  # the prewarmed agent is gone too


@pytest.mark.slow
def test_jobs_started_together_on_a_new_sqlite_store_all_run(tmp_path: Path) -> None:
    """MLflow creates and migrates a SQLite schema in each process: two jobs started at once on a new file
    must not race (they did: duplicate tables, half-done migrations). Plan-only jobs: the race is in opening
    the store, which every mode does first."""
    import os
    import subprocess
    import sys

    from conftest import ROOT, runs

    uri = f"sqlite:///{tmp_path / 'new.db'}"
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri, PYTHONUNBUFFERED="1")
    procs = [subprocess.Popen([sys.executable, "-m", "runner", "mode=plan", "tracking.experiment=together",
                               f"hydra.run.dir={tmp_path / str(i)}"], cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-1500:] for _, err in outs]
    assert sorted(r.info.status for r in runs(uri, "together")) == ["FINISHED"] * 2


def test_the_ui_hint_names_an_mlflow_this_machine_has(tmp_path: Path, monkeypatch) -> None:
    """The venv's ``mlflow`` beside the running Python; on a box whose packages are on PYTHONPATH (no script
    anywhere), ``<python> -m mlflow``, which runs there."""
    import subprocess
    import sys

    from runner.track.ui_links import ui_command

    real = sys.executable
    assert ui_command("sqlite:///x.db") == f"{Path(real).parent / 'mlflow'} ui --backend-store-uri sqlite:///x.db"
    bare = tmp_path / "bin" / "python"
    bare.parent.mkdir()
    bare.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(bare))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    command = ui_command("sqlite:///x.db")
    assert command == f"{bare} -m mlflow ui --backend-store-uri sqlite:///x.db"
    # what that form runs, with this Python (a copy outside its venv would not see the venv's packages)
    version = subprocess.run([real, "-m", "mlflow", "--version"], capture_output=True, text=True, timeout=120)
    assert version.returncode == 0 and "version" in version.stdout
