"""How rank 0's reports reach the MLflow run without the training loop waiting on the store.

With a driver (``python -m runner``), rank 0 appends each report as one JSON line to the run folder's
``events.jsonl`` (:class:`EventLog`: microseconds a step) and the driver, idle meanwhile, writes the new
lines to the store every few seconds and once more at the end (:class:`EventPump`). Under an external
``torchrun`` rank 0 owns the run and writes from a background thread (:class:`BackgroundWriter`).
The three share one interface: ``metrics``, ``tags``, ``artifacts``, ``close``.
"""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Mapping, Optional

from runner.track.store import log_artifacts, log_metric_points, log_metrics, set_tags


class EventLog:
    """Rank 0's side when a driver owns the run: MLflow events appended as JSON lines."""

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


class BackgroundWriter:
    """Runs MLflow calls on a daemon thread, in order, so training never waits for the store.

    Each queued call gets ``(uri, run_id)``. ``close()`` waits until everything is written and re-raises
    the first failure.
    """

    def __init__(self, uri: str, run_id: str) -> None:
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
