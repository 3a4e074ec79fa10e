"""A password never shown: tracking URIs with credentials are split, redacted, or refused in one line."""

from __future__ import annotations

import pytest
from conftest import FAST

import runner.cli  # noqa: F401  (schema and resolvers)
from runner.config.secrets import (
    credentials_to_environment,
    redact_text,
    redact_uri,
    redact_value,
    split_credentials,
)
from runner.launch.sweep.precheck import precheck


def test_credentials_are_split_out_of_a_uri() -> None:
    assert split_credentials("http://alice:p%40ss@[::1]:5000/x") == ("http://[::1]:5000/x", "alice", "p@ss")
    assert split_credentials("https://tok@h.example.com") == ("https://h.example.com", "tok", None)
    assert split_credentials("sqlite:////tmp/a:b@c.db")[1:] == (None, None)
    assert redact_uri("https://bob:pw@h.example.com:443/p") == "https://bob:***@h.example.com:443/p"
    assert redact_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert redact_text(r"tracking.uri=http\://a\:s3cret@h\:1 http://h:5000/p") == r"tracking.uri=http\://a\:***@h\:1 http://h:5000/p"


def test_credentials_go_to_mlflows_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "kept")
    assert credentials_to_environment("http://alice:s3cret@127.0.0.1:5000") == "http://127.0.0.1:5000"
    import os

    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "alice" and os.environ["MLFLOW_TRACKING_PASSWORD"] == "kept"


@pytest.mark.parametrize("sweep", [False, True])
def test_a_password_in_the_config_is_refused_without_showing_it(sweep: bool) -> None:
    uri = "tracking.uri=http://alice:s3cret@127.0.0.1:5000" + (",http://bob:other@127.0.0.1:5001" if sweep else "")
    error, _ = precheck([*(["-m"] if sweep else []), uri, *FAST])
    assert error is not None and "MLFLOW_TRACKING_PASSWORD" in error and "tracking.uri" in error
    assert "s3cret" not in redact_text(error) and "other" not in redact_text(error)


def test_values_under_secret_names_are_hidden() -> None:
    assert redact_value("hydra.launcher.additional_parameters.aws_secret_access_key", "AKIA123") == "***"
    assert redact_value("x.api_token", "t") == "***" and redact_value("db.password", "p") == "***"
    assert redact_value("cluster.master_port", "29500") == "29500"
    assert redact_value("sharding.constraints.t0.cache_load_factor", "0.2") == "0.2"
    assert redact_value("tracking.uri", "http://a:b@h:1") == "http://a:***@h:1"
