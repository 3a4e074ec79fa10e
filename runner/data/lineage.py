"""What a training run reads, as MLflow dataset inputs: one for training, one for evaluation.

Each is described by a name, a source (the path or URI; for synthetic data the generator and its settings),
a digest and the columns. The digest is the data's identity: for files, their addresses, sizes and
modification times; for synthetic data, the generator's settings (two runs on the same data show the
same digest in the UI's Datasets column). Nothing here reads the rows.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from runner.config.parts import part
from runner.data.layout import DENSE_PREFIX, JobData, Layout

SYNTHETIC_KEYS = ("num_dense_features", "label_noise", "ids_per_feature", "variable_lengths", "zipf_alpha")


def _digest(identity: Any) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:12]


LISTED_DENSE = 256  # dense columns named one by one in a dataset's schema; more are one entry for all of them


def _columns(lay: Layout, multi_hot: bool) -> List[Tuple[str, str]]:
    dense = ([(c, "float") for c in lay.dense_columns] if lay.num_dense <= LISTED_DENSE
             else [(f"{DENSE_PREFIX}0..{DENSE_PREFIX}{lay.num_dense - 1}", f"float x {lay.num_dense}")])
    sparse = [(f, "list<long>" if multi_hot else "long") for f in lay.features]
    return [(t, "float") for t in lay.tasks] + dense + sparse


def _arrow_type(t: Any) -> str:
    import pyarrow as pa

    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"list<{_arrow_type(t.value_type)}>"
    for check, name in ((pa.types.is_int64, "long"), (pa.types.is_integer, "integer"),
                        (pa.types.is_float64, "double"), (pa.types.is_floating, "float"),
                        (pa.types.is_boolean, "boolean"), (pa.types.is_string, "string")):
        if check(t):
            return name
    return "binary"


def parquet_described(path: str) -> Tuple[List[Tuple[str, int, int]], Optional[List[Tuple[str, str]]]]:
    """``(address, size, mtime ns)`` of each Parquet file at ``path``, and the columns of their schema."""
    import pyarrow.parquet as pq

    from runner.data.files import parquet_files

    found = parquet_files(path)
    schema = pq.read_schema(found[0].open()) if found else None
    columns = [(f.name, _arrow_type(f.type)) for f in schema] if schema is not None else None
    return [(f.uri, f.size, f.mtime_ns) for f in found], columns


def criteo_described(path: str) -> Tuple[List[Tuple[str, int, int]], Optional[List[Tuple[str, str]]]]:
    """``(path, size, mtime ns)`` of each Criteo file at ``path`` (their columns are Criteo's layout)."""
    from runner.data.files import criteo_files

    return [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in criteo_files(path)], None


def datasets(data: JobData) -> List[Dict[str, Any]]:
    """The run's training and evaluation data: ``name``, ``source``, ``digest``, ``columns``, ``context``,
    ``files`` (how many), ``settings`` (synthetic only)."""
    d, lay, declared = data.settings, data.layout, data.source
    if not declared.reads_files:
        tables = [[t, n] for t, n in zip(lay.features, lay.sizes, strict=True)]
        settings = {k: getattr(d, k) for k in SYNTHETIC_KEYS} | {"seed": data.seed, "tasks": list(lay.tasks),
                                                                 "tables": tables}
        multi = d.ids_per_feature > 1 or d.variable_lengths
        return [{"name": f"{d.name}-{split}", "source": declared.opens.split(":")[0], "context": split, "files": 0,
                 "settings": settings | {"split": split}, "digest": _digest(settings | {"split": split}),
                 "columns": _columns(lay, multi)} for split in ("train", "eval")]
    out = []
    for context, path in (("train", str(d.path)), ("eval", str(d.eval_path or d.path))):
        assert declared.describes is not None
        files, columns = part(declared.describes)(path)
        name = Path(str(path).split("://", 1)[-1].rstrip("/")).name or str(path)
        out.append({"name": name, "source": str(path), "digest": _digest(files), "columns": columns,
                    "context": context, "files": len(files)})
    return out
