"""A data config checked before launch, in the driver: paths, files and columns, in one line each. Imports no
torch (the driver of a file-data job would otherwise load torch and TorchRec only to check its paths)."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Tuple

from runner.config.errors import ConfigError, DataError, first_line
from runner.config.parts import part
from runner.data.files import CRITEO_DENSE, CRITEO_LAYOUT, CRITEO_SPARSE, criteo_files, parquet_files

if TYPE_CHECKING:
    from runner.config.schema import DataSchema
    from runner.data.layout import JobData


def check_data(data: JobData) -> None:
    """One line, before launch, for a data config that cannot be read (its source's declared checks)."""
    d, declared = data.settings, data.source
    if not declared.reads_files:
        return
    assert declared.lists is not None
    for key in ("path", "eval_path"):
        value = getattr(d, key)
        if value is None:
            if key == "path":
                raise ConfigError("data.path", None, f"a {d.name} file or folder")
            continue
        if not part(declared.lists)(value):
            raise ConfigError(f"data.{key}", value, f"a file or folder with {declared.file_words} (none found)")
    for check in declared.checks:
        part(check)(data)


def _paths(d: DataSchema) -> List[Tuple[str, str]]:
    return [(f"data.{key}", getattr(d, key)) for key in ("path", "eval_path") if getattr(d, key)]


def parquet_readable(data: JobData) -> None:
    """Every file has a Parquet footer."""
    import pyarrow.parquet as pq

    for key, value in _paths(data.settings):
        for f in parquet_files(value):
            try:
                pq.read_metadata(f.open())
            except Exception as exc:  # ArrowInvalid, OSError
                raise DataError(f"{key}={value}: {f} is not a Parquet file ({first_line(exc)})") from None


def parquet_columns(data: JobData) -> None:
    """Every file has every column the model reads (labels, dense features, one per table), of a type it can
    read (:func:`runner.data.values.schema_problem`): the first file that does not is named, with the column."""
    import pyarrow.parquet as pq

    from runner.data.values import schema_problem

    d, lay = data.settings, data.layout
    kinds = {**{c: "label" for c in lay.tasks}, **{c: "dense" for c in lay.dense_columns},
             **{c: "sparse" for c in lay.features}}
    for key, value in _paths(d):
        for i, f in enumerate(parquet_files(value)):
            schema = pq.read_schema(f.open())
            missing = [c for c in kinds if c not in schema.names]
            if missing and i == 0 and key == "data.path":
                raise ConfigError("data.path", d.path, f"Parquet files with columns {', '.join(missing[:5])}"
                                  f"{' ...' if len(missing) > 5 else ''} (missing; see README: Data)")
            if missing:
                raise DataError(f"{key}={value}: {f} has no column {', '.join(missing[:5])}"
                                f"{' ...' if len(missing) > 5 else ''}, which the model reads")
            for column, kind in kinds.items():
                problem = schema_problem(kind, schema.field(column).type)
                if problem:
                    raise DataError(f"{key}={value}: {f} column {column} is {problem}")


def criteo_layout(data: JobData) -> None:
    """Not every file empty, and a first line of Criteo's 40 fields."""
    for key, value in _paths(data.settings):
        files = criteo_files(value)
        if all(f.stat().st_size == 0 for f in files):
            raise DataError(f"{key}={value}: {'the file is' if len(files) == 1 else 'every file is'} empty; "
                            f"Criteo files have lines of {CRITEO_LAYOUT}")
        with files[0].open("rb") as fh:
            first = fh.readline().rstrip(b"\r\n")
        fields = first.count(b"\t") + 1
        if fields != 1 + CRITEO_DENSE + CRITEO_SPARSE:
            raise DataError(f"{files[0]} line 1 has {fields} fields; Criteo lines have {CRITEO_LAYOUT} "
                            f"({key}={value})")


def criteo_model(data: JobData) -> None:
    """A model of Criteo's shape: 26 tables, 13 dense features, one task."""
    lay = data.layout
    if len(lay.features) != CRITEO_SPARSE or lay.num_dense != CRITEO_DENSE or len(lay.tasks) != 1:
        raise ConfigError("data.name", "criteo", f"a model with {CRITEO_SPARSE} tables, "
                          f"data.num_dense_features={CRITEO_DENSE} and one task (e.g. model=dlrm_criteo); "
                          f"this one has {len(lay.features)} tables, {lay.num_dense} dense, {len(lay.tasks)} tasks")
