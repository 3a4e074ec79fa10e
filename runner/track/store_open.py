"""A plan-only job's local MLflow store opened beside its planning: in a fork, while TorchRec is imported and
the model built (:func:`open_store_beside`), then waited for and checked before the job's run opens
(:func:`settle_store`), refused in the same one line as :func:`.store.check_store` gives. The store's own lock
(:func:`.store.client`) keeps the fork and this process from creating its tables at once."""

from __future__ import annotations

import os
from typing import Dict

from runner.runtime.process_end import fork_helper, reap
from runner.track.store import check_store, sqlite_folder

_BESIDE: Dict[str, int] = {}  # store -> the process opening it beside this one (open_store_beside)


def open_store_beside(uri: str) -> None:
    """Start opening a local SQLite store (MLflow's import, and a new store's tables and migrations: 3-5 s) in
    a fork while this process goes on (a plan-only job imports TorchRec and builds its model meanwhile);
    :func:`settle_store` waits for it, then checks as before (quickly: the store is there) and refuses with the
    same line where it failed. Other stores are checked here and now."""
    if sqlite_folder(uri) is None or not hasattr(os, "fork") or uri in _BESIDE:
        check_store(uri)
        return
    # the fork opens it and says only whether that worked (the job says why, when it checks)
    pid = fork_helper(lambda: check_store(uri), "RUNNER_STORE_HELPER_PARENT")
    _BESIDE[uri] = pid


def settle_store(uri: str) -> None:
    """Where :func:`open_store_beside` is opening ``uri``: wait for it and check the store (refused in one line
    where it cannot be opened); otherwise nothing."""
    pid = _BESIDE.pop(uri, None)
    if pid is not None:
        reap(pid)
        check_store(uri)
