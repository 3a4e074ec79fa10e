"""Where a person sees a run: the MLflow UI command with the ``mlflow`` this machine has, and links to a run's
page and to the compare view of a sweep's runs (MLflow 3's model-training view)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional

from runner.track.store import EXPERIMENT_OF, client


def mlflow_program() -> str:
    """The ``mlflow`` of this machine, as a shell command: the one beside the running Python (its venv), else the
    one on PATH, else ``<python> -m mlflow`` (a box whose packages live in a folder on PYTHONPATH has no script)."""
    import shlex
    import shutil
    import sys

    beside = Path(sys.executable).parent / "mlflow"
    if beside.is_file() and os.access(beside, os.X_OK):
        return shlex.quote(str(beside))
    found = shutil.which("mlflow")
    return shlex.quote(found) if found else f"{shlex.quote(sys.executable)} -m mlflow"


def ui_command(uri: str) -> str:
    """The command that shows ``uri`` in the MLflow UI, with the ``mlflow`` this machine has."""
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"{mlflow_program()} ui --backend-store-uri {uri}"


UI_DEFAULT = "http://127.0.0.1:5000"  # where ``mlflow ui`` serves a local store
TRAINING_VIEW = "workflowType=machine_learning"  # MLflow 3's UI opens on GenAI unless a link asks for this


def ui_base(uri: str) -> str:
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else UI_DEFAULT


def run_url(uri: str, run_id: str) -> str:
    """The run's page in the MLflow UI (its model-training view)."""
    # this process's own runs: without reading back the whole run (a second at a plan's 10,000 metrics)
    exp = EXPERIMENT_OF.get(run_id) or client(uri).get_run(run_id).info.experiment_id
    return f"{ui_base(uri)}/#/experiments/{exp}/runs/{run_id}?{TRAINING_VIEW}"


def compare_url(uri: str, experiment_id: str, run_ids: Iterable[str]) -> str:
    """The UI's compare view of ``run_ids`` (parallel coordinates, scatter and contour plots)."""
    import json
    from urllib.parse import quote

    runs, experiments = (quote(json.dumps(ids, separators=(",", ":"))) for ids in (list(run_ids), [experiment_id]))
    return f"{ui_base(uri)}/#/compare-runs?runs={runs}&experiments={experiments}&{TRAINING_VIEW}"


def view_hint(uri: str, run_id: Optional[str]) -> str:
    """``view: <url>`` for a run (after ``mlflow ui ...`` when the store is local)."""
    if not run_id:
        return f"view: {ui_command(uri)}"
    try:
        url = run_url(uri, run_id)
    except Exception:  # the link is a convenience; the run id is printed anyway
        return f"view: {ui_command(uri)}"
    if uri.startswith(("http://", "https://")):
        return f"view: {url}"
    return f"view: {url} (after: {ui_command(uri)})"
