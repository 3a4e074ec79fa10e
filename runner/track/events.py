"""How rank 0's reports reach the MLflow run without the training loop waiting on the store.

With a driver (``python -m runner``), rank 0 appends each report as one JSON line to the run folder's
``events.jsonl`` (:class:`EventLog`: microseconds a step) and the driver, idle meanwhile, writes the new
lines to the store every few seconds and once more at the end (:class:`EventPump`). Under an external
``torchrun`` rank 0 owns the run and hands its reports to MLflow's asynchronous logging (:class:`StoreSink`).
The three share one interface: ``metrics``, ``tags``, ``artifacts``, ``close``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from runner.config.errors import first_line
from runner.runtime.rundir import DELIVERED, read_json, update_json
from runner.track.store import client, log_artifacts, log_metric_points, metric_entities, outage_reason, set_tags


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


_GROUP_VALUES = 1000  # metric values per delivery (MLflow's batch limit: one store transaction each)


class EventPump:
    """The driver's side (and ``python -m runner sync``'s): delivers the complete new lines of rank 0's
    event log to the run, in order, and records in ``delivered.json`` how far it got.

    The store may be unreachable for a while (a tracking server restarted, a network outage): then the
    pump says so once, keeps every line where it is, and tries again on its next call; training does
    not wait. When the store answers again it delivers the backlog and says so.

    Each group of up to 1000 values goes in one synchronous ``log_batch`` and counts as delivered once the
    store has it. MLflow's asynchronous queue was measured no faster here (``benchmarks/tracking_rate.py``:
    5.9k against 7.1k values/s on SQLite, 1.4k against 1.3k over HTTP): the driver has nothing else to do.
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
    size = values = 0
    for line in data.splitlines(keepends=True):
        event = json.loads(line)
        n = len(event.get("metrics", ()))
        if group and (event["kind"] != "metrics" or group[0]["kind"] != "metrics" or values + n > _GROUP_VALUES):
            yield group, size
            group, size, values = [], 0, 0
        group.append(event)
        size += len(line)
        values += n
    if group:
        yield group, size


class StoreSink:
    """Rank 0's side under an external torchrun (it owns the run): MLflow's asynchronous logging.

    Each report is handed to MLflow's logging queue with the time rank 0 measured it and returns at once;
    MLflow's writer takes what was queued every ``BUFFER_S`` seconds and merges it into batches of up to
    1000 values, so a slow store costs one transaction per batch, not per report (without the buffering
    MLflow writes each report on its own). ``close()`` waits until every report is in the store and
    raises the first failure. Artifacts (the plan's files before training, its chart after) are written
    when handed over.
    """

    BUFFER_S = 2  # as often as a driver writes rank 0's reports (the store's work competes with training)

    def __init__(self, uri: str, run_id: str) -> None:
        self.uri, self.run_id = uri, run_id
        os.environ.setdefault("MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS", str(self.BUFFER_S))  # read per take
        self._client = client(uri)
        self._pending: List[Any] = []  # MLflow's RunOperations, one per report

    def metrics(self, metrics: Mapping[str, float], step: int) -> None:
        points = metric_entities([(metrics, step, int(time.time() * 1000))])
        self._pending.append(self._client.log_batch(self.run_id, metrics=points, synchronous=False))

    def tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        self._pending.append(self._client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()],
                                                    synchronous=False))

    def artifacts(self, paths: Iterable[Path], artifact_path: Optional[str]) -> None:
        log_artifacts(self.uri, self.run_id, list(paths), artifact_path)

    def close(self) -> None:
        pending, self._pending = self._pending, []
        errors = []
        for ops in pending:
            try:
                ops.wait()
            except Exception as exc:  # noqa: BLE001 - every report is waited for; the first failure is raised
                errors.append(exc)
        if errors:
            raise RuntimeError(f"MLflow logging failed for {len(errors)} of {len(pending)} reports: "
                               f"{first_line(str(errors[0]))}")
