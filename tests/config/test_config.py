"""The config: every option composes, every bad value fails with one line before any launch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import ROOT, cfg_for, run_cli
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import runner.cli  # noqa: F401  (registers the schema and resolvers)
from runner.config.errors import ConfigError
from runner.config.validation import validate

GROUPS = ["model", "sharding", "optimizer", "cluster", "precision", "data"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


def test_expected_options_exist() -> None:
    assert {"auto", "rowwise", "tablewise", "columnwise", "tablerowwise", "dataparallel"} <= set(
        options("sharding"))
    assert {"local", "2node"} <= set(options("cluster"))
    assert {"fp32", "bf16"} <= set(options("precision"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes_and_validates(group: str, option: str) -> None:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"{group}={option}"])
    validate(cfg)
    assert cfg[group].name == option


def test_experiment_presets_compose() -> None:
    for preset in sorted(p.stem for p in (ROOT / "experiments").glob("*.yaml")):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            validate(compose(config_name="config", overrides=[f"experiment={preset}"]))


def test_2node_is_two_nodes_of_two() -> None:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["cluster=2node", "sharding=rowwise"])
    assert (cfg.cluster.nodes, cfg.cluster.workers_per_node) == (2, 2)
    assert list(cfg.sharding.types) == ["row_wise"]


def test_validate_names_key() -> None:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model.dense_arch_layer_sizes=[32,16]"])
    with pytest.raises(ConfigError, match="model.dense_arch_layer_sizes"):
        validate(cfg)


@pytest.mark.slow
def test_bad_value_inside_a_sweep_fails_before_any_job(tmp_path) -> None:
    proc = run_cli(["-m", "sharding.storage_reserve_percent=0.1,2.0", f"hydra.sweep.dir={tmp_path}"])
    assert proc.returncode != 0
    assert "sharding.storage_reserve_percent=2.0" in proc.stderr
    assert not (tmp_path / "0").exists()  # no job was launched


@pytest.mark.parametrize("overrides,key", [
    (["train.grad_accumulation_steps=0"], "train.grad_accumulation_steps"),
    (["train.pipeline=async"], "train.pipeline"),
    (["precision.autocast=float8"], "precision.autocast"),
    (["precision.grad_scaler.backoff_factor=2"], "precision.grad_scaler"),
    (["data.name=csv"], "data.name"),
    (["data.num_workers=-1"], "data.num_workers"),
    (["model.tasks=[click,conversion]"], "model.tasks"),
    (["model=mmoe", "model.tasks=[a,a]"], "model.tasks"),
    (["cluster.start_method=forkserver"], "cluster.start_method"),
    (["cluster.cpu_affinity=numa"], "cluster.cpu_affinity"),
    (["data.prefetch_batches=-1"], "data.prefetch_batches"),
    (["sharding=dataparallel", "train.grad_accumulation_steps=2"], "sharding.types"),
    (["sharding=dataparallel", "precision=fp16"], "sharding.types"),
])
def test_training_option_rules(overrides: list, key: str) -> None:
    from runner.config.errors import ConfigError

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.key == key


def closed_keys(cls: type, prefix: str = "") -> list:
    """``(key, allowed values, null allowed, is a list)`` of every key the schema gives a closed set of values."""
    import dataclasses
    import typing

    from runner.config.choices import allowed_values

    out, hints = [], typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        spec, kind = allowed_values(f), hints[f.name]
        if spec is not None:
            out.append((prefix + f.name, *spec, "List" in str(kind)))
        elif isinstance(kind, type) and dataclasses.is_dataclass(kind):
            out.extend(closed_keys(kind, f"{prefix}{f.name}."))
    return out


def test_every_key_with_allowed_values_refuses_others_naming_them() -> None:
    """The allowed values stated on a schema field are what validation accepts and what its error names."""
    from omegaconf import OmegaConf

    from runner.config.schema import RunnerConfig, TableConstraintSchema

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        base = compose(config_name="config", overrides=["+sharding.constraints.t0.pooling_factor=1.0"])
    keys = closed_keys(RunnerConfig) + closed_keys(TableConstraintSchema, "sharding.constraints.t0.")
    assert {"mode", "model.family", "sharding.types", "optimizer.sparse", "cluster.device", "precision.autocast",
            "train.pipeline", "sharding.constraints.t0.sharding_types"} <= {k for k, *_ in keys}
    for key, allowed, null, is_list in keys:
        for value in allowed:  # each allowed value passes this check (another rule may still refuse it)
            cfg = OmegaConf.create(OmegaConf.to_container(base))
            OmegaConf.update(cfg, key, [value] if is_list else value)
            try:
                validate(cfg)
            except ConfigError as exc:
                assert exc.key != key or "one of" not in str(exc), str(exc)
        cfg = OmegaConf.create(OmegaConf.to_container(base))
        OmegaConf.update(cfg, key, ["nope"] if is_list else "nope")
        with pytest.raises(ConfigError) as err:
            validate(cfg)
        assert err.value.key == key and f"{key}='nope' is not allowed" in str(err.value), (key, str(err.value))
        assert str(err.value).endswith(("null or " if null else "") + "one of " + ", ".join(allowed)), str(err.value)


@pytest.mark.slow
def test_glob_sweep_runs_every_matching_option(tmp_path) -> None:
    proc = run_cli(["-m", "mode=plan", "sharding=glob([tablew*,tablerow*])", f"hydra.sweep.dir={tmp_path}",
                    f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    planned = sorted((tmp_path / d / "plan" / "plan.json").exists() for d in ("0", "1"))
    assert planned == [True, True] and not (tmp_path / "2").exists()


@pytest.mark.slow
def test_experiment_file_sweep_with_a_bad_value_fails_before_any_job(tmp_path) -> None:
    preset = ROOT / "experiments" / f"_test_bad_sweep_{tmp_path.name}.yaml"
    preset.write_text("# @package _global_\nmode: plan\nhydra:\n  sweeper:\n    params:\n"
                      "      sharding.storage_reserve_percent: 0.1,1.5\n")
    try:
        proc = run_cli(["-m", f"experiment={preset.stem}", f"hydra.sweep.dir={tmp_path}"])
    finally:
        preset.unlink()
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "sharding.storage_reserve_percent=1.5 is not allowed" in line and "sweep point:" in line, line
    assert not (tmp_path / "0").exists()  # no job was launched


@pytest.mark.slow
def test_help_shows_groups_and_every_keys_doc() -> None:
    proc = run_cli(["--help"])
    assert proc.returncode == 0, proc.stderr
    assert "  sharding: auto, columnwise, dataparallel, gridshard, rowwise," in proc.stdout
    assert "  sharding.storage_reserve_percent = 0.15\n      Fraction (0..1) of every device's memory" in proc.stdout
    assert "  tracking.objective.direction = null\n" in proc.stdout and "hydra/sweeper=optuna" in proc.stdout
    only = run_cli(["--help", "bandwidth"]).stdout.split("Keys (key = default: what it means):")[1]
    keys = [ln.split(" = ")[0].strip() for ln in only.splitlines() if ln.startswith("  ") and not ln.startswith("    ")]
    assert keys and all("bandwidth" in k for k in keys), keys


def test_help_filtered_by_a_word_in_process(capsys: pytest.CaptureFixture) -> None:
    from runner.cli import _help

    assert _help(["--help", "reserve"])
    out = capsys.readouterr().out
    assert "  sharding: auto, columnwise, dataparallel, gridshard, rowwise," in out
    keys = out.split("Keys (key = default: what it means):")[1]
    assert "sharding.storage_reserve_percent = 0.15" in keys and "train.steps" not in keys
    assert _help(["--help", "proposer"])  # a key with allowed values: the schema's own list, as validation has it
    import dataclasses

    from runner.config.choices import allowed_values
    from runner.config.proposers import PROPOSERS
    from runner.config.schema import ShardingSchema

    (field,) = [f for f in dataclasses.fields(ShardingSchema) if f.name == "proposer"]
    allowed, _ = allowed_values(field)  # each with its declaration's summary
    said = "[one of " + "; ".join(f"{n}: {PROPOSERS[n].summary}" for n in allowed) + "]"
    assert said in " ".join(capsys.readouterr().out.split())
    assert set(allowed) == set(PROPOSERS)


@pytest.mark.slow
def test_shell_completion_for_python_m_runner() -> None:
    import shutil
    import subprocess

    if shutil.which("bash") is None:
        pytest.skip("no bash on this machine")
    script = (f'PATH="{Path(sys.executable).parent}:$PATH"; cd "{ROOT}"; eval "$(python -m runner -sc install=bash)"\n'
              'COMP_LINE="python -m runner sharding=row"; COMP_POINT=${#COMP_LINE}; COMP_CWORD=3\n'
              'hydra_bash_completion; echo "${COMPREPLY[@]}"\n')
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["sharding=rowwise"], out.stdout + out.stderr


def test_a_resolved_config_is_typed_at_load_and_a_wrong_type_is_one_line(tmp_path: Path, capsys) -> None:
    """Agents and workers load ``resolved.yaml`` through the schema: typed, read-only nodes, and a wrong-typed value
    (a file edited by hand, or written by another version) fails at load naming the key, in the torchrun entry
    too."""
    from conftest import cfg_for
    from omegaconf import OmegaConf

    from runner.config.schema import ShardingSchema, load_resolved
    from runner.launch import torchrun

    path = tmp_path / "resolved.yaml"
    OmegaConf.save(cfg_for("mode=plan"), path, resolve=True)
    cfg = load_resolved(path)
    assert OmegaConf.get_type(cfg.sharding) is ShardingSchema and cfg.train.steps == 200
    from omegaconf.errors import ReadonlyConfigError

    with pytest.raises(ReadonlyConfigError):
        cfg.train.steps = 300  # read-only while it runs
    with pytest.raises(ValueError):
        OmegaConf.merge(cfg, {"train": {"steps": "many"}})  # typed, as Hydra's config is
    path.write_text(path.read_text().replace("steps: 200", "steps: many"))
    with pytest.raises(ConfigError, match=r"^train.steps='many' is not allowed; expected an integer \(in "):
        load_resolved(path)
    assert torchrun.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: train.steps='many' is not allowed; expected an integer"), err
    path.write_text("model: [")
    with pytest.raises(ConfigError, match="expected a config file the runner wrote"):
        load_resolved(path)


@pytest.mark.parametrize("key, value", [("model.tables", "[{name:user.age,num_embeddings:1000}]"),
                                        ("model.tables", "[{name:'../../../x',num_embeddings:1000}]"),
                                        ("model.tasks", "['label/click']")])
def test_a_name_that_cannot_go_everywhere_is_refused_before_launch(key: str, value: str) -> None:
    """A table or task name becomes a TorchRec module key (no '.'), an MLflow key and a file name (no '/'): refused
    in one line naming the key, the value and the allowed form, before any process starts."""
    with pytest.raises(ConfigError) as err:
        cfg_for(f"{key}={value}")
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{key}[0]") and "letters, digits, '_' and '-'" in line


def test_names_of_letters_digits_underscores_and_dashes_are_accepted() -> None:
    cfg = cfg_for("model.tables=[{name:user_age,num_embeddings:1000},{name:item-id,num_embeddings:50}]")
    assert [t.name for t in cfg.model.tables] == ["user_age", "item-id"]


def test_a_syntax_error_in_a_config_file_the_command_names_is_one_line(tmp_path: Path) -> None:
    """A YAML error in the user's experiment (``--config-dir``) and a JSON error in a pinned plan: one line naming
    the file, line and column, exit 2, no traceback, before anything starts (no run folder, no store)."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "broken.yaml").write_text("# @package _global_\ntrain:\n  steps: [1, 2\n\n")
    (tmp_path / "experiment" / "unused.yaml").write_text("a: [")  # not named: not Hydra's to read, not ours
    plan = tmp_path / "plan.json"
    plan.write_text('{"model": {')
    store = f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"
    for args, says in ((["--config-dir", str(tmp_path), "experiment=broken"],
                        f"error: {tmp_path / 'experiment' / 'broken.yaml'}: YAML syntax error at line 5, column 1: "
                        "expected ',' or ']', but got '<stream end>' (while parsing a flow sequence begun at "
                        "line 3, column 10); fix the file"),
                       ([f"sharding.plan={plan}"], f"error: sharding.plan={plan}: JSON syntax error at line 1, "
                                                   "column 12: Expecting property name enclosed in double quotes")):
        proc = run_cli([*args, store, f"hydra.run.dir={tmp_path / 'run'}"], timeout=120)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines()[0].startswith(says), proc.stderr[-2000:]
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "mlflow.db").exists()
