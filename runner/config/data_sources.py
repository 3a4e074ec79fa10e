"""Every data source ``data.name`` may name, each declared once, here.

A declaration says whether the source generates its rows or reads files (and which: the function listing them at a
path, the words for them), how a rank opens it, what is checked before launch, and how its files are described as
MLflow inputs. Functions are ``module:function`` of :mod:`runner.data`, imported when used. The schema's allowed
values, the pre-launch check, the batches' pipeline, the lineage and the driver read it; nothing else names a
source. Adding one is its module in ``runner/data/``, its declaration below, its conf file (``conf/data/``) and
its test (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class DataSource:
    name: str
    summary: str
    opens: str
    """``module:function`` or ``module:Class``: a generated source is ``(cfg, size, num_batches, rank, eval_split,
    start_batch)``; a file source ``(path, layout, size, rank, world, workers, hash_ids, skip_batches=,
    max_batches=, key=)``."""
    lists: Optional[str] = None
    """``module:function``: its files at a path (None: it generates its rows; then the keys below are unused)."""
    file_words: str = "files"
    """How the refusal of a path without any names them."""
    checks: Tuple[str, ...] = ()
    """``module:function`` each, before launch: ``(cfg)`` raising a one-line error."""
    describes: Optional[str] = None
    """``module:function``: ``(path) -> (files as (address, bytes, mtime ns), columns or None)`` for the lineage."""

    @property
    def reads_files(self) -> bool:
        return self.lists is not None


_DATA = "runner.data."
SOURCES: Dict[str, DataSource] = {s.name: s for s in (
    DataSource("synthetic", "generated clicks: learnable labels that depend on ids and dense features",
               _DATA + "synthetic:synthetic"),
    DataSource("parquet", "a folder of Parquet files (local, or an object store's)", _DATA + "parquet:ParquetSource",
               lists=_DATA + "files:parquet_files", file_words="*.parquet files",
               checks=(_DATA + "checks:parquet_readable", _DATA + "checks:parquet_columns"),
               describes=_DATA + "lineage:parquet_described"),
    DataSource("criteo", "Criteo click-log TSV files", _DATA + "criteo:CriteoSource",
               lists=_DATA + "files:criteo_files",
               checks=(_DATA + "checks:criteo_layout", _DATA + "checks:criteo_model"),
               describes=_DATA + "lineage:criteo_described"),
)}
