"""The scheduler seam and the job's place: schedulers found by name, nothing outside their package naming one, a
task's place carried by a new read-only config (the composed one unchanged), and read-only configs in workers."""

from __future__ import annotations

import ast
import re
import signal
from pathlib import Path
from typing import Set

import pytest
from conftest import ROOT, cfg_for

from runner.config.errors import ConfigError
from runner.config.place import Place, read_place
from runner.launch import schedulers


def test_schedulers_are_found_by_name_and_an_unknown_one_is_one_line() -> None:
    assert {"local", "slurm"} <= set(schedulers.registered())
    assert schedulers.named("auto").name == schedulers.named("none").name == "local"
    assert schedulers.named("slurm").static_rendezvous and not schedulers.named("local").static_rendezvous
    assert schedulers.of_command(["-m", "hydra/launcher=slurm"]).name == "slurm"
    assert schedulers.of_command(["-m", "hydra/launcher=joblib"]).name == "local"
    with pytest.raises(ConfigError) as refused:
        schedulers.named("kubernetes")
    allowed = str(refused.value).split("; expected ", 1)[1].split(", ")
    assert str(refused.value).startswith("cluster.scheduler='kubernetes' is not allowed")
    assert set(allowed) == {"auto", "none", *schedulers.registered()}  # every registered one, and no other


def test_a_slurm_scheduler_named_outside_slurm_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_NODEID", "SLURM_NNODES"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(Exception, match="cluster.scheduler=slurm but this process is not a task of a Slurm job"):
        schedulers.task_of("slurm")
    scheduler, task = schedulers.task_of(cfg_for().cluster.scheduler)
    assert scheduler.name == "local" and task is None


# Hydra's launchers by name (its own, its plugins'); a literal containing one of DISTINCT names it wherever it is
LAUNCHERS = {"basic", "joblib", "submitit_local", "submitit_slurm", "ray", "rq"}
DISTINCT = re.compile(r"slurm|joblib|submitit|hydra/launcher=\w", re.IGNORECASE)


def _names_one(node: ast.AST, names: Set[str]) -> bool:
    """Whether ``node`` is a string literal (or a tuple, list, set or f-string of them) naming a scheduler or a
    launcher: one of ``names`` as the whole literal, or a distinct name anywhere in it."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.lower() in names or DISTINCT.search(node.value) is not None
    if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.JoinedStr)):
        return any(_names_one(e, names) for e in (node.values if isinstance(node, ast.JoinedStr) else node.elts))
    return False


def _tests_a_name(node: ast.AST, names: Set[str]) -> bool:
    """A decision on a scheduler's or a launcher's name: a comparison or ``in`` test with such a literal on
    either side, ``startswith``/``endswith`` of one, a ``match`` case of one."""
    if isinstance(node, ast.Compare):
        return any(_names_one(side, names) for side in (node.left, *node.comparators))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
            "startswith", "endswith"):
        return any(_names_one(arg, names) for arg in node.args)
    return isinstance(node, ast.MatchValue) and _names_one(node.value, names)


def test_nothing_outside_the_schedulers_package_tests_a_scheduler_or_launcher_name() -> None:
    """No decision on a scheduler's or a launcher's name (``== "slurm"``, ``"joblib" in target``,
    ``name in ("local", "none")``, ``startswith("hydra/launcher=slurm")``, ...) outside ``launch/schedulers`` (and
    the Hydra plugins that are the runner's launchers): the registry answers (``Scheduler``'s fields). Messages and
    docstrings may name them."""
    names = {"none", *LAUNCHERS, *schedulers.registered(),
             *(s.launcher for s in schedulers.registered().values() if s.launcher)}
    runner = ROOT / "runner"
    allowed = {runner / "launch" / "schedulers", runner / "launch" / "plugins"}
    found = {}
    for path in runner.rglob("*.py"):
        if any(a in path.parents for a in allowed):
            continue
        hits = [f"{node.lineno}: {ast.unparse(node)}" for node in ast.walk(ast.parse(path.read_text(), str(path)))
                if _tests_a_name(node, names)]
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    assert not found, found


def test_a_scheduler_s_signals_environment_and_folders_are_its_own() -> None:
    """A scheduler's early signal (Slurm's SIGUSR2), its environment (``SLURM_*``) and its node folders
    (``node<k>``) appear in code only inside ``launch/schedulers``; the agents learn the signals from the registry."""
    runner = ROOT / "runner"
    found = {}
    for path in runner.rglob("*.py"):
        if runner / "launch" / "schedulers" in path.parents:
            continue
        hits = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr.startswith("SIGUSR"):
                hits.append(f"{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                    node.value.startswith("SLURM_") or node.value.startswith("node{")):
                hits.append(f"{node.lineno}: {node.value!r}")
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    assert not found, found
    assert signal.SIGUSR2 in schedulers.early_signals()  # Slurm's, from its scheduler


def test_the_guard_sees_each_way_of_testing_a_name() -> None:
    names = {"none", *LAUNCHERS, *schedulers.registered()}
    for code in ('x == "slurm"', '"joblib" in str(target)', 'name in ("local", "none")', 'x != "Slurm"',
                 'a.startswith("hydra/launcher=slurm")', '"SLURM_JOB_ID" in os.environ', 'x == f"{y}_submitit"'):
        assert any(_tests_a_name(n, names) for n in ast.walk(ast.parse(code))), code
    for code in ('x == "plan"', 'print("hydra/launcher=slurm submits each point")', 'a.startswith("hydra/launcher=")',
                 'Place("local")', 'x == "auto"'):
        assert not any(_tests_a_name(n, names) for n in ast.walk(ast.parse(code))), code


def test_a_task_s_place_is_a_new_read_only_config_and_the_composed_one_is_unchanged(tmp_path: Path) -> None:
    from omegaconf.errors import ReadonlyConfigError

    cfg = cfg_for("cluster=2node")
    place = Place("slurm", 1, "10.0.0.7", 29777, str(tmp_path / "checkpoints"), 3.5)
    ran = place.applied(cfg)
    assert (ran.cluster.scheduler, ran.cluster.node_rank, ran.cluster.master_addr, ran.cluster.master_port) == \
        ("slurm", 1, "10.0.0.7", 29777)
    assert ran.train.checkpoint.dir == str(tmp_path / "checkpoints")
    assert cfg.cluster.node_rank is None and cfg.cluster.scheduler == "auto"  # what the user composed, as composed
    with pytest.raises(ReadonlyConfigError):
        ran.cluster.node_rank = 0
    place.write(tmp_path)
    assert read_place(tmp_path) == place and read_place(tmp_path / "none") is None


def test_a_worker_s_config_is_read_only(tmp_path: Path) -> None:
    from omegaconf import OmegaConf
    from omegaconf.errors import ReadonlyConfigError

    from runner.config.schema import load_resolved

    (tmp_path / "resolved.yaml").write_text(OmegaConf.to_yaml(cfg_for()))
    cfg = load_resolved(tmp_path / "resolved.yaml")
    with pytest.raises(ReadonlyConfigError):
        cfg.cluster.ddr_cap_gib = 1.0
    assert OmegaConf.merge(cfg, {"cluster": {"ddr_cap_gib": 1.0}}).cluster.ddr_cap_gib == 1.0  # a new config may
