"""MLflow: where runs go, what a run records, and one parent run per Hydra sweep.

One process writes a job's run at a time: the driver creates it and logs the config, rank 0 logs
training metrics and the plan while the workers run, and the driver sets the final status.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Tuple

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from runner import PROJECT_ROOT

PARENT_RUN_FILE = "mlflow_parent_run_id"
_MAX_PARAM_VALUE = 6000  # MLflow's limit on a param value's length
_MAX_BATCH = 100  # MLflow's limit on params per log_batch call


def tracking_uri(cfg: Any) -> str:
    """``tracking.uri``, else $MLFLOW_TRACKING_URI, else a SQLite store in the project folder."""
    uri = cfg.tracking.uri if cfg is not None else None
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{PROJECT_ROOT / 'mlflow.db'}"


def ui_command(uri: str) -> str:
    """The command that shows ``uri`` in the MLflow UI."""
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"{PROJECT_ROOT / '.venv/bin/mlflow'} ui --backend-store-uri {uri}"


@functools.lru_cache(maxsize=8)
def client(uri: str) -> Any:
    """One client per store and process: building one (and its SQL engine) costs more than a write."""
    import logging

    from mlflow.tracking import MlflowClient  # deferred: mlflow takes seconds to import

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # e.g. "Creating initial MLflow database tables"
    return MlflowClient(tracking_uri=uri)


def experiment_id(uri: str, name: str) -> str:
    """Id of experiment ``name``, created on first use; local stores keep artifacts beside the DB."""
    c = client(uri)
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        location = (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()
    try:
        return c.create_experiment(name, artifact_location=location)
    except Exception:  # another process created it first
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def flatten(tree: Mapping[str, Any], prefix: str = "") -> Dict[str, str]:
    """Dot-keyed string params of a nested config, each within MLflow's value length."""
    out: Dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            text = "null" if value is None else str(value)
            out[name] = text if len(text) <= _MAX_PARAM_VALUE else text[: _MAX_PARAM_VALUE - 3] + "..."
    return out


def log_params(uri: str, run_id: str, params: Mapping[str, str]) -> None:
    from mlflow.entities import Param

    items = [Param(k, v) for k, v in params.items()]
    c = client(uri)
    for i in range(0, len(items), _MAX_BATCH):
        c.log_batch(run_id, params=items[i : i + _MAX_BATCH])


def log_metrics(uri: str, run_id: str, metrics: Mapping[str, float], step: int) -> None:
    log_metric_points(uri, run_id, [(metrics, step)])


def log_metric_points(uri: str, run_id: str, points: Iterable[Tuple[Mapping[str, float], int]]) -> None:
    """Metrics of several steps in as few store transactions as MLflow's batch limit allows."""
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    items = [Metric(k, float(v), now, step) for metrics, step in points for k, v in metrics.items()]
    c = client(uri)
    for i in range(0, len(items), _MAX_BATCH):
        c.log_batch(run_id, metrics=items[i : i + _MAX_BATCH])


class BackgroundWriter:
    """Runs MLflow calls on a daemon thread, in order, so training never waits for the store.

    Each queued call gets ``(uri, run_id)``. ``close()`` waits until everything is written and re-raises
    the first failure.
    """

    def __init__(self, uri: str, run_id: str) -> None:
        import queue
        import threading

        self.uri, self.run_id = uri, run_id
        self._items: "queue.Queue[Optional[Callable[[str, str], None]]]" = queue.Queue()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._drain, name="mlflow-writer", daemon=True)
        self._thread.start()

    def put(self, call: Callable[[str, str], None]) -> None:
        if self._error is not None:
            raise RuntimeError(f"MLflow logging failed: {self._error}")
        self._items.put(call)

    def _drain(self) -> None:
        while (call := self._items.get()) is not None:
            if self._error is None:
                try:
                    call(self.uri, self.run_id)
                except BaseException as exc:  # surfaced on the next put() or close()
                    self._error = exc

    def metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.put(lambda uri, run_id: log_metrics(uri, run_id, metrics, step))

    def tags(self, tags: Mapping[str, Any]) -> None:
        self.put(lambda uri, run_id: set_tags(uri, run_id, tags))

    def artifacts(self, paths: Iterable[Path], artifact_path: Optional[str]) -> None:
        paths = list(paths)
        self.put(lambda uri, run_id: log_artifacts(uri, run_id, paths, artifact_path))

    def close(self) -> None:
        self._items.put(None)
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"MLflow logging failed: {self._error}")


class EventLog:
    """Rank 0's side when a driver owns the run: MLflow events appended as JSON lines, which costs
    the training loop microseconds; the driver, idle meanwhile, writes them to the store."""

    def __init__(self, path: Path) -> None:
        self._f = path.open("a", buffering=1)

    def _write(self, event: Dict[str, Any]) -> None:
        self._f.write(json.dumps(event) + "\n")

    def metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._write({"kind": "metrics", "metrics": {k: float(v) for k, v in metrics.items()}, "step": step})

    def tags(self, tags: Mapping[str, Any]) -> None:
        self._write({"kind": "tags", "tags": {k: str(v) for k, v in tags.items()}})

    def artifacts(self, paths: Iterable[Path], artifact_path: Optional[str]) -> None:
        self._write({"kind": "artifacts", "paths": [str(p) for p in paths], "artifact_path": artifact_path})

    def close(self) -> None:
        self._f.close()


class EventPump:
    """The driver's side: writes the complete new lines of rank 0's event log to the run."""

    def __init__(self, path: Path, uri: str, run_id: str) -> None:
        self.path, self.uri, self.run_id = path, uri, run_id
        self._offset = 0

    def __call__(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
        self._offset += end
        points: list = []  # consecutive metric events go to the store in one batch
        for line in data[:end].splitlines():
            event = json.loads(line)
            if event["kind"] == "metrics":
                points.append((event["metrics"], event["step"]))
                continue
            if points:
                log_metric_points(self.uri, self.run_id, points)
                points = []
            if event["kind"] == "tags":
                set_tags(self.uri, self.run_id, event["tags"])
            elif event["kind"] == "artifacts":
                log_artifacts(self.uri, self.run_id, [Path(p) for p in event["paths"]], event["artifact_path"])
        if points:
            log_metric_points(self.uri, self.run_id, points)


def set_tags(uri: str, run_id: str, tags: Mapping[str, Any]) -> None:
    from mlflow.entities import RunTag

    client(uri).log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def log_artifacts(uri: str, run_id: str, paths: Iterable[Path], artifact_path: Optional[str] = None) -> None:
    c = client(uri)
    for p in paths:
        if p.is_dir():
            c.log_artifacts(run_id, str(p), artifact_path=(artifact_path or "") + p.name)
        elif p.exists():
            c.log_artifact(run_id, str(p), artifact_path=artifact_path)


def start_run(uri: str, experiment: str, run_name: str, parent_run_id: Optional[str],
              tags: Mapping[str, Any]) -> str:
    """Create a RUNNING run (a child of ``parent_run_id`` when given) and return its id."""
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

    all_tags = {MLFLOW_RUN_NAME: run_name, **{k: str(v) for k, v in tags.items()}}
    if parent_run_id:
        all_tags[MLFLOW_PARENT_RUN_ID] = parent_run_id
    run = client(uri).create_run(experiment_id(uri, experiment), tags=all_tags, run_name=run_name)
    return run.info.run_id


def end_run(uri: str, run_id: str, status: str, error: Optional[str] = None) -> None:
    """Set the final status; a failure's reason goes into the ``error`` tag."""
    c = client(uri)
    if error:
        c.set_tag(run_id, "error", error[:5000])
    c.set_terminated(run_id, status)


def parent_run_id(sweep_dir: Optional[str]) -> Optional[str]:
    """The sweep's parent run id, written by :class:`SweepParentRun` into the sweep folder."""
    if not sweep_dir:
        return None
    f = Path(sweep_dir) / PARENT_RUN_FILE
    return f.read_text().strip() if f.exists() else None


class SweepParentRun(Callback):
    """Hydra callback: one MLflow parent run per multirun; each job's run becomes its child."""

    def __init__(self) -> None:
        self._run_id: Optional[str] = None
        self._uri = ""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._uri = tracking_uri(config)
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        overrides = " ".join(config.hydra.overrides.task)
        self._run_id = start_run(self._uri, config.tracking.experiment, f"sweep {sweep_dir.name}", None,
                                 {"runner.kind": "sweep", "runner.overrides": overrides,
                                  "runner.sweep_dir": str(sweep_dir)})
        (sweep_dir / PARENT_RUN_FILE).write_text(self._run_id)
        print(f"[runner] sweep parent MLflow run {self._run_id} ({sweep_dir})", flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self._run_id:
            return
        from runner.sweep_report import write_sweep_report

        sweep_dir = Path(config.hydra.sweep.dir)
        log_artifacts(self._uri, self._run_id, [p for p in [sweep_dir / "multirun.yaml"] if p.exists()])
        try:
            report = write_sweep_report(sweep_dir)
        except Exception as exc:  # a report problem must not hide the sweep's own outcome
            print(f"[runner] warning: sweep report failed: {type(exc).__name__}: {exc}", flush=True)
            report = None
        if report is not None:
            log_artifacts(self._uri, self._run_id, sorted(report.iterdir()), artifact_path="report")
            print(f"[runner] sweep report: {report / 'report.md'}", flush=True)
        from runner.cli import failed_jobs

        error = "; ".join(failed_jobs) if failed_jobs else None
        end_run(self._uri, self._run_id, "FAILED" if failed_jobs else "FINISHED", error)


def resolved_container(cfg: DictConfig) -> Dict[str, Any]:
    """The job config as plain, fully resolved data (without Hydra's own node)."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
