"""How rank 0's reports reach the MLflow run without the training loop waiting on the store.

With a driver (``python -m runner``), rank 0 appends each report as one JSON line to the run folder's
``events.jsonl`` (:class:`EventLog`: microseconds a step) and the driver, idle meanwhile, writes the new
lines to the store every few seconds and once more at the end (:class:`EventPump`). Under an external
``torchrun``, with no driver, rank 0's own process runs the pump from a thread
(:func:`runner.track.mlflow_run.torchrun_run`).

Each line carries its writer's id (``writer``): the run folder's, made by the first process that writes the log
(``events_writer.json``) and taken by every later one of the same job (the driver, rank 0, a rank 0 restarted by
torch elastic, a resumed sweep's process for its parent), which may log the same steps again. A process of an
earlier job in the folder (its files set aside, e.g. a rank 0 left running) still holds the earlier id: its lines,
interleaved with the job's, are passed over by the reader, saying so, instead of reaching the job's run.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from runner.config.errors import disk_full
from runner.runtime.run_files import DELIVERED, EVENTS_WRITER, read_json, update_json
from runner.track.store import client, log_artifacts, log_params, log_step_metrics, outage_reason, set_tags


class EventLog:
    """Rank 0's side when a driver owns the run: MLflow events appended as JSON lines, each metric point
    stamped with the time rank 0 measured it (what the store gets, however late it is delivered)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = path.open("a", buffering=1)
        self.writer = _writer_of(path)

    def _write(self, event: Dict[str, Any]) -> None:
        try:
            self._f.write(json.dumps({**event, "writer": self.writer}) + "\n")
        except OSError as exc:  # a full disk: name the event log (the write's error names no file)
            raise OSError(exc.errno, exc.strerror, exc.filename or str(self.path)) from exc

    def metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._write({"kind": "metrics", "metrics": {k: float(v) for k, v in metrics.items()}, "step": step,
                     "time": int(time.time() * 1000)})

    def tags(self, tags: Mapping[str, Any]) -> None:
        self._write({"kind": "tags", "tags": {k: str(v) for k, v in tags.items()}})

    def params(self, params: Mapping[str, str]) -> None:
        self._write({"kind": "params", "params": dict(params)})

    def artifacts(self, paths: Iterable[Path], artifact_path: Optional[str]) -> None:
        self._write({"kind": "artifacts", "paths": [str(p) for p in paths], "artifact_path": artifact_path})

    def close(self) -> None:
        self._f.close()


def log_writer(path: Path) -> Optional[int]:
    """The id of the event log ``path``'s writer (``events_writer.json`` beside it); None where there is none (an
    older runner's folder) or it cannot be read back: then every line is the job's."""
    found = read_json(path.with_name(EVENTS_WRITER))
    writer = found.get("writer") if isinstance(found, dict) else None
    return writer if _count(writer) else None


def last_logged(path: Path, metric: str) -> Optional[float]:
    """The last value of ``metric`` the job logged in the event log ``path`` (None: none, or no log): what its run
    gets, whether or not the store is there now."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return None
    writer, found = log_writer(path), None
    for line in lines:
        event = _event(line)
        if event and event["kind"] == "metrics" and metric in event["metrics"] and (
                writer is None or event.get("writer") in (None, writer)):
            found = float(event["metrics"][metric])
    return found


def _writer_of(path: Path) -> int:
    """This process's writer id for the log ``path``: the folder's, made now where this is its first writer
    (written whole under a temporary name, then linked: two first writers at once agree on one)."""
    mark = path.with_name(EVENTS_WRITER)
    for _ in range(50):  # a writer that is making it: read again
        found = log_writer(path)
        if found is not None or not mark.exists():
            break
        time.sleep(0.02)
    if found is not None:
        return found
    if mark.exists():  # damaged: the reader takes every line as the job's; left as it is
        return secrets.randbits(62)
    writer = secrets.randbits(62)
    tmp = mark.with_name(f"{mark.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({"writer": writer}))
        os.link(tmp, mark)
    except FileExistsError:
        found = log_writer(path)
        writer = found if found is not None else writer
    except OSError:  # a read-only or full folder: the lines are marked, the reader takes them all
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return writer


_GROUP_VALUES = 1000  # metric values per delivery (MLflow's batch limit: one store transaction each)


class EventPump:
    """The driver's side (and ``python -m runner sync``'s): delivers the complete new lines of rank 0's
    event log to the run, in order, and records in ``delivered.json`` how far it got.

    The store may be unreachable for a while (a tracking server restarted, a network outage): then the
    pump says so once, keeps every line where it is, and tries again on its next call; training does
    not wait. When the store answers again it delivers the backlog and says so.

    Each group of up to 1000 values goes in one synchronous ``log_batch`` and counts as delivered once the
    store has it. MLflow's asynchronous queue was measured no faster here (``benchmarks/tracking_rate.py``,
    figures in docs/benchmarks.md): the driver has nothing else to do.
    """

    def __init__(self, path: Path, uri: str, run_id: str, say: Callable[[str], None] = print,
                 warn: Optional[Callable[[str], None]] = None) -> None:
        # warn: where lines passed over are said (a sync that says nothing of the store's coming and going says these)
        self.path, self.uri, self.run_id, self._say, self._warn = path, uri, run_id, say, warn or say
        self._state_path = path.with_name(DELIVERED)
        self._offset = self._delivered()
        self.down: Optional[str] = None  # why the store is unreachable, while it is

    def __call__(self) -> bool:
        """Deliver what is new; True when everything written so far is in the store. Called in the run folder's
        delivery turn (:func:`runner.runtime.folder_lock.taking_turns`), so the offset another process recorded
        meanwhile is where this one goes on from."""
        self._offset = max(self._offset, self._delivered(say=False))
        data = self._unread()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
        skipped: List[int] = []
        others: List[int] = []
        for group, size in _groups(data[:end], skipped, log_writer(self.path), others):
            try:
                if group:
                    self._deliver(group)
            except Exception as exc:  # noqa: BLE001 - any store failure but a full disk is an outage to ride out
                if disk_full(exc):  # the artifact store's disk: it will not pass by itself (the job ends in one line)
                    assert isinstance(exc, OSError)
                    raise OSError(exc.errno, exc.strerror, exc.filename or self._artifacts_at()) from exc
                return self.went_down(exc)
            self._offset += size
            update_json(self._state_path, offset=self._offset)
        if skipped:
            self._warn(f"[runner] warning: {self.path}: {len(skipped)} damaged line(s) ({sum(skipped)} bytes) are not "
                      "events; passed over, the rest delivered")
        if others:
            self._warn(f"[runner] warning: {self.path}: {len(others)} line(s) written by another process than the run "
                       f"folder's job (writer {', '.join(map(str, sorted(set(others))))}, not the job's "
                       f"{log_writer(self.path)} in {EVENTS_WRITER}: an earlier job's process still writing?); passed "
                       "over, the rest delivered")
        return self._up()

    def _delivered(self, say: bool = True) -> int:
        """How far the event log was delivered (``delivered.json``); 0 where there is no record yet. A record
        that cannot be read back, or that does not fall on a line's start, is said (``say``) and the log is
        delivered from its start (metrics already in the store are logged again at the same steps)."""
        if not self._state_path.exists():
            return 0
        found = read_json(self._state_path)
        offset = found.get("offset") if isinstance(found, dict) else None
        size = self.path.stat().st_size if self.path.exists() else 0
        if offset == 0 or offset is None and isinstance(found, dict) and set(found) <= {"final", "ended"}:
            return 0  # no offset yet: the job's ending kept before anything was delivered
        if isinstance(offset, int) and 0 < offset <= size:
            with self.path.open("rb") as f:
                f.seek(offset - 1)
                if f.read(1) == b"\n":  # the end of a line: where the next one starts
                    return offset
        if say:
            self._warn(f"[runner] warning: {self._state_path} cannot be read back or does not match "
                      f"{self.path.name}; the event log is delivered again from its start")
        return 0

    def _artifacts_at(self) -> str:
        """Where the run's artifacts go (a local folder, else the store's URI for them)."""
        try:
            uri = client(self.uri).get_run(self.run_id).info.artifact_uri
        except Exception:  # noqa: BLE001
            return f"the artifact store of {self.uri}"
        return uri[len("file://"):] if uri.startswith("file://") else uri

    def pending(self) -> int:
        """Lines of the event log not yet in the store."""
        return self._unread().count(b"\n")

    def _unread(self) -> bytes:
        if not self.path.exists():
            return b""
        with self.path.open("rb") as f:
            f.seek(self._offset)
            return f.read()

    def _deliver(self, group: List[Dict[str, Any]]) -> None:
        kind = group[0]["kind"]
        if kind == "metrics":
            log_step_metrics(self.uri, self.run_id, [(e["metrics"], e["step"], e.get("time")) for e in group])
        elif kind == "params":
            log_params(self.uri, self.run_id, group[0]["params"])
        elif kind == "tags":
            set_tags(self.uri, self.run_id, group[0]["tags"])
        elif kind == "artifacts":
            log_artifacts(self.uri, self.run_id, [Path(p) for p in group[0]["paths"]], group[0]["artifact_path"])

    def went_down(self, exc: BaseException) -> bool:
        if self.down is None:
            self.down = outage_reason(exc)
            self._say(f"[runner] tracking store {self.uri} unreachable ({self.down}); the job goes on, its "
                      f"reports are kept in {self.path} and sent when the store is back")
        return False

    def _up(self) -> bool:
        if self.down is not None:
            self.down = None
            self._say(f"[runner] tracking store {self.uri} is back; the reports kept meanwhile are sent")
        return True


def _event(line: bytes) -> Optional[Dict[str, Any]]:
    """One line of the event log as an event; None for a line that is not one (garbled, or cut: a disk
    that filled, a copy that stopped)."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and _FIELDS_OK.get(event.get("kind"), _never)(event) and (
        event.get("writer") is None or _count(event["writer"])) else None


def _never(event: Dict[str, Any]) -> bool:
    return False


def _count(value: Any) -> bool:
    """A step or a time in milliseconds as MLflow stores them (a signed 64-bit integer, at least 0)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _texts(found: Any) -> bool:
    return isinstance(found, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in found.items())


_FIELDS_OK: Dict[Any, Callable[[Dict[str, Any]], bool]] = {  # what EventLog writes of each kind, checked value by value
    "metrics": lambda e: isinstance(e.get("metrics"), dict) and all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in e["metrics"].items())
    and _count(e.get("step")) and (e.get("time") is None or _count(e["time"])),
    "params": lambda e: _texts(e.get("params")),
    "tags": lambda e: _texts(e.get("tags")),
    "artifacts": lambda e: isinstance(e.get("paths"), list) and all(isinstance(p, str) for p in e["paths"])
    and (e.get("artifact_path") is None or isinstance(e["artifact_path"], str)),
}


def _groups(data: bytes, skipped: List[int], writer: Optional[int], others: List[int]
            ) -> Iterator[Tuple[List[Dict[str, Any]], int]]:
    """The lines of ``data`` as delivery groups (consecutive metric events together), with their bytes; a line
    that is not an event is passed over (its bytes counted with the next group's) and counted in ``skipped``, one
    marked by another writer than ``writer`` (the folder's; None: any) passed over too, its writer in ``others``."""
    group: List[Dict[str, Any]] = []
    size = values = 0
    for line in data.splitlines(keepends=True):
        event = _event(line)
        if event is None or writer is not None and event.get("writer") not in (None, writer):
            if event is None:
                skipped.append(len(line))
            else:
                others.append(event["writer"])
            size += len(line)
            continue
        n = len(event.get("metrics", ()))
        if group and (event["kind"] != "metrics" or group[0]["kind"] != "metrics" or values + n > _GROUP_VALUES):
            yield group, size
            group, size, values = [], 0, 0
        group.append(event)
        size += len(line)
        values += n
    if group or size:
        yield group, size
