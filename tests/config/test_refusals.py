"""Bad input refused before anything starts, checked in-process: the pre-check (every override composed and
validated, each value of a sweep too) and the driver's checks before launch (devices, data files,
checkpoints). Each gives one line that names the key and what is allowed, with no exception class name.
tests/faults/test_bad_input.py runs one case per stage as the user does (exit code, no process left, the
MLflow run FAILED) and the cases only a real job reaches."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import FAST, cfg_for

import runner.cli  # noqa: F401  (schema and resolvers)
from runner.config.errors import one_line
from runner.data.criteo import criteo_lines
from runner.data.layout import job_data
from runner.launch.job.driver import pre_launch_checks
from runner.launch.sweep.precheck import hydra_conf, precheck

CRITEO = ["data=criteo", "model=dlrm_criteo", "train.steps=20", "data.eval_batches=1"]

# (arguments, what the line must say)
PRECHECK = [
    (["sharding.storage_reserve_percent=1.5"], "[0, 1)"),
    (["cluster=3node"], "2node, gpu_1x8"),
    (["cluster.intra_node_bandwidth=-1"], "cluster.intra_node_bandwidth"),
    (["train.steps=abc"], "expected an integer"),
    (["sharding.types=[diagonal]"], "row_wise"),
    (["train.no_such_key=1"], "train.no_such_key"),
    (["+train.stepz=4"], "train.stepz: no such key (added with +train.stepz); did you mean train.steps"),
    (["trian.steps=4"], "trian: no such key (given on the command line); did you mean train?"),
    (["cluster.calibration=/nonexistent/x.calibration.yaml"], "cluster.calibration='/nonexistent/x.calibration.yaml'"
                                                             " cannot be used: it cannot be read"),
    (["experiment=nope"], "experiment='nope' is not an option"),
    (["sharding.constraints.t0.sharding_types=[row_wise]"], "+sharding.constraints.t0.sharding_types"),
    (["+sharding.constraints.t99.sharding_types=[row_wise]"], "sharding.constraints.t99"),
    (["train.grad_accumulation_steps=0"], "train.grad_accumulation_steps"),
    (["train.pipeline=async"], "train.pipeline"),
    (["precision.autocast=float8"], "precision.autocast"),
    (["data.name=csv"], "data.name"),
    (["cluster.start_method=forkserver"], "cluster.start_method"),
    (["model=mmoe", "model.tasks=[a,a]"], "model.tasks"),
    (["cluster.workers_per_node=0"], "cluster.workers_per_node"),
    (["-m", "sharding.storage_reserve_percent=0.1,2.0"], "sweep point"),
    (["-m", "sharding.storage_reserve_percent=range(0.5,1.5,0.5)"], "sweep point"),
    (["-m", "sharding=choice(rowwise,diagonal)"], "sharding='diagonal' is not an option"),
    (["-m", "hydra/sweeper=optuna", "sharding.storage_reserve_percent=interval(0.5,1.5)"],
     "sharding.storage_reserve_percent=1.5 is not allowed"),
    (["tracking.experiment=ctr études 2026"], """'tracking.experiment="ctr études 2026"'"""),
    (["hydra.run.dir=/proc/x/run"], "hydra.run.dir=/proc/x/run cannot be created"),
    (["-m", "hydra.sweep.dir=/proc/x/sweep", "train.seed=1,2"], "hydra.sweep.dir=/proc/x/sweep cannot be created"),
]
# {d}: a folder of broken data files
BEFORE_LAUNCH = [
    pytest.param(["optimizer.sparse=adam"], "rowwise_adagrad"),
    pytest.param(["cluster.device=cuda"], "cuda"),
    pytest.param(["precision.tf32=true"], "precision.tf32"),
    (["data=parquet", "data.path={d}/none"], "none found"),
    (["data=parquet", "data.path={d}/x.parquet"], "is not a Parquet file"),
    ([*CRITEO, "data.path={d}/empty.tsv"], "empty"),
    ([*CRITEO, "data.path={d}/short.tsv"], "line 1 has 3 fields"),
    (["data=parquet"], "data.path"),
    (["train.resume=/nonexistent/ckpt"], "no such file or folder"),
    (["train.resume=latest", "train.checkpoint.dir={d}"], "no complete checkpoint"),
    (["data.num_dense_features=1000000000"], "data.num_dense_features=1000000000 is not allowed; expected fewer: one "
                                             "batch's dense features (128 rows x 1000000000 float32 values)"),
]
CLASS_NAME = re.compile(r"\b[A-Z][a-z]+[A-Za-z]*(Error|Exception|Invalid)\b")


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("broken")
    (d / "x.parquet").write_text("not parquet\n")
    (d / "empty.tsv").write_text("")
    (d / "short.tsv").write_text("1\t2\t3\n" + criteo_lines(10))
    return d


def _is_one_clean_line(line: str, says: str) -> None:
    assert says in line and "\n" not in line and "Traceback" not in line, line
    assert not CLASS_NAME.search(line), line


@pytest.mark.parametrize("args,says", PRECHECK, ids=[" ".join(a)[:60] for a, _ in PRECHECK])
def test_refused_by_the_precheck(args: list, says: str) -> None:
    error, _ = precheck([*args, *FAST])
    assert error is not None
    _is_one_clean_line(error, says)


@pytest.mark.parametrize("args,says", BEFORE_LAUNCH)
def test_refused_before_launch(args: list, says: str, broken: Path, tmp_path: Path) -> None:
    overrides = [a.format(d=broken) for a in args]
    assert precheck([*overrides, *FAST])[0] is None  # valid config: refused by what the machine or files say
    cfg = cfg_for(*overrides, *FAST)
    with pytest.raises(Exception) as e:
        pre_launch_checks(cfg, job_data(cfg), tmp_path)
    _is_one_clean_line(one_line(e.value), says)


def test_sweep_points_derived_from_the_first_are_hydras_compositions() -> None:
    """The pre-check composes a sweep's first point and derives the others where only values change: each
    derived config is the one Hydra composes for that point; group choices, additions and dict values are
    composed in full."""
    from hydra import compose
    from omegaconf import OmegaConf

    from runner.launch.sweep.precheck import _from_first, hydra_conf

    first = ["experiment=plan_many_tables", "cluster.cross_node_bandwidth=0.5", "sharding.storage_reserve_percent=0.05",
             "train.seed=1", "+sharding.constraints.g001.sharding_types=[row_wise]"]
    points = [[*first[:1], "cluster.cross_node_bandwidth=12.5", "sharding.storage_reserve_percent=0.3", *first[3:]],
              [*first[:2], "sharding.storage_reserve_percent=0.45", "train.seed=7", first[4]]]
    with hydra_conf() as loader:
        base = (first, compose(config_name="config", overrides=first))
        for point in points:
            derived = _from_first(base, point, loader)
            assert derived is not None, point
            assert OmegaConf.to_container(derived) == OmegaConf.to_container(compose(config_name="config",
                                                                                     overrides=point)), point
        for composed_in_full in (["experiment=plan_many_tables", "cluster=gpu_4x8", *first[2:]],  # a group
                                 [*first[:4], "+sharding.constraints.g001.sharding_types=[table_wise]"],  # an add
                                 [*first[:2], "sharding.storage_reserve_percent=abc", *first[3:]]):  # refused
            assert _from_first(base, composed_in_full, loader) is None, composed_in_full


def test_the_runner_names_its_own_sweepers() -> None:
    """The pre-check composes and validates every point of a grid sweep, then names the grid sweeper that
    does not compose them once more; ``hydra/sweeper=optuna`` is the runner's Optuna sweeper itself."""
    from runner.config.sweepers import CHECKED_SWEEPER, OPTUNA_SWEEPER

    assert precheck(["-m", "mode=plan", "train.seed=1,2"]) == (None, [f"hydra.sweeper._target_={CHECKED_SWEEPER}"])
    assert precheck(["-m", "experiment=optuna_plan"]) == (None, [])
    with hydra_conf():
        from hydra import compose

        cfg = compose(config_name="config", overrides=["experiment=optuna_plan"], return_hydra_config=True)
    assert cfg.hydra.sweeper._target_ == OPTUNA_SWEEPER
    # a multi-objective study: one direction per metric a job returns, each the way its metric is better
    more = ["tracking.objective.more_metrics=[plan/max_mem_bytes]"]
    error, _ = precheck(["-m", "experiment=optuna_plan", *more])
    assert error == ("hydra.sweeper.direction=minimize asks for 1 value(s) but each job returns 2: plan/est_step_ms "
                     "(min), plan/max_mem_bytes (min) (tracking.objective.metric and more_metrics)"), error
    both = "hydra.sweeper.direction=[minimize,minimize]"
    assert precheck(["-m", "experiment=optuna_plan", *more, both]) == (None, [])
    error, _ = precheck(["-m", "experiment=optuna_plan", "hydra.sweeper.direction=[minimize,maximize]",
                         "tracking.objective.more_metrics=[eval/auc]"])
    assert error is None, error
    error, _ = precheck(["-m", "experiment=optuna_plan", "hydra.sweeper.direction=[minimize,minimize]",
                         "tracking.objective.more_metrics=[eval/auc]"])
    assert error is not None and error.endswith("set hydra.sweeper.direction=[minimize,maximize]"), error
    for wrong in (["hydra.sweeper.direction=''"], [*more, "hydra.sweeper.direction=[minimize,'']"]):  # empty: named
        error, _ = precheck(["-m", "experiment=optuna_plan", *wrong])
        assert error == "hydra.sweeper.direction='' is not allowed; expected minimize or maximize (or a list of them)"
