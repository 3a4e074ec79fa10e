"""The bad-input corpus: every case fails with one line (what, where, what to do), a non-zero exit, no
traceback and no exception class name, no process left behind, and its MLflow run (when one was opened)
FAILED."""

from __future__ import annotations

import re
import socket
import uuid
from pathlib import Path

import pytest
from conftest import FAST, processes_tagged, run_cli, stderr_lines

from runner.data.criteo import criteo_lines

pytestmark = [pytest.mark.slow, pytest.mark.faults]
CRITEO = ["data=criteo", "model=dlrm_criteo", "train.steps=20", "data.eval_batches=1"]

# (arguments, what the line must say); {d} is a folder of broken data files, {port} a port held by a listener.
# Cases refused before any job starts are checked in-process by tests/config/test_refusals.py; here, as the
# user runs them, one case per stage that refuses (pre-check, driver, store, workers) and those only a real
# job reaches. A plan refused inside the workers is tests/launch/test_launch.py's one-outcome test (the driver
# and a plain torchrun).
CASES = [
    (["cluster=3node"], "2node, gpu_1x8"),  # the pre-check
    (["-m", "sharding.storage_reserve_percent=0.1,2.0"], "sweep point"),  # the pre-check, every point of a sweep
    (["cluster.master_port={port}"], "in use"),
    ([*CRITEO, "data.path={d}/mid.tsv"], "mid.tsv line 3001 has 3 fields"),
    ([*CRITEO, "data.path={d}/mid.tsv", "data.num_workers=1"], "mid.tsv line 3001 has 3 fields"),
    (["tracking.uri=sqlite:////proc/nope/x.db"], "cannot be created"),
    (["mode=plan", "tracking.uri=sqlite:////proc/nope/x.db"], "cannot be created"),  # opened beside the planner
    (["tracking.uri=ftp://example.com/x"], "cannot open this store"),
    (["tracking.uri=http://127.0.0.1:9"], "no MLflow server answers"),
    (["train.resume=/nonexistent/ckpt"], "no such file or folder"),  # the driver's checks before launch
    (["sharding.plan={d}/empty.tsv"], "sharding.plan"),
    (["sharding.proposer=dynamic_programming"], "sharding.proposer"),
    (["sync", "{d}"], "not a run folder"),
]


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("broken")
    (d / "x.parquet").write_text("not parquet\n")
    (d / "empty.tsv").write_text("")
    (d / "short.tsv").write_text("1\t2\t3\n")
    (d / "mid.tsv").write_text(criteo_lines(3000) + "1\t2\t3\n" + criteo_lines(100))
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield d, held.getsockname()[1]


PARAMS = [pytest.param(a, says, id=" ".join(a)[:60])
          for a, says in CASES]


@pytest.mark.parametrize("args,says", PARAMS)
def test_bad_input_is_one_line(args: list, says: str, broken, store: str, tmp_path: Path) -> None:
    d, port = broken
    args = [a.format(d=d, port=port) for a in args]
    exp, tag = f"bad_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    extra = [] if args[0] == "sync" else [*FAST, f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path}",
                                          f"tracking.experiment={exp}"]
    if args[0] != "sync" and not any(a.startswith("tracking.uri=") for a in args):
        extra.append(f"tracking.uri={store}")
    proc = run_cli([*args, *extra] if args[0] != "sync" else args, timeout=180, tag=tag)
    assert proc.returncode != 0
    lines = stderr_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr[-3000:]
    line = lines[0]
    assert line.startswith("error: ") and says in line, line
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not re.search(r"\b[A-Z][a-z]+[A-Za-z]*(Error|Exception|Invalid)\b", line), line
    assert processes_tagged(tag) == []
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    experiment = client.get_experiment_by_name(exp)
    if experiment is not None:
        assert all(r.info.status == "FAILED" for r in client.search_runs([experiment.experiment_id]))
