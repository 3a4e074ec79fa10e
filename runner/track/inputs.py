"""A run's datasets as MLflow inputs (the UI's Datasets column and the run page's Datasets section)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from runner.track.store import _store_write, client


def _schema(columns: Optional[List[Any]]) -> Any:
    from mlflow.types import ColSpec, DataType, Schema
    from mlflow.types.schema import Array

    if not columns:
        return None

    def dtype(kind: str) -> Any:
        return DataType[kind] if kind in DataType.__members__ else DataType.binary

    return Schema([ColSpec(Array(dtype(kind[len("list<"):-1])) if kind.startswith("list<") else dtype(kind), name)
                   for name, kind in columns])


def _source(d: Dict[str, Any]) -> Any:
    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    if "settings" in d:  # generated: the generator and its settings are the source
        return CodeDatasetSource(tags={"generator": d["source"], **{k: str(v) for k, v in d["settings"].items()}})
    try:
        return resolve_dataset_source(d["source"])
    except Exception:  # a scheme MLflow has no source type for
        return CodeDatasetSource(tags={"path": d["source"]})


@_store_write
def log_datasets(uri: str, run_id: str, datasets: List[Dict[str, Any]]) -> None:
    """Log each of :func:`runner.data.lineage.datasets` as an input of ``run_id`` with its context."""
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    inputs = [DatasetInput(MetaDataset(_source(d), name=d["name"], digest=d["digest"],
                                       schema=_schema(d["columns"]))._to_mlflow_entity(),
                           tags=[InputTag(MLFLOW_DATASET_CONTEXT, d["context"])]) for d in datasets]
    client(uri).log_inputs(run_id, datasets=inputs)
