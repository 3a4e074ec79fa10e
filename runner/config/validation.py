"""Validation of a composed config: ranges and cross-key rules, one line per problem.

Types are checked by Hydra against :mod:`runner.config.schema` while composing; what a type cannot say
(ranges, choices, rules between keys) is checked here, before anything is launched.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import TYPE_CHECKING, Any

from omegaconf import ListConfig

from runner.config.choices import allowed_values, describe
from runner.config.errors import ConfigError
from runner.config.model_families import FAMILIES
from runner.config.pipelines import split_step_fault
from runner.config.reservations import canonical, missing_from_stack
from runner.config.schema import RunnerConfig, TableConstraintSchema, uses_split_step
from runner.config.secrets import redact_uri, split_credentials
from runner.config.tables import table_specs

if TYPE_CHECKING:
    from runner.config.schema import (
        ClusterSchema,
        DataSchema,
        ModelSchema,
        OptimizerSchema,
        PrecisionSchema,
        ScheduleSchema,
        ShardingSchema,
        TrainSchema,
    )


def check_choices(cls: type, node: Any, prefix: str = "") -> None:
    """Every key of ``node`` (a config of the dataclass ``cls``, and of its nested dataclasses) that the schema
    gives a closed set of values holds one of them (each item, for a list); else :class:`ConfigError`
    naming the key (``prefix`` + its path) and the values allowed."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        allowed = allowed_values(f)
        value = getattr(node, f.name)
        if allowed is None:
            kind = hints.get(f.name)
            if isinstance(kind, type) and dataclasses.is_dataclass(kind):
                check_choices(kind, value, f"{prefix}{f.name}.")
            continue
        values, null = allowed
        if value is None and null:
            continue
        for item in list(value) if isinstance(value, (list, tuple, ListConfig)) else [value]:
            if item not in values:
                raise ConfigError(f"{prefix}{f.name}", item, describe(values, null))


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(key, value, allowed)


NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,99}")
NAME_FORM = ("a name of letters, digits, '_' and '-' starting with a letter or '_' (at most 100 characters: it "
             "becomes a TorchRec module key, an MLflow key and a file name; for 'user.age' write user_age)")


def _validate_model(m: ModelSchema) -> None:
    _check(m.embedding_dim > 0, "model.embedding_dim", m.embedding_dim, "a positive integer")
    names = [tb.name for tb in m.tables] + [f"g{i:03d}" for i in range(max(m.generated_tables.count, 0))]
    _check(len(set(names)) == len(names), "model.tables", names, "unique table names")
    for i, tb in enumerate(m.tables):
        _check(NAME.fullmatch(str(tb.name)) is not None, f"model.tables[{i}].name", tb.name, NAME_FORM)
        _check(tb.num_embeddings > 0, f"model.tables[{i}].num_embeddings", tb.num_embeddings, "> 0")
        _check(tb.embedding_dim is None or tb.embedding_dim > 0, f"model.tables[{i}].embedding_dim",
               tb.embedding_dim, "null or > 0")
    _check(len(m.tasks) >= 1 and len(set(m.tasks)) == len(m.tasks), "model.tasks", list(m.tasks),
           "a list of distinct task (label column) names")
    for i, task in enumerate(m.tasks):
        _check(NAME.fullmatch(str(task)) is not None, f"model.tasks[{i}]", task, NAME_FORM)
    family = FAMILIES[m.family]
    _check(len(m.tasks) == 1 or family.multi_task, "model.tasks", list(m.tasks),
           f"one task for model.family={m.family} (multi-task: "
           + ", ".join(f"model.family={f.name}" for f in FAMILIES.values() if f.multi_task) + ")")
    _check(m.num_experts >= 1, "model.num_experts", m.num_experts, "an integer >= 1")
    g = m.generated_tables
    _check(g.count >= 0, "model.generated_tables.count", g.count, ">= 0")
    _check(0 < g.min_rows <= g.max_rows, "model.generated_tables.min_rows", g.min_rows, "0 < min_rows <= max_rows")
    _check(len(g.dims) > 0 and all(d > 0 for d in g.dims), "model.generated_tables.dims", list(g.dims),
           "a list of positive widths")
    _check(len(m.tables) + g.count > 0, "model.tables", list(m.tables), "at least one table")
    if family.one_width:
        widths = {tb.embedding_dim for tb in m.tables if tb.embedding_dim is not None} - {m.embedding_dim}
        _check(not widths, "model.tables[].embedding_dim", sorted(widths),
               f"null or model.embedding_dim ({m.embedding_dim}) for model.family={m.family}")
    _check(m.dcn_num_layers > 0 and m.dcn_low_rank_dim > 0, "model.dcn_num_layers", m.dcn_num_layers,
           "positive layers and low-rank dim")
    _check(len(m.dense_arch_layer_sizes) > 0
           and (not family.dense_out_is_dim or m.dense_arch_layer_sizes[-1] == m.embedding_dim),
           "model.dense_arch_layer_sizes", list(m.dense_arch_layer_sizes),
           f"a list ending with model.embedding_dim ({m.embedding_dim})")
    _check(len(m.over_arch_layer_sizes) > 0 and m.over_arch_layer_sizes[-1] == 1, "model.over_arch_layer_sizes",
           list(m.over_arch_layer_sizes), "a list ending with 1")


def table_constraint(sharding: ShardingSchema, table: str) -> Any:
    """``sharding.constraints.<table>`` checked against :class:`TableConstraintSchema` (None if unset)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    entry = sharding.constraints.get(table)
    if entry is None:
        return None
    try:
        return OmegaConf.merge(OmegaConf.structured(TableConstraintSchema), entry)
    except OmegaConfBaseException as exc:
        fields = ", ".join(TableConstraintSchema.__dataclass_fields__)
        raise ConfigError(f"sharding.constraints.{table}", OmegaConf.to_container(entry) if OmegaConf.is_config(entry)
                          else entry, f"fields {fields} ({str(exc).splitlines()[0]})") from None


def _validate_sharding(s: ShardingSchema, model: ModelSchema) -> None:
    if s.plan:
        from pathlib import Path

        from runner.config.config_files import json_error
        from runner.config.errors import config_error_line

        bad = json_error(Path(s.plan), "sharding.plan")
        if bad:
            raise config_error_line(bad, "sharding.plan")
    tables = [t.name for t in table_specs(model)]
    for table in s.constraints:
        _check(table in tables, f"sharding.constraints.{table}", table,
               "a table of the model: " + ", ".join(tables[:12]) + (", ..." if len(tables) > 12 else ""))
    _check(0.0 <= s.storage_reserve_percent < 1.0, "sharding.storage_reserve_percent",
           s.storage_reserve_percent, "a fraction in [0, 1)")
    _validate_reserve(s)
    _check(s.planner_batch_size is None or s.planner_batch_size > 0, "sharding.planner_batch_size",
           s.planner_batch_size, "null or a positive integer")
    _check(s.planner_timeout_s is None or s.planner_timeout_s > 0, "sharding.planner_timeout_s",
           s.planner_timeout_s, "null or a positive number of seconds")
    _check(s.balanced_work > 0, "sharding.balanced_work", s.balanced_work, "a positive number of evaluations")
    _check(s.balanced_patience >= 0, "sharding.balanced_patience", s.balanced_patience, "a number of evaluations >= 0")
    _check(s.balanced_gap >= 0, "sharding.balanced_gap", s.balanced_gap, "a fraction >= 0")
    for key in ("dp_hbm_bins", "grid_max_proposals"):
        _check(getattr(s, key) > 0, f"sharding.{key}", getattr(s, key), "a positive integer")
    for table in s.constraints:
        c = table_constraint(s, table)
        check_choices(TableConstraintSchema, c, f"sharding.constraints.{table}.")
        _check(c.cache_load_factor is None or 0 < c.cache_load_factor <= 1,
               f"sharding.constraints.{table}.cache_load_factor", c.cache_load_factor, "null or in (0, 1]")
        _check(c.pooling_factor is None or c.pooling_factor > 0, f"sharding.constraints.{table}.pooling_factor",
               c.pooling_factor, "null or > 0")
        _check(c.min_partition is None or c.min_partition > 0, f"sharding.constraints.{table}.min_partition",
               c.min_partition, "null or > 0")


def _installed_torchrec() -> Any:
    """The installed TorchRec's version, read without importing it (None: not found)."""
    from importlib import metadata

    try:
        return metadata.version("torchrec")
    except metadata.PackageNotFoundError:
        return None


def _validate_reserve(s: ShardingSchema) -> None:
    """The storage reservation's own keys (:mod:`runner.config.reservations`), and a policy the installed TorchRec
    lacks refused before launch, naming the stack that has it."""
    policy = s.storage_reserve_policy
    _check(s.storage_reserve_dense_multiplier > 0, "sharding.storage_reserve_dense_multiplier",
           s.storage_reserve_dense_multiplier, "a positive number of bytes per parameter byte")
    _check(s.storage_reserve_overhead_gib >= 0, "sharding.storage_reserve_overhead_gib", s.storage_reserve_overhead_gib,
           "a size in GiB >= 0")
    _check(s.storage_reserve_base_gib is None or s.storage_reserve_base_gib >= 0, "sharding.storage_reserve_base_gib",
           s.storage_reserve_base_gib, "null or a size in GiB >= 0")
    _check(s.storage_reserve_home_gib is None or s.storage_reserve_home_gib > 0, "sharding.storage_reserve_home_gib",
           s.storage_reserve_home_gib, "null (this cluster's device memory) or a positive size in GiB")
    _check(s.storage_reserve_gib is None or s.storage_reserve_gib >= 0, "sharding.storage_reserve_gib",
           s.storage_reserve_gib, "null or a size in GiB >= 0")
    _check(s.storage_reserve_gib is not None or canonical(policy) != "fixed_absolute", "sharding.storage_reserve_gib",
           s.storage_reserve_gib, "a size in GiB >= 0 with sharding.storage_reserve_policy=fixed_absolute")
    lacks = missing_from_stack(policy, _installed_torchrec())
    _check(lacks is None, "sharding.storage_reserve_policy", policy, str(lacks))


def _validate_schedule(key: str, s: ScheduleSchema) -> None:
    _check(s.warmup_steps >= 0, f"{key}.warmup_steps", s.warmup_steps, ">= 0")
    _check(0 < s.decay_rate <= 1, f"{key}.decay_rate", s.decay_rate, "in (0, 1]")
    _check(s.decay_steps > 0, f"{key}.decay_steps", s.decay_steps, "> 0")
    _check(0 < s.gamma <= 1, f"{key}.gamma", s.gamma, "in (0, 1]")
    _check(list(s.milestones) == sorted(set(s.milestones)) and all(m > 0 for m in s.milestones),
           f"{key}.milestones", list(s.milestones), "increasing positive steps")
    _check(0 <= s.min_factor <= 1, f"{key}.min_factor", s.min_factor, "in [0, 1]")


def _validate_optimizer(o: OptimizerSchema) -> None:
    for key in ("sparse_lr", "dense_lr", "sparse_eps", "dense_eps"):
        _check(getattr(o, key) > 0, f"optimizer.{key}", getattr(o, key), "a positive number")
    for key in ("sparse_weight_decay", "dense_weight_decay", "dense_momentum"):
        _check(getattr(o, key) >= 0, f"optimizer.{key}", getattr(o, key), ">= 0")
    _validate_schedule("optimizer.sparse_schedule", o.sparse_schedule)
    _validate_schedule("optimizer.dense_schedule", o.dense_schedule)
    _check(o.clip.max > 0, "optimizer.clip.max", o.clip.max, "a positive number")


def _validate_cluster(c: ClusterSchema) -> None:
    for key in ("nodes", "workers_per_node"):
        _check(getattr(c, key) >= 1, f"cluster.{key}", getattr(c, key), "an integer >= 1")
    for key in ("intra_node_bandwidth", "cross_node_bandwidth"):
        v = getattr(c, key)
        _check(v is None or v > 0, f"cluster.{key}", v, "null (measured, or TorchRec's default) or a positive "
               "bandwidth in GiB/s")
    for key in ("hbm_cap_gib", "ddr_cap_gib"):
        v = getattr(c, key)
        _check(v is None or v > 0, f"cluster.{key}", v, "null or a positive size in GiB")
    _check(c.master_port is None or 0 < c.master_port < 65536, "cluster.master_port", c.master_port,
           "null or a port in 1..65535")
    _check(c.node_rank is None or 0 <= c.node_rank < c.nodes, "cluster.node_rank", c.node_rank,
           f"null or an integer in [0, cluster.nodes={c.nodes})")
    _check(c.pg_timeout_s > 0, "cluster.pg_timeout_s", c.pg_timeout_s, "a positive number of seconds")
    _check(c.max_restarts >= 0, "cluster.max_restarts", c.max_restarts, "an integer >= 0")


def _validate_run(p: PrecisionSchema, d: DataSchema, t: TrainSchema) -> None:
    for key in ("num_workers", "prefetch_batches"):
        _check(getattr(d, key) >= 0, f"data.{key}", getattr(d, key), "an integer >= 0")
    for key in ("write_rows", "write_files", "write_eval_rows", "num_dense_features", "eval_batches"):
        _check(getattr(d, key) > 0, f"data.{key}", getattr(d, key), "a positive integer")
    _check(d.label_noise > 0, "data.label_noise", d.label_noise, "a positive number")
    _check(d.ids_per_feature >= 1, "data.ids_per_feature", d.ids_per_feature, "an integer >= 1")
    _check(0 <= d.zipf_alpha <= 5, "data.zipf_alpha", d.zipf_alpha, "0 (uniform) or an exponent in (0, 5]")
    g = p.grad_scaler
    _check(g.init_scale > 0 and g.growth_factor > 1 and 0 < g.backoff_factor < 1 and g.growth_interval > 0,
           "precision.grad_scaler",
           {k: getattr(g, k) for k in ("init_scale", "growth_factor", "backoff_factor", "growth_interval")},
           "init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, growth_interval > 0")
    for key in ("steps", "batch_size", "log_every", "grad_accumulation_steps"):
        _check(getattr(t, key) > 0, f"train.{key}", getattr(t, key), "a positive integer")
    _check(t.semi_sync_start >= 0, "train.semi_sync_start", t.semi_sync_start, "an integer >= 0")
    _check(t.threads_per_worker is None or t.threads_per_worker > 0, "train.threads_per_worker",
           t.threads_per_worker, "null or a positive integer")
    k = t.checkpoint
    _check(k.every_steps is None or k.every_steps > 0, "train.checkpoint.every_steps", k.every_steps,
           "null or a positive integer")
    _check(k.keep_last >= 1, "train.checkpoint.keep_last", k.keep_last, "an integer >= 1")


def validate(cfg: RunnerConfig) -> None:
    """Check values, ranges and cross-key rules of a composed config; raise :class:`ConfigError` on the first."""
    check_choices(RunnerConfig, cfg)
    _validate_model(cfg.model)
    _validate_sharding(cfg.sharding, cfg.model)
    _validate_optimizer(cfg.optimizer)
    _validate_cluster(cfg.cluster)
    _validate_run(cfg.precision, cfg.data, cfg.train)
    _check(cfg.tracking.system_metrics_interval_s > 0, "tracking.system_metrics_interval_s",
           cfg.tracking.system_metrics_interval_s, "> 0")
    _check(cfg.sweep.retries >= 0, "sweep.retries", cfg.sweep.retries, "an integer >= 0")
    _check(cfg.calibrate.repeats >= 3, "calibrate.repeats", cfg.calibrate.repeats, "an integer >= 3")
    _check(0 < cfg.calibrate.max_spread < 1, "calibrate.max_spread", cfg.calibrate.max_spread, "a fraction in (0, 1)")
    _check(cfg.calibrate.max_repeats >= cfg.calibrate.repeats, "calibrate.max_repeats", cfg.calibrate.max_repeats,
           f"an integer >= calibrate.repeats={cfg.calibrate.repeats}")
    _check(cfg.calibrate.max_extra_s >= 0, "calibrate.max_extra_s", cfg.calibrate.max_extra_s, "seconds >= 0")
    _check(cfg.calibrate.max_message_mib is None or cfg.calibrate.max_message_mib >= 0.0625,
           "calibrate.max_message_mib", cfg.calibrate.max_message_mib, "null or a size >= 0.0625 MiB (64 KiB)")
    _check(cfg.sweep.max_failures is None or cfg.sweep.max_failures >= 1, "sweep.max_failures",
           cfg.sweep.max_failures, "null (never stop) or an integer >= 1")
    if cfg.tracking.uri and split_credentials(cfg.tracking.uri)[1:] != (None, None):
        raise ConfigError("tracking.uri", redact_uri(cfg.tracking.uri),
                          "a URI without user:password@ (the run folder keeps the config): set "
                          "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD instead, or put the whole URI in "
                          "MLFLOW_TRACKING_URI")
    refused = split_step_fault(cfg.train.pipeline, uses_split_step(cfg.train, cfg.precision))
    if refused is not None:
        raise ConfigError("train.pipeline", cfg.train.pipeline, refused)
    if uses_split_step(cfg.train, cfg.precision):
        why = "sharding types without data_parallel with train.grad_accumulation_steps > 1 or fp16 loss scaling"
        _check("data_parallel" not in cfg.sharding.types, "sharding.types", list(cfg.sharding.types), why)
        for table in cfg.sharding.constraints:
            types = table_constraint(cfg.sharding, table).sharding_types or []
            _check("data_parallel" not in types, f"sharding.constraints.{table}.sharding_types", list(types), why)
