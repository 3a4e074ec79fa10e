"""A data config checked before launch, in the driver: paths, files and columns, in one line each. Imports no
torch (the driver of a file-data job would otherwise load torch and TorchRec only to check its paths)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner.config.errors import ConfigError, DataError, first_line
from runner.data.files import CRITEO_DENSE, CRITEO_LAYOUT, CRITEO_SPARSE, criteo_files, parquet_files
from runner.data.layout import layout

if TYPE_CHECKING:
    from runner.config.schema import RunnerConfig


def check_data(cfg: RunnerConfig) -> None:
    """One line, before launch, for a data config that cannot be read."""
    d = cfg.data
    if d.name == "synthetic":
        return
    for key in ("path", "eval_path"):
        value = getattr(d, key)
        if value is None:
            if key == "path":
                raise ConfigError("data.path", None, f"a {d.name} file or folder")
            continue
        found = parquet_files(value) if d.name == "parquet" else criteo_files(value)
        if not found:
            kind = "*.parquet files" if d.name == "parquet" else "files"
            raise ConfigError(f"data.{key}", value, f"a file or folder with {kind} (none found)")
    for key in ("path", "eval_path"):
        if getattr(d, key) is not None:
            _check_files(d.name, f"data.{key}", getattr(d, key))
    if d.name == "criteo":
        lay = layout(cfg)
        if len(lay.features) != CRITEO_SPARSE or lay.num_dense != CRITEO_DENSE or len(lay.tasks) != 1:
            raise ConfigError("data.name", "criteo", f"a model with {CRITEO_SPARSE} tables, "
                              f"data.num_dense_features={CRITEO_DENSE} and one task (e.g. model=dlrm_criteo); "
                              f"this one has {len(lay.features)} tables, {lay.num_dense} dense, "
                              f"{len(lay.tasks)} tasks")
    if d.name == "parquet":
        import pyarrow.parquet as pq

        lay = layout(cfg)
        schema = pq.read_schema(parquet_files(str(d.path))[0].open())
        missing = [c for c in list(lay.tasks) + lay.dense_columns + list(lay.features) if c not in schema.names]
        if missing:
            raise ConfigError("data.path", d.path, f"Parquet files with columns {', '.join(missing[:5])}"
                              f"{' ...' if len(missing) > 5 else ''} (missing; see README: Data)")


def _check_files(kind: str, key: str, value: str) -> None:
    """Every file non-empty and of its format (a Parquet footer; a Criteo first line of 40 fields)."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        for f in parquet_files(value):
            try:
                pq.read_metadata(f.open())
            except Exception as exc:  # ArrowInvalid, OSError
                raise DataError(f"{key}={value}: {f} is not a Parquet file ({first_line(exc)})") from None
        return
    files = criteo_files(value)
    if all(f.stat().st_size == 0 for f in files):
        raise DataError(f"{key}={value}: {'the file is' if len(files) == 1 else 'every file is'} empty; "
                        f"Criteo files have lines of {CRITEO_LAYOUT}")
    with files[0].open("rb") as fh:
        first = fh.readline().rstrip(b"\r\n")
    fields = first.count(b"\t") + 1
    if fields != 1 + CRITEO_DENSE + CRITEO_SPARSE:
        raise DataError(f"{files[0]} line 1 has {fields} fields; Criteo lines have {CRITEO_LAYOUT} ({key}={value})")
