"""``mode=write_data``: the synthetic source for a model, written as Parquet for ``data=parquet``."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List

import numpy as np
from torchrec.datasets.utils import Batch

from runner.config.errors import ConfigError
from runner.data.layout import JobData, Layout, job_data, shard_range
from runner.data.synthetic import synthetic

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig


def _arrow_table(lay: Layout, b: Batch, rows: int) -> Any:
    import pyarrow as pa

    cols = {}
    labels = b.labels.reshape(b.labels.shape[0], -1)[:rows]
    for t, task in enumerate(lay.tasks):
        cols[task] = pa.array(labels[:, t].numpy())
    for j, name in enumerate(lay.dense_columns):
        cols[name] = pa.array(b.dense_features[:rows, j].numpy())
    for name, jt in b.sparse_features.to_dict().items():
        lengths = jt.lengths()[:rows].numpy()
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        cols[name] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(jt.values()[:offsets[-1]].numpy()))
    return pa.table(cols)


def write_parquet(data: JobData, out: Path, rows: int, files: int, eval_rows: int,
                  chunk_rows: int = 65536) -> List[Path]:
    """The synthetic source, written as Parquet (``train/`` and ``eval/`` folders) for ``data=parquet``;
    one row group per ``chunk_rows`` rows, so memory stays flat whatever the size."""
    import pyarrow.parquet as pq

    lay = data.layout
    written = []
    for split, total, nfiles in (("train", rows, files), ("eval", eval_rows, 1)):
        folder = out / split
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(nfiles):
            lo, hi = shard_range(total, i, nfiles)
            n, chunk = hi - lo, min(chunk_rows, max(hi - lo, 1))
            gen = synthetic(data, chunk, -(-n // chunk), i, split == "eval")  # file i: the stream of "rank" i
            path = folder / f"part-{i:05d}.parquet"
            tmp = path.with_suffix(".parquet.tmp")
            writer, left = None, n
            for b in gen:
                table = _arrow_table(lay, b, min(left, chunk))
                writer = writer or pq.ParquetWriter(tmp, table.schema)
                writer.write_table(table)
                left -= table.num_rows
            if writer is not None:
                writer.close()
                os.replace(tmp, path)
                written.append(path)
    return written


def write_data(cfg: RunnerConfig) -> Dict[str, Any]:
    """Write ``cfg``'s synthetic source under ``data.path`` (``train/`` and ``eval/``) and say how to train on it."""
    if not cfg.data.path:
        raise ConfigError("data.path", None, "a folder to write to (mode=write_data)")
    out = Path(cfg.data.path).expanduser().resolve()
    t0 = time.perf_counter()
    files = write_parquet(job_data(cfg), out, cfg.data.write_rows, cfg.data.write_files, cfg.data.write_eval_rows)
    size = sum(f.stat().st_size for f in files)
    print(f"[runner] wrote {cfg.data.write_rows} training rows to {out / 'train'} ({cfg.data.write_files} files) and "
          f"{cfg.data.write_eval_rows} held-out rows to {out / 'eval'}: {size / 2**20:.1f} MiB in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    print(f"[runner] train on it: python -m runner data=parquet data.path={out / 'train'} "
          f"data.eval_path={out / 'eval'} model={cfg.model.name}", flush=True)
    return {"files": [str(f) for f in files]}
