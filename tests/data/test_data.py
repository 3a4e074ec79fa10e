"""Data sources: Parquet and Criteo readers split rows over ranks and dataloader workers; uneven ends stop
every rank together; the write command and both sources train end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FAST, ROOT, finished_run, forkserver, metric_history, run_cli, runs, stderr_lines
from omegaconf import OmegaConf

from runner.config.errors import DataError
from runner.config.schema import RunnerConfig
from runner.data.criteo import CriteoSource, criteo_lines, hex_to_int
from runner.data.layout import Layout, job_data
from runner.data.parquet import ParquetSource
from runner.data.pipeline import Prefetcher
from runner.data.writer import write_parquet

CRITEO_LAYOUT = Layout(("label",), 13, tuple(f"C{i}" for i in range(1, 27)), tuple([1000] * 26))


def small_cfg(rows_per_table: int = 1000, tasks: tuple = ("label",)):
    return OmegaConf.merge(OmegaConf.structured(RunnerConfig), {
        "model": {"tables": [{"name": f"t{i}", "num_embeddings": rows_per_table} for i in range(3)],
                  "tasks": list(tasks)},
        "data": {"ids_per_feature": 2, "variable_lengths": True}})


def read_all(ds_for_rank, world: int, workers: int) -> list[list]:
    """Every rank's batches through a real DataLoader with ``workers`` processes."""
    out = []
    for rank in range(world):
        ds = ds_for_rank(rank)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
        out.append(list(loader))
    return out


def test_hex_hashing() -> None:
    assert hex_to_int(["0", "ff", "", "7fffffff", "FFFFFFFFFFFFFFFF"]).tolist() == [0, 255, 0, 2**31 - 1, 2**64 - 1]


def test_parquet_rows_split_evenly_over_ranks_and_workers(tmp_path: Path) -> None:
    cfg = small_cfg(tasks=("click", "conversion"))
    write_parquet(job_data(cfg), tmp_path, rows=1000, files=3, eval_rows=64)


    lay = job_data(cfg).layout
    batches = read_all(lambda r: ParquetSource(str(tmp_path / "train"), lay, 50, r, 2, 2, True), world=2,
                       workers=2)
    # 2 ranks x 2 workers = 4 shards of 250 rows: 5 batches of 50 each, every row exactly once
    assert [len(b) for b in batches] == [10, 10]
    seen = torch.cat([b.dense_features[:, 0] for rank in batches for b in rank])
    import pyarrow.parquet as pq

    everything = np.concatenate([pq.read_table(f).column("dense_0").to_numpy()
                                 for f in sorted((tmp_path / "train").glob("*.parquet"))])
    assert sorted(seen.tolist()) == sorted(everything.tolist())
    b = batches[0][0]
    assert b.labels.shape == (50, 2) and b.dense_features.shape == (50, 13)
    assert b.sparse_features.keys() == ["t0", "t1", "t2"]
    lengths = b.sparse_features.lengths()
    assert lengths.min() >= 1 and lengths.max() <= 3 and lengths.float().mean() > 1.2  # multi-hot kept
    # the shard of (rank 1, worker 0) is rows 500..749 in file order
    (first,) = read_all(lambda r: ParquetSource(str(tmp_path / "train"), lay, 250, 1, 2, 2, True), world=1,
                        workers=0)
    assert torch.equal(first[0].dense_features[:, 0], torch.from_numpy(everything[500:750]))


def test_parquet_ids_out_of_range_need_hashing(tmp_path: Path) -> None:
    write_parquet(job_data(small_cfg(rows_per_table=1000)), tmp_path, rows=200, files=1, eval_rows=8)


    lay = job_data(small_cfg(rows_per_table=10)).layout  # the files hold ids up to 999
    hashed = next(iter(ParquetSource(str(tmp_path / "train"), lay, 100, 0, 1, 0, True)))
    assert hashed.sparse_features.values().max() < 10
    with pytest.raises(DataError, match=r"part-00000.parquet row \d+, column t\d: \d+; expected an id in \[0, 10\)"):
        next(iter(ParquetSource(str(tmp_path / "train"), lay, 100, 0, 1, 0, False)))


@pytest.mark.parametrize("block_bytes", [4 << 20, 97], ids=["4MiB-blocks", "97-byte-blocks"])
def test_criteo_lines_split_by_bytes_each_read_once(tmp_path: Path, block_bytes: int) -> None:
    (tmp_path / "day_0").write_text(criteo_lines(300, seed=1))
    (tmp_path / "day_1").write_text(criteo_lines(200, seed=2))

    def shard(rank: int) -> CriteoSource:
        src = CriteoSource(str(tmp_path), CRITEO_LAYOUT, 1, rank, 3, 1, True)
        src.block_bytes = block_bytes  # lines cross block ends (97 bytes is shorter than any line)
        return src

    batches = read_all(shard, world=3, workers=0)
    assert sum(len(b) for b in batches) == 500  # every line once, none split between shards
    counts = [len(b) for b in batches]
    assert max(counts) - min(counts) < 40  # byte ranges: close to even, not exactly
    lines = [ln.split("\t") for f in ("day_0", "day_1") for ln in (tmp_path / f).read_text().splitlines()]
    want = sorted((int(c[0]), int(c[14] or "0", 16) % 1000) for c in lines)
    got = sorted((int(b.labels.item()), b.sparse_features["C1"].values().item()) for r in batches for b in r)
    assert got == want
    text = (tmp_path / "day_0").read_text().splitlines()[0].split("\t")
    first = batches[0][0]
    assert first.labels.item() == int(text[0])
    assert first.dense_features[0, 1].item() == pytest.approx(np.log1p(max(int(text[2] or 0), 0)), rel=1e-6)
    expected_c1 = int(text[14] or "0", 16) % 1000
    assert first.sparse_features["C1"].values().item() == expected_c1


def criteo_model_overrides() -> list[str]:
    tables = ",".join(f"{{name:C{i},num_embeddings:500}}" for i in range(1, 27))
    return ["model=dlrm_criteo", f"model.tables=[{tables}]", "model.embedding_dim=16",
            "model.dense_arch_layer_sizes=[32,16]", "model.over_arch_layer_sizes=[32,1]"]


@pytest.mark.slow
def test_criteo_trains_and_uneven_ends_stop_every_rank(store: str, tmp_path: Path) -> None:
    data = tmp_path / "criteo"
    data.mkdir()
    # long lines first, short ones (many missing values) after: equal byte ranges hold unequal line counts
    (data / "day_0").write_text(criteo_lines(1200, seed=3, missing=0.0) + criteo_lines(1200, seed=4, missing=0.9))
    # how many full batches of 64 each rank's byte range holds: the job must stop after the smallest
    per_rank = [sum(1 for _ in CriteoSource(str(data), CRITEO_LAYOUT, 64, r, 2, 1, True)) for r in range(2)]
    assert per_rank[0] != per_rank[1], "the test file should end unevenly across the two ranks"
    proc = run_cli(["train.steps=1000", "train.log_every=5", "train.batch_size=64", "data=criteo",
                    f"data.path={data}", "data.num_workers=1", "data.eval_batches=2", *criteo_model_overrides(),
                    f"tracking.uri={store}", "tracking.experiment=criteo", f"hydra.run.dir={tmp_path / 'run'}"],
                   timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"data ended after step {min(per_rank)} of 1000" in proc.stdout
    (run,) = runs(store, "criteo")
    assert run.info.status == "FINISHED"
    assert run.data.tags["runner.data_ended_at_step"] == str(min(per_rank))
    losses = metric_history(store, run.info.run_id, "train/loss")
    assert losses[-1] < losses[0]
    assert run.data.metrics["eval/samples"] == 2 * 2 * 64
    assert (tmp_path / "run" / "checkpoints" / f"step-{min(per_rank):08d}").is_dir()


@pytest.mark.slow
def test_write_parquet_then_train_on_it(store: str, tmp_path: Path) -> None:
    out = tmp_path / "clicks"
    proc = run_cli(["mode=write_data", "data=parquet", f"data.path={out}", "data.write_rows=8000",
                    "data.write_files=3", "data.write_eval_rows=1024"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list((out / "train").glob("*.parquet"))) == 3 and "train on it: python -m runner" in proc.stdout
    proc, run = finished_run(store, "parquet", tmp_path / 'run', [
            *FAST, "data=parquet", f"data.path={out / 'train'}", f"data.eval_path={out / 'eval'}",
            "data.num_workers=2"])
    losses = metric_history(store, run.info.run_id, "train/loss")
    # 8000 rows / (2 ranks x 2 workers) = 2000 rows per worker = 15 batches of 128; 30 steps fit exactly
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert "runner.data_ended_at_step" not in run.data.tags
    assert run.data.metrics["eval/auc"] > 0.6 and run.data.params["data.name"] == "parquet"
    local = {d.tags[0].value: d.dataset for d in run.inputs.dataset_inputs}  # context -> dataset
    assert (local["train"].name, local["eval"].name) == ("train", "eval")
    assert str(out / "train") in local["train"].source
    assert '"name": "dense_0"' in local["train"].schema and local["train"].digest != local["eval"].digest

    # the same files in an object store: a real S3-speaking server (moto's), read through pyarrow's S3 filesystem
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    from runner.launch.processes.ports import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
        s3 = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", region="us-east-1",
                               access_key="testing", secret_key="testing", allow_bucket_creation=True)
        s3.create_dir("clicks-bucket")
        pafs.copy_files(str(out), "clicks-bucket/days", source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=s3)
        _, remote = finished_run(store, "parquet_s3", tmp_path / "run_s3", [
            *FAST, "data=parquet", "data.path=s3://clicks-bucket/days/train", "data.eval_path=s3://clicks-bucket/days/eval",
            "data.num_workers=2"], env_extra=env)
    finally:
        server.stop()
    assert metric_history(store, remote.info.run_id, "train/loss") == losses  # the same rows, ranks and workers
    assert remote.data.metrics["eval/auc"] == run.data.metrics["eval/auc"]
    inputs = {d.tags[0].value: d.dataset for d in remote.inputs.dataset_inputs}
    assert "s3://clicks-bucket/days/train" in inputs["train"].source and inputs["train"].schema == local["train"].schema


@pytest.mark.slow
def test_missing_data_path_fails_in_one_line(store: str, tmp_path: Path) -> None:
    proc = run_cli(["data=parquet", f"data.path={tmp_path / 'nothing'}", f"tracking.uri={store}",
                    "tracking.experiment=nodata", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode != 0
    err = [ln for ln in stderr_lines(proc.stderr) if ln.startswith("error:")]
    assert len(err) == 1 and "data.path=" in err[0] and "parquet" in err[0], proc.stderr
    (run,) = runs(store, "nodata")
    assert run.info.status == "FAILED"
    assert ROOT.exists()


def test_parquet_resume_skips_to_the_same_batches(tmp_path: Path) -> None:
    cfg = small_cfg()
    write_parquet(job_data(cfg), tmp_path, rows=600, files=2, eval_rows=8, chunk_rows=128)


    lay = job_data(cfg).layout
    full = list(ParquetSource(str(tmp_path / "train"), lay, 50, 0, 1, 0, True))
    resumed = list(ParquetSource(str(tmp_path / "train"), lay, 50, 0, 1, 0, True, skip_batches=4, max_batches=9))
    assert len(full) == 12 and len(resumed) == 5
    for a, b in zip(full[4:9], resumed, strict=True):
        assert torch.equal(a.dense_features, b.dense_features) and torch.equal(a.labels, b.labels)
        assert torch.equal(a.sparse_features.values(), b.sparse_features.values())


@pytest.mark.parametrize("tasks,multi_hot", [(1, False), (3, False), (1, True)])
def test_synthetic_batch_i_is_the_same_wherever_a_run_starts(tasks: int, multi_hot: bool) -> None:
    """One-hot batches are drawn 16 at a time: a run that starts (resumes) or ends inside such a chunk
    still sees exactly the batches of an uninterrupted run."""
    from runner.data.synthetic import SyntheticClicks

    def batches(num: int = 40, start: int = 0) -> list:
        return list(SyntheticClicks(["a", "b", "c"], [1000, 50, 7], 13, 256, num, 3, 1, start_batch=start,
                                    tasks=tasks, ids_per_feature=2 if multi_hot else 1))

    full, resumed, cut = batches(), batches(start=21), batches(num=23)
    assert (len(full), len(resumed), len(cut)) == (40, 19, 23)
    for a, b in [*zip(full[21:], resumed, strict=True), *zip(full, cut, strict=False)]:
        assert torch.equal(a.dense_features, b.dense_features) and torch.equal(a.labels, b.labels)
        assert torch.equal(a.sparse_features.values(), b.sparse_features.values())
    assert not torch.equal(full[16].labels, full[17].labels)  # a new batch every step
    one = full[5]
    assert one.labels.shape == ((256,) if tasks == 1 else (256, tasks)) and one.dense_features.shape == (256, 13)
    kjt, width = one.sparse_features, 2 if multi_hot else 1
    assert kjt.length_per_key() == [256 * width] * 3 and kjt.offset_per_key() == [0, 256 * width, 512 * width,
                                                                                   768 * width]
    assert 0 <= int(kjt["c"].values().min()) and int(kjt["c"].values().max()) < 7
    assert 0.3 < float(torch.stack([b.labels.float().mean() for b in full]).mean()) < 0.7


def test_prefetcher_keeps_order_raises_where_the_source_failed_and_stops() -> None:
    import threading

    from runner.data.synthetic import SyntheticClicks

    source = SyntheticClicks(["a", "b"], [100, 50], 3, batch_size=8, num_batches=12, seed=1, rank=0)
    direct, ahead = list(source), list(Prefetcher(source, depth=3))
    assert len(ahead) == 12
    for a, b in zip(direct, ahead, strict=True):
        assert torch.equal(a.dense_features, b.dense_features) and torch.equal(a.labels, b.labels)
        assert torch.equal(a.sparse_features.values(), b.sparse_features.values())

    def failing():
        yield from range(3)
        raise ValueError("row 3 unreadable")

    it = Prefetcher(failing(), depth=2)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="row 3 unreadable"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)

    endless = Prefetcher(iter(int, 1), depth=2)  # a source that never ends; the consumer stops early
    assert next(endless) == 0
    endless.close()
    assert not any(t.name == "runner-prefetch" and t.is_alive() for t in threading.enumerate())


CASES = [(37, 21), (16, 40), (0, 5), (32, 32)]  # chunks of 5: ends inside a chunk, at one, before the first


def _agree(rank: int, port: int, out) -> None:
    import torch.distributed as dist

    from runner.data.pipeline import AllRanksIterator, Prefetcher

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    for case, lengths in enumerate(CASES):
        train = Prefetcher(AllRanksIterator(range(lengths[rank]), "train", 5), 2)  # in the prefetch thread
        evaluation = AllRanksIterator(range(lengths[rank] + 5), "eval", 5)  # beside it, in this thread
        got, evaluated = [], None
        for i, batch in enumerate(train):
            got.append(batch)
            if i == 3:
                evaluated = list(evaluation)
        out.put((rank, case, got, evaluated))
    dist.destroy_process_group()


def test_every_rank_stops_at_the_same_batch_with_one_agreement_per_chunk() -> None:
    """Ranks with unequal shards take the smallest count; a training stream agreed in its prefetch thread
    and an evaluation agreed in the training thread at the same time do not mix their collectives."""
    from runner.launch.processes.ports import free_port

    ctx = forkserver()
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_agree, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = {}
    for _ in range(2 * len(CASES)):
        rank, case, got, evaluated = out.get(timeout=120)
        results[rank, case] = got, evaluated
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    for case, lengths in enumerate(CASES):
        n = min(lengths)
        assert results[0, case] == results[1, case] == (list(range(n)), list(range(n + 5)) if n > 3 else None)


def test_parquet_removed_while_read_is_one_line_naming_it(tmp_path: Path) -> None:
    """Data that vanishes while a job reads it (issue 47, item 4) is a data error naming the key, the folder and
    the file that went, never an evaluation that "got no batch"."""
    from runner.config.errors import DataError, one_line


    cfg = small_cfg()
    write_parquet(job_data(cfg), tmp_path, rows=600, files=3, eval_rows=64)
    train, lay = tmp_path / "train", job_data(cfg).layout
    source = ParquetSource(str(train), lay, 50, 0, 1, 0, True)
    first = next(iter(source))  # the job has started reading
    assert first.labels.shape[0] == 50
    gone = sorted(train.glob("*.parquet"))[1]
    gone.unlink()
    with pytest.raises(DataError) as exc:
        list(ParquetSource(str(train), lay, 50, 0, 1, 0, True))  # the next pass (an epoch, an evaluation)
    assert one_line(exc.value) == (f"data error: data.path={train}: {gone} was removed while the job read it; "
                                   "restore it, or point data.path at data that stays while the job runs")
    evaluation = tmp_path / "eval"
    list(ParquetSource(str(evaluation), lay, 16, 0, 1, 0, True, key="data.eval_path"))
    for f in evaluation.glob("*"):
        f.unlink()
    evaluation.rmdir()
    with pytest.raises(DataError, match=rf"^data.eval_path={evaluation}: the folder was removed while the job read"):
        list(ParquetSource(str(evaluation), lay, 16, 0, 1, 0, True, key="data.eval_path"))


def _bad_folder(tmp_path: Path, column: str, value, rows: int = 120, at: int = 77, as_type=None) -> Path:
    """One file of the small model's data whose ``column`` holds ``value`` at row ``at`` (``as_type``: the
    column written with that Arrow type instead)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_parquet(job_data(small_cfg()), tmp_path, rows=rows, files=1, eval_rows=8)
    path = tmp_path / "train" / "part-00000.parquet"
    table = pq.read_table(path)
    data = table.column(column).to_pylist()
    if value is not None or as_type is None:
        data[at] = value
    field = table.schema.field(column)
    col = pa.array(data, type=as_type or field.type)
    pq.write_table(table.set_column(table.schema.get_field_index(column), column, col), path)
    return tmp_path / "train"


@pytest.mark.parametrize("column,value,expected", [
    ("label", 2.0, r"row 77, column label: 2\.0; expected a label in \[0, 1\]"),
    ("label", -1.0, r"row 77, column label: -1\.0; expected a label in \[0, 1\]"),
    ("dense_3", float("nan"), r"row 77, column dense_3: nan; expected a finite number"),
    ("dense_0", float("inf"), r"row 77, column dense_0: inf; expected a finite number"),
    ("t1", None, r"row 77, column t1: None; expected an id in \[0, 1000\)"),
])
def test_a_bad_value_stops_the_read_naming_file_row_column_and_value(tmp_path: Path, column: str, value,
                                                                      expected: str) -> None:


    folder = _bad_folder(tmp_path, column, value)
    with pytest.raises(DataError, match=f"part-00000.parquet {expected}"):
        list(ParquetSource(str(folder), job_data(small_cfg()).layout, 40, 0, 1, 0, True))


def test_ids_of_mixed_widths_and_shapes_read_as_one(tmp_path: Path) -> None:
    """One file with int32 scalar ids and float32 dense, one with list<int64> ids: the batches join them; ids
    outside a table are hashed and counted."""
    import pyarrow as pa
    import pyarrow.parquet as pq



    cfg = small_cfg()
    write_parquet(job_data(cfg), tmp_path, rows=100, files=2, eval_rows=8)
    first = tmp_path / "train" / "part-00000.parquet"
    t = pq.read_table(first)
    for name in ("t0", "t1", "t2"):
        ids = [v[0] if v else 0 for v in t.column(name).to_pylist()]
        t = t.set_column(t.schema.get_field_index(name), name, pa.array(ids, type=pa.int32()))
    t = t.set_column(t.schema.get_field_index("dense_0"), "dense_0", t.column("dense_0").cast(pa.float32()))
    pq.write_table(t, first)
    lay = job_data(small_cfg(rows_per_table=500)).layout  # ids up to 999 in the files: some hashed
    source = ParquetSource(str(tmp_path / "train"), lay, 30, 0, 1, 0, True)  # the second batch spans both files
    batches = list(source)
    assert sum(b.labels.shape[0] for b in batches) == 90 and all(b.sparse_features.values().max() < 500
                                                                   for b in batches)
    assert 0 < source.values.hashed < source.values.ids and "hashed into range" in source.values.summary()
    from runner.data.values import hashed_ids

    assert hashed_ids()[0] >= source.values.hashed  # what a trainer reports at its end


@pytest.mark.parametrize("column,arrow,expected", [
    ("t2", "string", "column t2 is string where an integer id, or a list of integer ids is expected"),
    ("dense_1", "string", "column dense_1 is string where a number is expected"),
])
def test_a_column_of_another_type_is_refused_before_launch(tmp_path: Path, column: str, arrow: str,
                                                           expected: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from conftest import cfg_for

    from runner.data.checks import check_data

    cfg = small_cfg()
    write_parquet(job_data(cfg), tmp_path, rows=100, files=3, eval_rows=8)
    second = tmp_path / "train" / "part-00001.parquet"
    t = pq.read_table(second)
    t = t.set_column(t.schema.get_field_index(column), column,
                     pa.array([str(v) for v in t.column(column).to_pylist()], type=getattr(pa, arrow)()))
    pq.write_table(t, second)
    full = cfg_for("data=parquet", f"data.path={tmp_path / 'train'}", "model.tables=[{name: t0, num_embeddings: "
                   "1000}, {name: t1, num_embeddings: 1000}, {name: t2, num_embeddings: 1000}]",
                   "model.generated_tables.count=0")
    with pytest.raises(DataError, match=f"part-00001.parquet {expected}"):
        check_data(job_data(full))


def test_a_dataset_schema_names_at_most_256_dense_columns() -> None:
    """A run's dataset schema lists each dense column up to 256 of them; more are one entry for all (a million
    names would be tens of MiB in the driver and the store)."""
    from conftest import cfg_for

    from runner.data.lineage import datasets

    few = datasets(job_data(cfg_for("data.num_dense_features=13")))[0]["columns"]
    assert [c for c, _ in few if c.startswith("dense_")] == [f"dense_{i}" for i in range(13)]
    many = datasets(job_data(cfg_for("data.num_dense_features=1000000000")))[0]["columns"]
    assert [c for c in many if c[0].startswith("dense_")] == [("dense_0..dense_999999999", "float x 1000000000")]
