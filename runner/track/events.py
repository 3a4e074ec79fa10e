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
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from runner.config.rundir import DELIVERED, read_json, update_json
from runner.track.store import log_artifacts, log_metric_points, outage_reason, set_tags


class EventLog:
    """Rank 0's side when a driver owns the run: MLflow events appended as JSON lines, each metric point
    stamped with the time rank 0 measured it (what the store gets, however late it is delivered)."""

    def __init__(self, path: Path) -> None:
        self._f = path.open("a", buffering=1)

    def _write(self, event: Dict[str, Any]) -> None:
        self._f.write(json.dumps(event) + "\n")

    def metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._write({"kind": "metrics", "metrics": {k: float(v) for k, v in metrics.items()}, "step": step,
                     "time": int(time.time() * 1000)})

    def tags(self, tags: Mapping[str, Any]) -> None:
        self._write({"kind": "tags", "tags": {k: str(v) for k, v in tags.items()}})

    def artifacts(self, paths: Iterable[Path], artifact_path: Optional[str]) -> None:
        self._write({"kind": "artifacts", "paths": [str(p) for p in paths], "artifact_path": artifact_path})

    def close(self) -> None:
        self._f.close()


_BATCH_POINTS = 200  # metric events per delivery (each delivered group is recorded as done)


class EventPump:
    """The driver's side (and ``python -m runner sync``'s): delivers the complete new lines of rank 0's
    event log to the run, in order, and records in ``delivered.json`` how far it got.

    The store may be unreachable for a while (a tracking server restarted, a network outage): then the
    pump says so once, keeps every line where it is, and tries again on its next call; training does
    not wait. When the store answers again it delivers the backlog and says so.
    """

    def __init__(self, path: Path, uri: str, run_id: str, say: Callable[[str], None] = print) -> None:
        self.path, self.uri, self.run_id, self._say = path, uri, run_id, say
        self._state_path = path.with_name(DELIVERED)
        self._offset = int((read_json(self._state_path) or {}).get("offset", 0))
        self.down: Optional[str] = None  # why the store is unreachable, while it is

    def __call__(self) -> bool:
        """Deliver what is new; True when everything written so far is in the store."""
        if not self.path.exists():
            return self._up()
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
        for group, size in _groups(data[:end]):
            try:
                self._deliver(group)
            except Exception as exc:  # noqa: BLE001 - any store failure is an outage to ride out
                return self.went_down(exc)
            self._offset += size
            update_json(self._state_path, offset=self._offset)
        return self._up()

    def pending(self) -> int:
        """Lines of the event log not yet in the store."""
        if not self.path.exists():
            return 0
        with self.path.open("rb") as f:
            f.seek(self._offset)
            return f.read().count(b"\n")

    def _deliver(self, group: List[Dict[str, Any]]) -> None:
        kind = group[0]["kind"]
        if kind == "metrics":
            log_metric_points(self.uri, self.run_id, [(e["metrics"], e["step"], e.get("time")) for e in group])
        elif kind == "tags":
            set_tags(self.uri, self.run_id, group[0]["tags"])
        elif kind == "artifacts":
            log_artifacts(self.uri, self.run_id, [Path(p) for p in group[0]["paths"]], group[0]["artifact_path"])

    def went_down(self, exc: BaseException) -> bool:
        if self.down is None:
            self.down = outage_reason(exc)
            self._say(f"[runner] tracking store {self.uri} unreachable ({self.down}); training goes on, its "
                      f"reports are kept in {self.path} and sent when the store is back")
        return False

    def _up(self) -> bool:
        if self.down is not None:
            self.down = None
            self._say(f"[runner] tracking store {self.uri} is back; the reports kept meanwhile are sent")
        return True


def _groups(data: bytes) -> Iterator[Tuple[List[Dict[str, Any]], int]]:
    """The lines of ``data`` as delivery groups (consecutive metric events together), with their bytes."""
    group: List[Dict[str, Any]] = []
    size = 0
    for line in data.splitlines(keepends=True):
        event = json.loads(line)
        if group and (event["kind"] != "metrics" or group[0]["kind"] != "metrics" or len(group) >= _BATCH_POINTS):
            yield group, size
            group, size = [], 0
        group.append(event)
        size += len(line)
    if group:
        yield group, size


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
        measured = int(time.time() * 1000)
        self.put(lambda uri, run_id: log_metric_points(uri, run_id, [(metrics, step, measured)]))

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
