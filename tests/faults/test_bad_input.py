"""The bad-input corpus: every case fails with one line (what, where, what to do), a non-zero exit, no
traceback and no exception class name, no process left behind, and its MLflow run (when one was opened)
FAILED."""

from __future__ import annotations

import re
import socket
import uuid
from pathlib import Path

import pytest
from conftest import CPU_ONLY, FAST, processes_tagged, run_cli, stderr_lines

from runner.data.criteo import criteo_lines

pytestmark = pytest.mark.slow
CRITEO = ["data=criteo", "model=dlrm_criteo", "train.steps=20", "data.eval_batches=1"]

# (arguments, what the line must say); {d} is a folder of broken data files, {port} a port held by a listener
CASES = [
    (["sharding.storage_reserve_percent=1.5"], "[0, 1)"),
    (["cluster=3node"], "2node, gpu_1x8"),
    (["cluster.intra_node_bandwidth=-1"], "cluster.intra_node_bandwidth"),
    (["train.steps=abc"], "expected an integer"),
    (["sharding.types=[diagonal]"], "row_wise"),
    (["optimizer.sparse=adam"], "rowwise_adagrad"),
    (["train.no_such_key=1"], "train.no_such_key"),
    (["experiment=nope"], "experiment='nope' is not an option"),
    (["sharding.constraints.t0.sharding_types=[row_wise]"], "+sharding.constraints.t0.sharding_types"),
    (["+sharding.constraints.t99.sharding_types=[row_wise]"], "sharding.constraints.t99"),
    (["train.grad_accumulation_steps=0"], "train.grad_accumulation_steps"),
    (["train.pipeline=async"], "train.pipeline"),
    (["precision.autocast=float8"], "precision.autocast"),
    (["data.name=csv"], "data.name"),
    (["cluster.start_method=forkserver"], "cluster.start_method"),
    (["model=mmoe", "model.tasks=[a,a]"], "model.tasks"),
    (["cluster.workers_per_node=0"], "cluster.workers_per_node"),
    (["-m", "sharding.storage_reserve_percent=0.1,2.0"], "sweep point"),
    (["cluster.device=cuda"], "cuda"),
    (["precision.tf32=true"], "precision.tf32"),
    (["cluster.master_port={port}"], "in use"),
    (["data=parquet", "data.path={d}/none"], "none found"),
    (["data=parquet", "data.path={d}/x.parquet"], "is not a Parquet file"),
    ([*CRITEO, "data.path={d}/empty.tsv"], "empty"),
    ([*CRITEO, "data.path={d}/short.tsv"], "line 1 has 3 fields"),
    ([*CRITEO, "data.path={d}/mid.tsv"], "mid.tsv line 3001 has 3 fields"),
    ([*CRITEO, "data.path={d}/mid.tsv", "data.num_workers=1"], "mid.tsv line 3001 has 3 fields"),
    (["data=parquet"], "data.path"),
    (["tracking.uri=sqlite:////proc/nope/x.db"], "cannot be created"),
    (["tracking.uri=ftp://example.com/x"], "cannot open this store"),
    (["tracking.uri=http://127.0.0.1:9"], "no MLflow server answers"),
    (["train.resume=/nonexistent/ckpt"], "no such file or folder"),
    (["train.resume=latest", "train.checkpoint.dir={d}"], "no complete checkpoint"),
    (["sharding.plan={d}/empty.tsv"], "sharding.plan"),
    (["cluster.ddr_cap_gib=0.001"], "no sharding plan"),
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


ON_CPU_ONLY = {"optimizer.sparse=adam", "cluster.device=cuda", "precision.tf32=true"}  # allowed on a GPU host
PARAMS = [pytest.param(a, says, id=" ".join(a)[:60], marks=[CPU_ONLY] if " ".join(a) in ON_CPU_ONLY else [])
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
