"""Typed configuration schema: the single source of truth for every key and its default.

The root dataclass is registered in Hydra's ConfigStore as ``runner_schema`` and named first in
``conf/config.yaml``'s defaults list, so every group's YAML file merges onto its typed node and holds only
what its option changes. A value of the wrong type fails while Hydra composes; ranges and cross-key rules
are checked by :func:`runner.config.validation.validate` before anything is launched. The groups' fields
are in :mod:`.schema_model` (model, sharding, cluster) and :mod:`.schema_training` (optimizer, precision,
data, train).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional, cast

from hydra.core.config_store import ConfigStore

from runner.config.choices import one_of
from runner.config.errors import ConfigError, config_error_line, first_line, wrong_type
from runner.config.precisions import loss_scaling_by_default
from runner.config.schema_model import ClusterSchema, ModelSchema, ShardingSchema
from runner.config.schema_training import DataSchema, OptimizerSchema, PrecisionSchema, TrainSchema


@dataclass
class ObjectiveSchema:
    metric: Optional[str] = None
    """The run metric a job returns to a searching sweeper (``hydra/sweeper=optuna``); null: ``eval/auc``
    in train mode, ``plan/est_step_ms`` (the plan's estimated step time) in plan mode."""
    direction: Optional[str] = one_of(None, ("max", "min"), null=True)
    """``max`` | ``min``; null: ``max`` for metrics named ``*auc*`` or ``*accuracy*``, else ``min``. A point
    with no value (no plan fits, a failed job) returns the worst value: -inf for max, +inf for min."""
    more_metrics: List[str] = field(default_factory=list)
    """Further run metrics a job returns after ``metric``, for a multi-objective study (``hydra.sweeper.direction``
    a list, one direction per metric: e.g. ``[minimize, minimize]`` for ``plan/est_step_ms`` and
    ``plan/max_mem_bytes``); each one's direction by its name, as ``direction``'s null says."""
    study: Optional[str] = None
    """Set by the Optuna sweeper on a trial's job when its study has a pruner: the file naming the study's storage,
    name and pruner (``optuna_trial.yaml`` in the sweep folder); the job reports ``metric`` at each checkpoint's
    evaluation and stops where the pruner says so (:mod:`runner.track.trial`)."""
    trial: Optional[int] = None
    """Set by the Optuna sweeper with ``study``: the number of the trial this job is."""


@dataclass
class TrackingSchema:
    uri: Optional[str] = None
    """MLflow tracking URI. Default: $MLFLOW_TRACKING_URI, else sqlite:///<project>/mlflow.db."""
    experiment: str = "runner"
    """MLflow experiment name."""
    run_name: Optional[str] = None
    """MLflow run name (default: the config choices, e.g. ``dlrm-rowwise-local``)."""
    system_metrics: bool = True
    """Record CPU, memory, disk, network (and GPU) use over a training run, per node, in the run's System metrics."""
    system_metrics_interval_s: float = 10.0
    """Seconds between system-metric samples."""
    objective: ObjectiveSchema = field(default_factory=ObjectiveSchema)
    """What each job returns to the sweeper (metric and direction)."""


@dataclass
class SweepSchema:
    retries: int = 0
    """Run a job (a sweep's point, or a single job) again, up to this many times, when it failed from a fault:
    a worker or agent killed by a signal, a tracking server that did not answer at the start. Each attempt
    keeps its files (the earlier ones in ``previous/<n>/``) and its MLflow run (tag ``runner.attempt``).
    Config errors, failures of the job's own code and "no plan fits" are answers, never retried."""
    reuse: Optional[bool] = None
    """Link a sweep's point to a FINISHED run of the same config (tag ``runner.config_hash``) in the experiment
    instead of running it; null: on for plan-only points (their answers are deterministic), off for training."""
    max_failures: Optional[int] = None
    """Stop the sweep once this many points have failed (null: never): no point starts after that, the points
    running are stopped (KILLED), the parent ends FAILED naming the failures' common reason, and ``python -m
    runner resume <sweep folder>`` runs the rest once the cause is fixed. A plan-only "no plan fits" is an
    answer and a fault retried into a success (``sweep.retries``) is not a failure."""
    verbose: bool = False
    """Print each point's details (its plan's table and note) as a single run does; by default a sweep's point
    prints its one summary line and the sweep one progress line per finished point."""
    resume_changed: bool = False
    """Resume a sweep folder (``python -m runner resume <folder>``, or the same ``hydra.sweep.dir`` again) with
    overrides that differ from its command; its points finished with another config run again."""


@dataclass
class CalibrateSchema:
    """``mode=calibrate``: how the hardware is measured (docs/calibration.md)."""

    repeats: int = 7
    """Timed repeats of each measurement, after one warm-up (at least 3: the spread needs them)."""
    max_spread: float = 0.25
    """The repeats' allowed scatter (median absolute deviation over the median, a fraction) at ``repeats``: a part
    is trusted when its medians are known as well as ``repeats`` repeats scattered this much know them (their
    relative standard error, 1.2533 x spread / sqrt(repeats)); a scattered point takes more repeats
    (``max_repeats``). A part that stays untrusted falls back alone to TorchRec's constants (docs/calibration.md)."""
    max_repeats: int = 64
    """The most timed repeats of one measurement, when its median is not yet known well enough (the median's error
    shrinks as 1/sqrt(repeats): 64 know it three times better than 7). At least ``repeats``."""
    max_extra_s: float = 40.0
    """Seconds, at most, that the extra repeats of one calibration take (an equal share for each part: the
    collectives, kernels, sharded lookups and dense part), so the whole command stays bounded on a busy
    machine."""
    dense_per_job: bool = True
    """A training job planned with a calibration times its own dense part (forward, backward, the dense optimizer's
    step; 3 repeats on each worker, before planning) for its whole step's estimate, instead of the calibration's
    rate per FLOP, which models of other shapes (wide inputs, cross layers) do not follow. Never changes the plan."""
    grid: str = one_of("full", ("full", "small"))
    """``full``: every kernel shape and message size | ``small``: a few of each (seconds; a quick check)."""
    max_message_mib: Optional[float] = None
    """The largest collective message per rank, MiB (null: 16 on CPU, 256 on a GPU)."""
    keep: bool = True
    """Keep a trusted calibration in ``cluster.calibration_dir`` for ``cluster.calibration=auto``."""


@dataclass
class RunnerConfig:
    mode: str = one_of("train", ("train", "plan", "calibrate", "write_data"))
    """``train`` (launch workers) | ``plan`` (plan and log in this process only; any cluster) | ``calibrate``
    (measure this cluster's kernels, collectives and dense part on the job's workers; write a calibration for
    ``cluster.calibration``: docs/calibration.md) | ``write_data`` (write the synthetic source for this model as
    Parquet to ``data.path``)."""
    model: ModelSchema = field(default_factory=ModelSchema)
    sharding: ShardingSchema = field(default_factory=ShardingSchema)
    optimizer: OptimizerSchema = field(default_factory=OptimizerSchema)
    cluster: ClusterSchema = field(default_factory=ClusterSchema)
    precision: PrecisionSchema = field(default_factory=PrecisionSchema)
    data: DataSchema = field(default_factory=DataSchema)
    train: TrainSchema = field(default_factory=TrainSchema)
    tracking: TrackingSchema = field(default_factory=TrackingSchema)
    sweep: SweepSchema = field(default_factory=SweepSchema)
    calibrate: CalibrateSchema = field(default_factory=CalibrateSchema)


WORKER_MODES = ("train", "calibrate")  # the modes whose job runs on workers (the others run in the driver)


def samples_per_step(train: TrainSchema) -> int:
    """Rows per rank per optimizer step: ``train.batch_size`` times ``train.grad_accumulation_steps``."""
    return int(train.batch_size) * int(train.grad_accumulation_steps)


def loss_scaling_enabled(precision: PrecisionSchema) -> bool:
    """``precision.grad_scaler.enabled``, whose null means: on with float16 autocast."""
    enabled = precision.grad_scaler.enabled
    return loss_scaling_by_default(precision.autocast) if enabled is None else bool(enabled)


def uses_split_step(train: TrainSchema, precision: PrecisionSchema) -> bool:
    """Gradient accumulation and loss scaling train with the split step (:mod:`runner.train.split_step`), which
    needs every table sharded by TorchRec: no ``data_parallel`` tables."""
    return train.grad_accumulation_steps > 1 or loss_scaling_enabled(precision)


def load_resolved(path: Path) -> RunnerConfig:
    """A job's ``resolved.yaml`` (written by the driver, or given to torchrun) as the typed config: merged onto
    the schema, so a value of the wrong type, or a key the schema does not have, fails here in one line naming
    the key and the file (:class:`ConfigError`), and every later assignment is checked as Hydra's is."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError("resolved config", str(path), f"a config file the runner wrote ({first_line(exc)})") from None
    if not isinstance(data, dict):
        raise ConfigError("resolved config", str(path), "a config file the runner wrote (a mapping of keys)")
    try:
        return freeze(cast(RunnerConfig, OmegaConf.merge(OmegaConf.structured(RunnerConfig), data)))
    except OmegaConfBaseException as exc:
        key = str(getattr(exc, "full_key", "") or "resolved config")
        typed = wrong_type(exc)
        raise config_error_line(f"{typed} (in {path})" if typed else f"{key}: {first_line(exc)} (in {path})",
                                key) from None


def register_schemas() -> None:
    """Register the root schema; ``conf/config.yaml`` names it first, so every group merges onto it."""
    ConfigStore.instance().store(name="runner_schema", node=RunnerConfig)


def freeze(cfg: RunnerConfig) -> RunnerConfig:
    """``cfg`` made read-only: an assignment while the job runs fails instead of changing what every later
    reader sees (the driver's config once the job's place is known, every agent's and worker's)."""
    from omegaconf import OmegaConf

    OmegaConf.set_readonly(cast(Any, cfg), True)  # the schema-typed config is an OmegaConf node
    return cfg
