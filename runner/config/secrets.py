"""Credentials never written down: a tracking URI's ``user:password@`` is taken out before the URI is used,
printed, logged or stored, and shown with the password replaced.

MLflow reads HTTP credentials from ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` (and a token
from ``MLFLOW_TRACKING_TOKEN``); its client does not understand them inside the URI. From the environment
(``MLFLOW_TRACKING_URI``) the runner moves them into those variables; in the config (``tracking.uri``, which
Hydra writes into the run folder) they are refused.
"""

from __future__ import annotations

import os
import re
from typing import Optional, Tuple
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

HIDDEN = "***"


def _host(parts: SplitResult) -> str:
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return host + (f":{parts.port}" if parts.port else "")


def split_credentials(uri: str) -> Tuple[str, Optional[str], Optional[str]]:
    """``uri`` without ``user:password@``, and the user and password it held (None when absent)."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or (parts.username is None and parts.password is None):
        return uri, None, None
    bare = urlunsplit(parts._replace(netloc=_host(parts)))
    return (bare, unquote(parts.username) if parts.username else None,
            unquote(parts.password) if parts.password else None)


def redact_uri(uri: str) -> str:
    """``uri`` as it may be shown: a password replaced by ``***``."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or parts.password is None:
        return uri
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:{HIDDEN}@{_host(parts)}"))


def credentials_to_environment(uri: str) -> str:
    """``uri`` without its credentials, which go to MLflow's variables (those already set are kept)."""
    bare, user, password = split_credentials(uri)
    for name, value in (("MLFLOW_TRACKING_USERNAME", user), ("MLFLOW_TRACKING_PASSWORD", password)):
        if value is not None:
            os.environ.setdefault(name, value)
    return bare


_IN_TEXT = re.compile(r"(https?\\?://[^\s:/@]*\\?:)[^\s@/]+@")


def redact_text(text: str) -> str:
    """``text`` (an override, a command line) with every URI's password replaced by ``***``; Hydra's
    escaped form (``http\\://user\\:password@``) too."""
    return _IN_TEXT.sub(lambda m: f"{m.group(1)}{HIDDEN}@", text)


_SECRET_NAME = re.compile(r"pass(word|wd)?\b|token|secret|(api|access|private)[_-]?key", re.IGNORECASE)


def redact_value(name: str, value: str) -> str:
    """``value`` as it may be recorded under ``name``: hidden when the name says password, token, secret or
    key (``aws_secret_access_key``, ``api_token``), a URI's password hidden otherwise."""
    return HIDDEN if _SECRET_NAME.search(name) else redact_text(value)
