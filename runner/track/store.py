"""The MLflow store: where runs go, creating and ending them, and logging to them.

A job's run is written from one process at a time: the driver creates it (config as params), writes what
rank 0 reports while the workers run (:mod:`runner.track.events`), and sets the final status. Under an
external ``torchrun`` there is no driver and rank 0 does all of it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from runner import PROJECT_ROOT
from runner.config.errors import TrackingError, first_line
from runner.config.secrets import credentials_to_environment, redact_value
from runner.runtime import run_files
from runner.runtime.signals import uninterrupted

_MAX_PARAM_VALUE = 6000  # MLflow's limit on a param value's length
LOCKED_RETRIES = 8  # an embedded SQLite store shared by concurrent jobs: ~13 s of backoff in all


def _store_write(fn: Any) -> Any:
    """A write to the store: never cut by Ctrl-C or SIGTERM (:func:`uninterrupted`), and retried with
    backoff while another process holds the SQLite store's write lock."""
    @functools.wraps(fn)
    def write(*args: Any, **kwargs: Any) -> Any:
        with uninterrupted():
            for attempt in range(LOCKED_RETRIES):
                try:
                    return fn(*args, **kwargs)
                except Exception as exc:
                    if "database is locked" not in str(exc) or attempt == LOCKED_RETRIES - 1:
                        raise
                    time.sleep(min(0.1 * 2 ** attempt, 4.0))
        return None

    return write


def tracking_uri(configured: Optional[str]) -> str:
    """``tracking.uri``, else $MLFLOW_TRACKING_URI (its ``user:password@`` moved to MLflow's credential
    variables, so that the URI can be shown and stored), else a SQLite store in the project folder."""
    uri = configured
    if not uri and os.environ.get("MLFLOW_TRACKING_URI"):  # bare for MLflow's own calls and child processes too
        uri = os.environ["MLFLOW_TRACKING_URI"] = credentials_to_environment(os.environ["MLFLOW_TRACKING_URI"])
    return uri or f"sqlite:///{PROJECT_ROOT / 'mlflow.db'}"


@functools.lru_cache(maxsize=8)
def client(uri: str) -> Any:
    """One client per store and process: building one (and its SQL engine) costs more than a write."""
    import logging

    from mlflow.tracking import MlflowClient  # deferred: mlflow takes seconds to import

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # e.g. "Creating initial MLflow database tables"
    if uri.startswith(("http://", "https://")):  # an outage is ridden out by the runner (events.EventPump), not
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")  # by minutes of the client's retries
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # the runner prints the run's link
    db = Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None
    if db is None or not db.parent.is_dir():
        return MlflowClient(tracking_uri=uri)
    # MLflow creates and migrates a SQLite schema in every process that opens the store (the client does, as
    # it is made): jobs started together on a new file would race (duplicate tables, half-done migrations).
    with run_files.exclusive(db.with_name(db.name + ".runner-lock")):  # MLflow keeps it for the process
        return MlflowClient(tracking_uri=uri)


def sqlite_folder(uri: str) -> Optional[Path]:
    """The folder of a ``sqlite:///<path>`` store (None for other stores)."""
    return Path(uri[len("sqlite:///"):]).parent if uri.startswith("sqlite:///") else None


PROBE_TIMEOUT_S = 5.0  # how long an unreachable tracking server may hold up a job before it is refused


@functools.lru_cache(maxsize=8)
def check_store(uri: str) -> None:
    """Refuse, in one line and within seconds, a store that cannot be reached or opened: before any worker
    starts (a server's client would otherwise retry for minutes). Checked once per store and process."""
    fix = "start it (mlflow server --host 127.0.0.1 --port 5000) or set tracking.uri / $MLFLOW_TRACKING_URI"
    if uri.startswith(("http://", "https://")):
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=PROBE_TIMEOUT_S):
                return
        except urllib.error.HTTPError:
            return  # a server answered (a proxy may not route /health): reachable
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            outage = TrackingError(f"tracking.uri={uri}: no MLflow server answers ({first_line(reason)}); {fix}")
            outage.fault = True  # the server may be back later
            raise outage from None
    folder = sqlite_folder(uri)
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrackingError(f"tracking.uri={uri}: the store's folder {folder} cannot be created "
                                f"({exc.strerror}); use a writable path, e.g. sqlite:///$HOME/mlflow.db") from None
    try:
        client(uri).search_experiments(max_results=1)
    except Exception as exc:
        known = uri.startswith(("sqlite:///", "http://", "https://", "file:", "/")) or "://" not in uri
        advice = "" if known else "; use sqlite:///<path>, a folder path, or http(s)://<server>"
        raise TrackingError(f"tracking.uri={uri}: MLflow cannot open this store ({first_line(exc)[:300]})"
                            f"{advice}") from None


_OUTAGES = ("Connection refused", "Connection reset", "timed out", "Name or service not known",
            "Temporary failure in name resolution", "No route to host", "Max retries exceeded", "Connection aborted",
            "Bad Gateway", "Service Unavailable")


def is_outage(uri: str, exc: BaseException) -> bool:
    """Whether ``exc``, from a call to the server at ``uri``, says the server is away (not that it refused)."""
    return uri.startswith(("http://", "https://")) and any(phrase in str(exc) for phrase in _OUTAGES)


def outage_reason(exc: BaseException) -> str:
    """A short reason for a failed store call (``Connection refused``), not the client's whole message."""
    text = str(exc)
    found = next((phrase for phrase in _OUTAGES if phrase in text), None)
    return found.lower() if found else (first_line(exc)[:160] or type(exc).__name__)


def experiment_id(uri: str, name: str) -> str:
    """Id of experiment ``name``, created on first use; local stores keep artifacts beside the DB."""
    c = client(uri)
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    folder = sqlite_folder(uri)
    location = (folder / "mlartifacts").as_uri() if folder is not None else None
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


@_store_write
def log_params(uri: str, run_id: str, params: Mapping[str, str]) -> None:
    from mlflow.entities import Param

    client(uri).log_batch(run_id, params=[Param(k, redact_value(k, str(v))) for k, v in params.items()])


@_store_write
def log_step_metrics(uri: str, run_id: str, steps: Iterable[Tuple[Any, ...]]) -> None:
    """Metrics of several steps, ``(metrics, step[, unix ms measured])`` each (no time: now), in as few store
    transactions as MLflow's batch limit allows (MLflow's ``log_batch`` splits the list)."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    client(uri).log_batch(run_id, metrics=[Metric(k, float(v), int(s[2]) if len(s) > 2 and s[2] else now, s[1])
                                           for s in steps for k, v in s[0].items()])


@_store_write
def set_tags(uri: str, run_id: str, tags: Mapping[str, Any]) -> None:
    from mlflow.entities import RunTag

    client(uri).log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


@_store_write
def log_artifacts(uri: str, run_id: str, paths: Iterable[Path], artifact_path: Optional[str] = None) -> None:
    c = client(uri)
    for p in paths:
        if p.is_dir():
            c.log_artifacts(run_id, str(p), artifact_path=(artifact_path or "") + p.name)
        elif p.exists():
            c.log_artifact(run_id, str(p), artifact_path=artifact_path)


def context_tags(tags: Mapping[str, Any]) -> Dict[str, str]:
    """MLflow's own context tags (user, source, git commit and branch when in a git work tree), as its fluent
    API sets them, and a Description (``mlflow.note.content``): the command and the run folder."""
    from mlflow.tracking.context.registry import resolve_tags
    from mlflow.utils.mlflow_tags import MLFLOW_SOURCE_NAME

    found = {k: str(v) for k, v in resolve_tags({}).items()}
    if not found.get(MLFLOW_SOURCE_NAME, "").startswith(str(PROJECT_ROOT)):  # e.g. a Slurm task's submitit
        found[MLFLOW_SOURCE_NAME] = str(PROJECT_ROOT / "runner" / "__main__.py")
    sweep = tags.get("runner.kind") == "sweep"
    overrides = tags.get("runner.overrides", "(none)")
    command = f"python -m runner {'-m ' if sweep else ''}{'' if overrides == '(none)' else overrides}".strip()
    folder = tags.get("runner.sweep_dir" if sweep else "runner.run_dir")
    found["mlflow.note.content"] = (f"{'Sweep' if sweep else 'Job'}: `{command}`"
                                    + (f"\n\n{'Sweep' if sweep else 'Run'} folder: `{folder}`" if folder else ""))
    return found


def creation_tags(run_name: str, parent_run_id: Optional[str], tags: Mapping[str, Any]) -> Dict[str, str]:
    """Every tag a run is created with: ``tags``, its context (Description, source) and name, its parent."""
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

    all_tags = {**context_tags(tags), MLFLOW_RUN_NAME: run_name, **{k: str(v) for k, v in tags.items()}}
    return {**all_tags, MLFLOW_PARENT_RUN_ID: parent_run_id} if parent_run_id else all_tags


RECORD_TAG = "runner.record_id"  # chosen before a run is created: the run is found by it if a try's answer was lost


def new_record() -> Dict[str, str]:
    """The tag a run is created with so that it is created once (:func:`start_run`, ``sync.open_kept``)."""
    return {RECORD_TAG: uuid.uuid4().hex}


def start_run(uri: str, experiment: str, run_name: str, parent_run_id: Optional[str], tags: Mapping[str, Any]) -> str:
    """Create a RUNNING run (a child of ``parent_run_id`` when given) and return its id. Where ``tags`` carry a
    :data:`RECORD_TAG`, the run is created once: a server killed after it stored the run but before it answered has
    the client's retry create a second one, so the others of that record are deleted (they hold nothing yet); where
    no try was answered, the caller keeps the record and ``sync.open_kept`` finds the run it made."""
    all_tags = creation_tags(run_name, parent_run_id, tags)
    exp = experiment_id(uri, experiment)
    run_id = create_once(uri, exp, all_tags, run_name)
    EXPERIMENT_OF[run_id] = exp
    NOTE_OF[run_id] = all_tags.get("mlflow.note.content", "")
    return run_id


def create_once(uri: str, experiment_id_: str, all_tags: Mapping[str, str], run_name: str) -> str:
    """Create a run with ``all_tags`` (every tag it is made with, :func:`creation_tags`) and return its id; where they
    carry a :data:`RECORD_TAG` and the store is remote (only its call is retried), the other runs of that record,
    a retry's duplicates, are deleted (:func:`adopt_record`)."""
    run_id = client(uri).create_run(experiment_id_, tags=dict(all_tags), run_name=run_name).info.run_id
    if RECORD_TAG in all_tags and uri.startswith(("http://", "https://")):
        adopt_record(uri, experiment_id_, all_tags[RECORD_TAG], run_id)
    return run_id


def adopt_record(uri: str, experiment_id_: str, record: str, keep: Optional[str] = None) -> Optional[str]:
    """The run of ``record`` (``keep``, else the first made): any other run created with it is deleted (MLflow's
    soft delete), the duplicate of a creation retried after its answer was lost. None where there is none."""
    found = client(uri).search_runs([experiment_id_], f"tags.`{RECORD_TAG}` = '{record}'", max_results=50,
                                    order_by=["attributes.start_time ASC"])
    ids = [r.info.run_id for r in found]
    kept = keep if keep is not None else (ids[0] if ids else None)
    for other in ids:
        if other != kept:
            with contextlib.suppress(Exception):  # left as it is: a later sync ends it
                client(uri).delete_run(other)
    return kept


# what this process knows of the runs it created, so as not to read a whole run back (a second at a plan's
# 10,000 metrics): run id -> its experiment's id; -> its Description as this process last set it
EXPERIMENT_OF: Dict[str, str] = {}
NOTE_OF: Dict[str, str] = {}


def default_run_name(run_name: Optional[str], config: Mapping[str, Any],
                     choices: Optional[Mapping[str, Any]] = None) -> str:
    """``tracking.run_name`` (``run_name``), else ``<model>-<sharding>-<cluster>``: the options chosen (``choices``,
    Hydra's), else the names in ``config`` (the job's, resolved)."""
    if run_name:
        return run_name
    return "-".join(str((choices or {}).get(g) or config[g]["name"]) for g in ("model", "sharding", "cluster"))


@_store_write
def end_run(uri: str, run_id: str, status: str, error: Optional[str] = None) -> None:
    """Set the final status; a failure's reason goes into the ``error`` tag."""
    if error:
        client(uri).set_tag(run_id, "error", error[:5000])
    client(uri).set_terminated(run_id, status)
