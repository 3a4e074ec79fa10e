"""``python -m runner -m ... --dry-run``: a sweep previewed, nothing started.

Every point of the sweep (or the one job, without ``-m``) is composed and validated as the pre-check does, and
printed with its overrides, the pre-check's verdict (the one-line reason where it refuses the point) and whether
the experiment it records into already holds a FINISHED run of the same config (tag ``runner.config_hash``,
the one resume and ``sweep.reuse`` read). A searching sweeper (Optuna) is shown with its search space instead of
points. The launcher and sweeper it would use close the list. Nothing is created: no run, no folder, no store (a
store that does not exist yet is not opened; a SQLite file that does is opened read-only).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, List, Optional

from runner.config.parts import part
from runner.config.sweepers import sweeper_of

if TYPE_CHECKING:
    from omegaconf import DictConfig

LIMIT = 500  # points listed at most (the rest are counted)


def preview(args: List[str]) -> int:
    """Print the preview of ``args`` (with ``--dry-run`` taken out); exit status 2 when a point is refused."""
    from hydra import compose

    from runner.config.paired import point
    from runner.launch.sweep.overrides import combinations, file_sweeps, split_args, sweep_axes
    from runner.launch.sweep.precheck import check_points, hydra_conf

    overrides, config_name, _ = split_args(args)
    multirun = any(a in ("-m", "--multirun") for a in args)
    with hydra_conf() as loader:
        if multirun:
            overrides = overrides + file_sweeps(overrides, config_name, loader)
        values, order = sweep_axes(overrides, loader)
        first = compose(config_name=config_name or "config", overrides=combinations(values, order)[0],
                        return_hydra_config=True) if not check_points(
                            combinations(values, order)[:1], config_name, loader) else None
        sweeper = str(first.hydra.sweeper._target_) if first is not None else "?"
        launcher = str(first.hydra.launcher._target_) if first is not None else "?"
        if first is not None and (previews := sweeper_of(sweeper).previews):
            return int(part(previews)(first, args))
        total = math.prod(len(v) for v in values)
        refused = 0
        grid = (point(c, order) for c in itertools.product(*values))  # Hydra's order (the runner's grid sweeper)
        for n, combo in enumerate(itertools.islice(grid, LIMIT)):
            error = check_points([combo], config_name, loader)
            verdict = f"refused: {error}" if error else _done(compose(config_name=config_name or "config",
                                                                       overrides=combo))
            refused += bool(error)
            print(f"[dry-run] point {n}: {' '.join(combo) or '(defaults)'}: {verdict}", flush=True)
    if total > LIMIT:
        print(f"[dry-run] ... and {total - LIMIT} more point(s), not checked here", flush=True)
    print(f"[dry-run] {total} point(s), {refused} refused; launcher {launcher}, sweeper {sweeper}; nothing was "
          "started or written", flush=True)
    return 2 if refused else 0


def search_preview(first: Any, args: List[str]) -> int:
    """A searching sweeper's preview: its search space, trials and storage (its points are drawn as it runs)."""
    from runner.config.schema import resolved_mapping
    from runner.launch.sweep.study import JOURNAL_FILE, search_space

    sweeper = first.hydra.sweeper
    arguments = [a for a in args if "=" in a and not a.startswith(("hydra.", "hydra/", "-"))]  # as the sweeper has
    space, fixed = search_space(resolved_mapping(sweeper.params) if sweeper.params else {}, arguments)
    for key, dist in space.items():
        print(f"[dry-run] searched: {key} in {dist}", flush=True)
    storage = sweeper.storage or str(Path(str(first.hydra.sweep.dir)) / JOURNAL_FILE)
    print(f"[dry-run] {sweeper.n_trials} trial(s), {sweeper.n_jobs} at once, direction {sweeper.direction}, sampler "
          f"{sweeper.sampler._target_}, study {sweeper.study_name or 'runner'} in {storage}; launcher "
          f"{first.hydra.launcher._target_}, sweeper {sweeper._target_}; nothing was started or written", flush=True)
    return 0


def _done(point: DictConfig) -> str:
    """Whether the experiment already holds a FINISHED run of a ``point``'s config (composed):
    ``done before (run <id>)``, ``not run yet``, or why that cannot be told here (the store does not exist yet, or
    cannot be reached)."""
    from runner.config.schema import resolved_mapping
    from runner.launch.sweep.resume import config_digest, finished_runs_of
    from runner.track import store

    readable = _read_only(store.tracking_uri(point.tracking.uri))
    if readable is None:
        return "accepted; not run yet (the store does not exist yet)"
    try:
        from mlflow.tracking import MlflowClient

        digest = config_digest(point.cluster, str(point.mode), resolved_mapping(point))
        with _scratch_folder():
            found = finished_runs_of(MlflowClient(tracking_uri=readable), digest, point.tracking.experiment)
    except Exception as exc:  # noqa: BLE001 - a store that cannot answer: the point is still accepted
        return f"accepted; whether it ran before is unknown ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    return f"accepted; done before (run {found[0].info.run_id})" if found else "accepted; not run yet"


@contextlib.contextmanager
def _scratch_folder() -> Iterator[None]:
    """The working directory a scratch folder while MLflow opens a read-only SQLite store: it makes the parent folder
    of the path it is given (``_make_parent_dirs_if_sqlite``), for the read-only address's ``file:<path>`` a folder
    named ``file:`` in the working directory, which a dry run must not leave behind (and which breaks a later
    ``pip install -e .`` there)."""
    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="runner-dry-run-") as scratch:
        os.chdir(scratch)
        try:
            yield
        finally:
            os.chdir(here)


def _read_only(uri: str) -> Optional[str]:
    """``uri`` as a read-only store address (SQLite opened read-only, a file store only where it exists), or None
    where the store does not exist yet (opening it would create it)."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        return f"sqlite:///file:{db}?mode=ro&uri=true" if db.is_file() else None
    if uri.startswith(("http://", "https://", "databricks")):
        return uri
    folder = Path(uri[len("file://"):] if uri.startswith("file://") else uri)
    return uri if folder.is_dir() else None
