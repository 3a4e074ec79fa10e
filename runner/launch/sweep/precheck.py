"""The pre-check: every override (each value of a sweep too) is composed and validated before Hydra
starts a job, so a wrong value fails at once with one line naming the key and what is allowed; and the
overrides the runner adds for the launcher.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, List, Optional, Set, Tuple, cast

from runner import PROJECT_ROOT
from runner.config.errors import ConfigError, first_line, wrong_type
from runner.config.keydocs import check_known_keys, unknown_key_line
from runner.config.modes import MODES
from runner.config.paired import point
from runner.config.sweepers import RUNNER_SWEEPERS, sweeper_of
from runner.config.validation import validate
from runner.launch import schedulers
from runner.launch.schedulers.host_pool import pools_points
from runner.launch.sweep.overrides import combinations, file_sweeps, split_args, sweep_axes
from runner.plan import check_file, check_folder
from runner.runtime.cores import plan_batch_size

if TYPE_CHECKING:
    from hydra.core.config_loader import ConfigLoader
    from omegaconf import DictConfig

    from runner.config.schema import ObjectiveSchema, RunnerConfig

CONF_DIR = str(PROJECT_ROOT / "conf")


def _group_error(override: str, loader: ConfigLoader) -> Optional[str]:
    key, _, value = override.lstrip("+~").partition("=")
    if "." in key or not value or key.startswith("hydra") or key not in loader.list_groups(""):
        return None
    options = loader.get_group_options(key)
    if value in options or value == "null":
        return None
    return f"{key}={value!r} is not an option; expected one of {', '.join(options)}"


def _format(exc: BaseException, override_text: List[str]) -> str:
    cause = exc.__cause__ or exc
    full_key = getattr(cause, "full_key", None)
    msg = first_line(cause) or type(cause).__name__
    if typed := wrong_type(cause):
        return typed
    if full_key and "is not in struct" in msg:  # a new key under a dict-valued setting
        given = next((o for o in override_text if o.split("=", 1)[0] == str(full_key)
                      or o.startswith(f"{full_key}.")), f"{full_key}=...")
        return (f"{full_key}: no such key yet; a new entry of a dict-valued setting is added with a leading +, "
                f"e.g. +{given.lstrip('+')}")
    if full_key and "not in '" in msg and str(full_key).split(".")[0] != "hydra":  # a key the schema does not have
        return unknown_key_line(str(full_key), "given on the command line")
    if full_key:
        return f"{full_key}: {msg}"
    return f"{msg} (in: {' '.join(override_text)})"


@contextlib.contextmanager
def hydra_conf() -> Iterator[Any]:
    """Hydra initialised on the runner's ``conf/`` for composing by hand (cleared before and after, so
    that Hydra's own start-up finds it free): yields its config loader."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            yield GlobalHydra.instance().config_loader()
    finally:
        GlobalHydra.instance().clear()


def precheck(args: List[str]) -> Tuple[Optional[str], List[str]]:
    """Compose and validate what ``args`` ask for: the one-line error (None when all is well), and the
    overrides the runner adds for the launcher (contiguous batches for a plan-only joblib sweep,
    :func:`runner.runtime.cores.plan_batch_size`)."""
    from hydra import compose

    overrides, config_name, checkable = split_args(args)
    if not checkable:
        return None, []
    command = list(overrides)
    multirun = any(a in ("-m", "--multirun") for a in args)
    with hydra_conf() as loader:
        try:
            if multirun:
                overrides = overrides + file_sweeps(overrides, config_name, loader)
            values, order = sweep_axes(overrides, loader)
        except ConfigError as exc:  # override syntax, paired axes of unequal lengths
            return str(exc), []
        except Exception as exc:  # noqa: BLE001
            return first_line(exc), []
        combos = combinations(values, order)
        _GRID[:] = [values, config_name, None, order] if multirun and len(combos) > 1 else []
        error = check_points(combos, config_name, loader) or next(
            (e for e in (_check_launcher(c, config_name) for c in combos) if e), None)
        if error:
            return error, []
        first = compose(config_name=config_name or "config", overrides=combos[0], return_hydra_config=True)
        error = _check_output_folder(first.hydra, multirun)
        if error or not multirun:
            return error, []
        error = _check_sweeper(first.hydra.sweeper, first.tracking.objective, str(first.mode)) or _check_resume(
            first.hydra, bool(first.sweep.resume_changed), command)
        if error:
            return error, []
        launcher = first.hydra.launcher
        size = plan_batch_size(str(first.mode), launcher, math.prod(len(v) for v in values),
                               pools_points(launcher))
        own = RUNNER_SWEEPERS.get(first.hydra.sweeper.get("_target_"))  # grid: checked here; optuna: resumable
        return None, ([] if size is None else [f"hydra.launcher.batch_size={size}"]) + ([] if own is None else [
            f"hydra.sweeper._target_={own}"])


def _from_first(first: Optional[Tuple[List[str], Any]], combo: List[str], loader: ConfigLoader) -> Optional[Any]:
    """A point's config from the first point's, where Hydra's compose would give the same: every override the
    same key in the same place, and those whose values differ plain changes of non-group keys to scalars
    (Hydra applies each as ``OmegaConf.update(cfg, key, value, merge=True)`` after composing the same
    defaults). None where that does not hold or the update fails (composed in full: Hydra's message)."""
    import copy

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from omegaconf import OmegaConf

    if first is None or len(first[0]) != len(combo):
        return None
    theirs, ours = (OverridesParser.create().parse_overrides(c) for c in (first[0], combo))
    keys = [o.key_or_group for o in ours]
    if len(set(keys)) != len(keys) or keys != [o.key_or_group for o in theirs]:
        return None
    changed = [o for o, t in zip(ours, theirs, strict=True) if o.input_line != t.input_line]
    groups = set(loader.list_groups(""))
    for o in changed:
        if o.type != OverrideType.CHANGE or o.package is not None or o.key_or_group in groups or "/" in o.key_or_group \
                or o.key_or_group.startswith("hydra") or o.is_sweep_override() \
                or not isinstance(o.value(), (int, float, str, bool, type(None))):
            return None
    cfg = copy.deepcopy(first[1])
    try:
        for o in changed:
            OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
    except Exception:  # noqa: BLE001 - composed in full for Hydra's own message
        return None
    return cfg


_CHECKED: Set[Tuple[str, ...]] = set()  # the override combinations validated in this process
_GRID: List[Any] = []  # the last pre-check's sweep: its values per override, its config name, its first point


def grid_points(keep: Callable[[Any], bool], limit: int = 1000) -> List[Tuple[List[str], Any]]:
    """Every point of the grid sweep the last pre-check checked (its overrides, its config composed), in
    Hydra's order, while ``keep`` holds for each config; empty for a single run, above ``limit`` points, or as
    soon as a point is not kept (its first point was composed by the pre-check already, so a sweep of other
    points composes nothing more). Points differing from the first only in values are derived from its config
    (:func:`_from_first`)."""
    import itertools

    from hydra import compose

    if not _GRID or math.prod(len(v) for v in _GRID[0]) > limit:
        return []
    values, config_name, first, order = _GRID
    out: List[Tuple[List[str], Any]] = []
    with hydra_conf() as loader:
        for axes in itertools.product(*values):
            combo = point(axes, order)
            cfg = _from_first(first, combo, loader)
            if cfg is None:
                cfg = compose(config_name=config_name or "config", overrides=combo)
            if not keep(cfg):
                return []
            out.append((combo, cfg))
    return out


def checked(overrides: List[str]) -> bool:
    """Whether the pre-check composed and validated exactly this combination of overrides in this process
    (a single run, or a sweep's point under the in-process launcher): its job need not validate it again. A
    grid point whose values each were checked with the first point's others, or a job in another process
    (joblib, Slurm), validates its own config."""
    return tuple(overrides) in _CHECKED


def check_points(combos: List[List[str]], config_name: Optional[str], loader: ConfigLoader) -> Optional[str]:
    """The first combination's error (compose + validate), naming the point when it is a sweep's; points
    differing from the first only in values are derived from its config (:func:`_from_first`)."""
    from hydra import compose

    first: Optional[Tuple[List[str], Any]] = None
    for combo in combos:
        where = f" (sweep point: {' '.join(combo)})" if len(combos) > 1 else ""
        if err := next(filter(None, (_group_error(o, loader) for o in combo)), None):
            return err + where
        try:
            cfg = _from_first(first, combo, loader)
            if cfg is None:
                cfg = compose(config_name=config_name or "config", overrides=combo)
                first = first or (combo, cfg)
            check_known_keys(cfg, combo)
            validate(cast("RunnerConfig", cfg))
            schedulers.named(cfg.cluster.scheduler)  # one of the schedulers (a ConfigError naming them)
            check_file(cfg.cluster.calibration)  # a calibration file that cannot be used: one line, nothing starts
            if MODES[cfg.mode].keeps_calibration and cfg.calibrate.keep:  # before anything is measured
                check_folder(cfg.cluster.calibration_dir)
            _CHECKED.add(tuple(combo))
            if _GRID and _GRID[2] is None:  # the grid's first point (the first value of every sweep)
                _GRID[2] = (combo, cfg)
        except ConfigError as exc:
            return str(exc) + where
        except Exception as exc:
            return _format(exc, combo)
    return None


def _check_sweeper(sweeper: DictConfig, objective: ObjectiveSchema, mode: str) -> Optional[str]:
    """A sweeper (``hydra.sweeper``) the runner declares; a searching one must optimise the way
    ``tracking.objective`` says is better, one direction per metric a job of ``mode`` returns."""
    from runner.track.objective import objectives

    try:
        sweeper_of(str(sweeper.get("_target_")))
    except ConfigError as exc:
        return str(exc)
    wanted = sweeper.get("direction")
    if wanted is None:
        return None
    asked = [str(wanted)] if isinstance(wanted, str) else [str(w) for w in wanted]
    returned = objectives(objective, mode)
    names = ", ".join(f"{m} ({d})" for m, d in returned)
    shown = asked[0] if len(asked) == 1 else "[" + ",".join(asked) + "]"
    if len(asked) != len(returned):
        return (f"hydra.sweeper.direction={shown} asks for {len(asked)} value(s) "
                f"but each job returns {len(returned)}: {names} (tracking.objective.metric and more_metrics)")
    if len(asked) > 1 and sweeper.get("pruner"):
        return ("hydra/sweeper/pruner stops a trial on one metric; a multi-objective study "
                "(tracking.objective.more_metrics) cannot be pruned: leave the pruner out")
    if (wrong := next((w for w in asked if w not in ("minimize", "maximize")), None)) is not None:
        return f"hydra.sweeper.direction={wrong!r} is not allowed; expected minimize or maximize (or a list of them)"
    if [w[:3] for w in asked] != [d for _, d in returned]:
        better = [("maximize" if d == "max" else "minimize") for _, d in returned]
        return (f"hydra.sweeper.direction={shown} but tracking.objective is {names}; set "
                f"hydra.sweeper.direction={better[0] if len(better) == 1 else '[' + ','.join(better) + ']'}"
                + (f" or tracking.objective.direction={asked[0][:3]}" if len(asked) == 1 else ""))
    return None


def _check_launcher(combo: List[str], config_name: Optional[str]) -> Optional[str]:
    """A scheduler's launch (Slurm's): what its nodes must reach (the store, the sweep folder), before anything is
    submitted."""
    scheduler = schedulers.of_command(combo)
    if scheduler.launcher is None:
        return None
    from hydra import compose

    from runner.config.errors import SchedulerError

    try:
        point = compose(config_name=config_name or "config", overrides=combo, return_hydra_config=True)
        scheduler.check_submission(point.hydra, str(point.mode), point.cluster, point.tracking.uri)
    except SchedulerError as exc:
        return str(exc)
    return None


def _check_resume(hydra: DictConfig, resume_changed: bool, overrides: List[str]) -> Optional[str]:
    """A sweep folder (``hydra.sweep.dir``) that holds another command's sweep is refused (resuming it would mix two
    sweeps), unless ``sweep.resume_changed``."""
    from runner.launch.sweep.resume import check_resume

    try:
        folder = Path(str(hydra.sweep.dir)).expanduser().absolute()
    except Exception:  # noqa: BLE001 - a folder only Hydra's job can resolve: a new one
        return None
    return check_resume(folder, overrides, resume_changed)


def _check_output_folder(hydra: DictConfig, multirun: bool) -> Optional[str]:
    """The run (or sweep) folder can be made: a folder is created and removed where it would go."""
    import tempfile

    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        folder = Path(str(hydra.sweep.dir if multirun else hydra.run.dir)).expanduser().absolute()
    except Exception:  # noqa: BLE001 - a folder only Hydra's job can resolve: left to Hydra
        return None
    nearest = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if nearest is None:
        return None
    if not nearest.is_dir():
        return f"{key}={folder}: {nearest} is a file, not a folder; choose another folder"
    try:
        Path(tempfile.mkdtemp(prefix=".runner-check-", dir=nearest)).rmdir()
    except OSError as exc:
        return (f"{key}={folder} cannot be created ({exc.strerror or exc} in {nearest}); choose a folder you "
                f"can write, e.g. {key}=outputs/mine")
    return None
