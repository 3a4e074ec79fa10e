"""The UI links the runner prints open MLflow's model-training view (MLflow 3 opens experiments on GenAI)."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit


def test_run_and_compare_links_open_the_training_view(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from runner.track.ui_links import compare_url, run_url

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("links", artifact_location=(tmp_path / "mlartifacts").as_uri())  # not cwd's
    a, b = (client.create_run(exp).info.run_id for _ in range(2))
    fragment = urlsplit(run_url(uri, a)).fragment
    assert fragment == f"/experiments/{exp}/runs/{a}?workflowType=machine_learning"
    path, query = urlsplit(compare_url(uri, exp, [a, b])).fragment.split("?", 1)
    params = {k: v[0] for k, v in parse_qs(query).items()}
    assert path == "/compare-runs" and params["workflowType"] == "machine_learning"
    assert json.loads(unquote(params["runs"])) == [a, b] and json.loads(unquote(params["experiments"])) == [exp]
