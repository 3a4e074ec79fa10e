"""What a Parquet file's columns must hold, checked as the job reads them: by type before launch (every file's
schema, :func:`schema_problem`), by value as each row group is read (:class:`ValueCheck`, numpy over the columns
the model reads: no measurable cost beside a step).

- a label: a number in [0, 1] (the runner's tasks are binary: BCE over a sigmoid), never null or NaN;
- a dense feature: a finite number, never null;
- a sparse feature's ids: integers (or lists of them), never null, in ``[0, rows)`` of its table; where
  ``data.hash_ids=true`` (the default), ids outside are hashed into range (``id mod rows``, negative ones too)
  and counted (:attr:`ValueCheck.hashed`, :attr:`ValueCheck.ids`).

The first value that breaks these stops the job in one line naming the file, the row (in that file), the column
and the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np

from runner.config.errors import DataError
from runner.data.layout import Layout

if TYPE_CHECKING:
    import pyarrow as pa

    from runner.data.files import DataFile

_TOTALS: Dict[str, List[int]] = {}  # data key -> [ids hashed, ids read] by this process's sources


def hashed_ids() -> Tuple[int, int]:
    """The ids this process's file sources hashed into range, and the ids they read (a dataloader worker's
    counts stay in that worker)."""
    return sum(t[0] for t in _TOTALS.values()), sum(t[1] for t in _TOTALS.values())


FLOAT32_MAX = float(np.finfo(np.float32).max)
EXPECTED = {"label": "a number (0 or 1, or a probability)", "dense": "a number",
            "sparse": "an integer id, or a list of integer ids"}


def schema_problem(kind: str, arrow_type: Any) -> Optional[str]:
    """Why a column of ``arrow_type`` cannot be a ``kind`` column (``label``, ``dense``, ``sparse``); None where
    it can."""
    import pyarrow as pa

    t = arrow_type
    if kind == "sparse":
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            t = t.value_type
        ok = pa.types.is_integer(t)
    else:
        ok = pa.types.is_integer(t) or pa.types.is_floating(t) or (kind == "label" and pa.types.is_boolean(t))
    return None if ok else f"{arrow_type} where {EXPECTED[kind]} is expected"


@dataclass
class ValueCheck:
    """The value checks of one source (its layout, its ``data.*`` key and path, whether ids are hashed), and
    what it hashed so far."""

    lay: Layout
    key: str
    path: str
    hash_ids: bool
    hashed: int = 0
    ids: int = 0

    def _refuse(self, file: DataFile, row: int, column: str, value: Any, expected: str) -> DataError:
        return DataError(f"{self.key}={self.path}: {file} row {row}, column {column}: {value!r}; expected "
                         f"{expected}")

    def check(self, table: pa.Table, file: DataFile, first_row: int) -> None:
        """Every column the model reads of ``table`` (rows ``first_row``... of ``file``)."""
        import pyarrow as pa

        for name in self.lay.tasks:
            col = table.column(name)
            values = col.to_numpy(zero_copy_only=False).astype(np.float64) if col.null_count == 0 else None
            if values is None:
                bad = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
                raise self._refuse(file, first_row + bad, name, None, "a label in [0, 1]")
            wrong = ~((values >= 0) & (values <= 1))
            if wrong.any():
                bad = int(np.flatnonzero(wrong)[0])
                raise self._refuse(file, first_row + bad, name, values[bad].item(), "a label in [0, 1] (the tasks "
                                   "are binary)")
        for name in self.lay.dense_columns:
            col = table.column(name)
            if col.null_count:
                bad = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
                raise self._refuse(file, first_row + bad, name, None, "a finite number")
            values = col.to_numpy(zero_copy_only=False)
            wrong = ~np.isfinite(values) | (np.abs(values) > FLOAT32_MAX)  # a batch holds float32
            if wrong.any():
                bad = int(np.flatnonzero(wrong)[0])
                raise self._refuse(file, first_row + bad, name, values[bad].item(), "a finite number (within "
                                   "float32's range)")
        for name, size in zip(self.lay.features, self.lay.sizes, strict=True):
            col = table.column(name).combine_chunks()
            listed = pa.types.is_list(col.type) or pa.types.is_large_list(col.type)
            flat = col.values.slice(col.offsets[0].as_py(), col.offsets[-1].as_py() - col.offsets[0].as_py()) \
                if listed else col
            if col.null_count or flat.null_count:
                where = col.is_null() if col.null_count else flat.is_null()
                bad = int(np.flatnonzero(where.to_numpy(zero_copy_only=False))[0])
                row = bad if col.null_count or not listed else self._row_of(col, bad)
                raise self._refuse(file, first_row + row, name, None, f"an id in [0, {size})")
            ids = flat.to_numpy(zero_copy_only=False)
            outside = (ids < 0) | (ids >= size)
            count = int(outside.sum())
            self.ids += len(ids)
            totals = _TOTALS.setdefault(self.key, [0, 0])
            totals[1] += len(ids)
            if not count:
                continue
            if self.hash_ids:
                self.hashed += count
                totals[0] += count
                continue
            bad = int(np.flatnonzero(outside)[0])
            row = self._row_of(col, bad) if listed else bad
            raise self._refuse(file, first_row + row, name, ids[bad].item(),
                               f"an id in [0, {size}) (the table's rows), or data.hash_ids=true to hash ids into "
                               "range")

    @staticmethod
    def _row_of(col: Any, value_index: int) -> int:
        """The row of a list column that holds its flattened value ``value_index``."""
        offsets = col.offsets.to_numpy()
        return int(np.searchsorted(offsets, offsets[0] + value_index, side="right") - 1)

    def summary(self) -> Optional[str]:
        """The one line on ids hashed into range (None where none was)."""
        if not self.hashed:
            return None
        return (f"{self.hashed / max(self.ids, 1):.1%} of ids ({self.hashed:,} of {self.ids:,}) read from "
                f"{self.key}={self.path} were outside their tables and hashed into range (data.hash_ids=true)")


def normalized(table: pa.Table, lay: Layout) -> Any:
    """``table`` with one type per kind of column, whatever its file wrote (int32 or int64 ids, one id or a list
    of them, float32 or float64 or integer numbers), so that row groups of different files join into a batch:
    labels and dense features float32 (what a batch holds), ids list<int64>. A table already so is returned as
    it is (the runner's own files: no copy)."""
    import pyarrow as pa

    ids_type, number = pa.list_(pa.int64()), pa.float32()
    columns, changed = [], False
    for name in table.column_names:
        col = table.column(name)
        want = ids_type if name in lay.features else number
        if col.type != want:
            changed = True
            col = col.combine_chunks()
            if want == number or pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
                col = col.cast(want)
            else:  # one id per row: a list of one
                col = pa.ListArray.from_arrays(pa.array(np.arange(len(col) + 1, dtype=np.int32)), col.cast(pa.int64()))
        columns.append(col)
    return pa.table(columns, names=table.column_names) if changed else table
