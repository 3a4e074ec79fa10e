"""The package's layout: imports run one way down the stages, no circle, one concept per module.

Every import is counted, at module level or inside a function (a deferred import is still a
dependency). Stages and what each may import:

    cli -> launch -> train -> (plan, data, track) -> runtime -> config     (plan, data and track: none imports another)
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "runner"

ALLOWED: Dict[str, Set[str]] = {
    "config": set(),
    "runtime": {"config"},
    "track": {"config", "runtime"},
    "data": {"config", "runtime"},
    "plan": {"config", "runtime"},
    "train": {"config", "runtime", "track", "data", "plan"},
    "launch": {"config", "runtime", "track", "data", "plan", "train"},
    "cli": {"config", "runtime", "track", "data", "plan", "train", "launch"},
}
# A module holds one concept, however long (STYLE.md): past EXPLAIN_OVER lines its docstring says why it is one,
# in a paragraph that starts with ONE_CONCEPT.
EXPLAIN_OVER = 400
ONE_CONCEPT = "One concept:"
# Module names that are a sibling's plus a suffix, not yet merged into one module (or named each for its own
# concept), as (name, name + suffix), wherever their folder is; a pair is removed once it is (none is left now).
SUFFIX_SIBLINGS_LEFT: Set[Tuple[str, str]] = set()


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _stage(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    return "cli" if parts[1] in ("cli", "__main__") else parts[1]


def _imports(path: Path, modules: Set[str], package: str = "") -> Set[str]:
    """Modules of the package that ``path`` imports (``from a import b`` counts ``a.b`` when it is a module)."""
    found = set()
    package = package or (_module(path) if path.name == "__init__.py" else _module(path).rsplit(".", 1)[0])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        found.update(n for n in names if n in modules)
    return found


def _graph() -> Dict[str, Set[str]]:
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    return {m: _imports(p, set(files)) - {m} for m, p in files.items()}


def test_stages_import_only_downwards() -> None:
    wrong = []
    for module, targets in _graph().items():
        stage = _stage(module)
        for target in targets:
            other = _stage(target)
            if other in (stage, "root"):
                continue
            if stage == "root" or other not in ALLOWED[stage]:
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports against the stage order:\n" + "\n".join(sorted(wrong))


def test_no_import_circle() -> None:
    graph = _graph()
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(node: str, path: list) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_import_walk_sees_deferred_imports(tmp_path: Path) -> None:
    """The walk finds imports inside functions too (a circle made of one would otherwise go unseen)."""
    (tmp_path / "a.py").write_text("def f():\n    from runner.runtime import run_files\n")
    found = _imports(tmp_path / "a.py", {"runner.config", "runner.runtime.run_files"}, "runner.x")
    assert found == {"runner.runtime.run_files"}


@pytest.mark.parametrize("stage", sorted(set(ALLOWED) - {"cli"}))
def test_every_stage_says_what_it_owns_and_imports_nothing_on_import(stage: str) -> None:
    init = PACKAGE / stage / "__init__.py"
    tree = ast.parse(init.read_text())
    doc = ast.get_docstring(tree)
    assert doc and len(doc) > 200, f"{init} needs a paragraph on what the stage owns and may import"
    light = {"__future__", "typing", "importlib"}  # the planner's door resolves its names when asked (plan/__init__)
    assert not [n for n in tree.body if isinstance(n, ast.Import) and {a.name for a in n.names} - light
                or isinstance(n, ast.ImportFrom) and n.module not in light], init


def test_a_long_module_says_why_it_is_one_concept() -> None:
    """A module over ``EXPLAIN_OVER`` lines says in its docstring why it is one concept, in a paragraph starting
    ``One concept:`` (``ONE_CONCEPT``), e.g. ``One concept: the typed config, every key with its unit, default and
    range``; a concept is never split into siblings to meet a count."""
    unexplained = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
                   if (n := len((text := p.read_text()).splitlines())) > EXPLAIN_OVER
                   and ONE_CONCEPT not in (ast.get_docstring(ast.parse(text)) or "")}
    assert not unexplained, f"over {EXPLAIN_OVER} lines, no '{ONE_CONCEPT} ...' in the docstring: {unexplained}"


def test_no_module_is_named_as_a_sibling_plus_a_suffix() -> None:
    """A module's name says its concept: in one package folder no module (or subpackage) is named as another plus a
    suffix (``schema.py`` and ``schema_model.py``); one concept is one module, two are named each for its own.
    ``SUFFIX_SIBLINGS_LEFT`` holds the pairs not yet merged."""
    pairs = {}
    for folder in {p.parent for p in PACKAGE.rglob("*.py")}:
        names = {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
        names |= {d.name for d in folder.iterdir() if (d / "__init__.py").is_file()}
        pairs.update({(a, b): str(folder.relative_to(PACKAGE)) for a in names for b in names if b.startswith(f"{a}_")})
    new = sorted(f"{folder}/: {a}, {b}" for (a, b), folder in pairs.items() if (a, b) not in SUFFIX_SIBLINGS_LEFT)
    assert not new, f"named as a sibling plus a suffix: {new}"


def test_the_driver_side_reads_dataset_lineage_without_loading_torch() -> None:
    """The driver describes the run's datasets while its workers import torch: it must not import torch
    itself (on a small host that doubles the start-up's CPU work)."""
    import subprocess
    import sys

    code = ("import sys, runner.launch.job.driver, runner.data.lineage, runner.track.inputs; "
            "print(sorted(m for m in ('torch', 'torchrec', 'fbgemm_gpu') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


def test_the_module_table_lists_every_module() -> None:
    """The module table (docs/modules.md) names each module of the package once, and nothing that is gone."""
    import re

    readme = (PACKAGE.parent / "docs" / "modules.md").read_text()
    listed = re.findall(r"^\| `([\w/.]+\.py)` \|", readme, flags=re.M)
    present = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    twice = sorted({m for m in listed if listed.count(m) > 1})
    assert not twice, f"listed twice: {twice}"
    assert set(listed) == present, (f"missing from docs/modules.md: {sorted(present - set(listed))}; "
                                    f"gone from the package: {sorted(set(listed) - present)}")


def test_the_suites_longest_files_exist() -> None:
    """conftest's LONGEST orders `make test`'s files; a renamed file must be renamed there too."""
    from conftest import LONGEST, ROOT

    assert [p for p in LONGEST if not (ROOT / "tests" / p).is_file()] == []


def _callers(name: str) -> Set[str]:
    """Modules of the package whose code uses a function named ``name`` (a call, or handing it on), imports
    aside."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and node.attr == name) or (isinstance(node, ast.Name)
                                                                            and node.id == name):
                found.add(_module(path))
    return found


def test_a_job_s_outcome_is_written_and_its_chart_drawn_in_one_place() -> None:
    """``status.json`` is written by one function (``runtime.run_files.write_status``), called from a job's outcome
    (``launch.job.outcome``), for a point that never ran, the Slurm launcher, and for a job whose driver was killed
    outright, ``runner sync`` (``track.sync``); the plan chart is drawn by
    ``launch.job.end`` only, which alone ends a job's run, on the driver's path and under a plain torchrun alike."""
    assert _callers("write_status") == {"runner.launch.job.outcome", "runner.launch.schedulers.slurm",
                                        "runner.track.sync"}
    # a job's run: ended by launch.job.end's end_job_run (driver, torchrun); store.end_run is what sync delivers for
    # a run kept while the store was away, a sweep's parent and its stopped points, and a requeued attempt's run
    assert _callers("end_job_run") == {"runner.launch.job.driver", "runner.launch.torchrun"}
    assert _callers("end_run") == {"runner.track.sync", "runner.launch.sweep.parent", "runner.track.mlflow_run"}
    assert _callers("draw_plan_chart") == {"runner.launch.job.end"}
    assert _callers("end_finished_run") == {"runner.launch.job.driver", "runner.launch.torchrun"}


SAME_ROLE = {"main": "a module's command-line entry", "build": "a proposer's builder, named by its declaration"}


def test_no_two_functions_of_the_package_share_a_name() -> None:
    """One name, one function: a public module-level function's name is used by no other module of the package,
    except the names in ``SAME_ROLE``, which every module defining one uses for the same role."""
    found: Dict[str, Set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                found.setdefault(node.name, set()).add(_module(path))
    shared = {name: sorted(modules) for name, modules in found.items() if len(modules) > 1 and name not in SAME_ROLE}
    assert not shared, shared


def _names_a_part(node: ast.AST, names: Set[str]) -> bool:
    """A decision on a part's name: a comparison or ``in`` test with one as a literal (or in a tuple, list or set
    of literals), a ``match`` case of one, or a dict keyed by one (a table of parts by name)."""
    def literal(n: ast.AST) -> bool:
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            return n.value in names
        return isinstance(n, (ast.Tuple, ast.List, ast.Set)) and any(literal(e) for e in n.elts)

    if isinstance(node, ast.Compare):
        return any(literal(side) for side in (node.left, *node.comparators))
    if isinstance(node, ast.Dict):
        return any(k is not None and literal(k) for k in node.keys)
    return isinstance(node, ast.MatchValue) and literal(node.value)


def test_no_module_but_a_part_s_declaration_tests_its_name() -> None:
    """Each kind of part is declared once (docs/architecture.md, *Adding ...*): no module but its declaration
    compares its names, lists them or keys a table by them; everything else reads the declaration's fields
    (schedulers: tests/launch/test_schedulers.py)."""
    from runner.config import data_sources, model_families, modes, optimizer_kinds, precisions, proposers, sweepers

    kinds = {
        model_families: set(model_families.FAMILIES),
        optimizer_kinds: {*optimizer_kinds.SPARSE, *optimizer_kinds.DENSE, *optimizer_kinds.SCHEDULES},
        data_sources: set(data_sources.SOURCES),
        precisions: {*precisions.AUTOCASTS, *precisions.TABLE_DTYPES, *precisions.COMM_DTYPES},
        proposers: set(proposers.PROPOSERS),
        modes: set(modes.MODES),
        sweepers: {*sweepers.SWEEPERS, *sweepers.RUNNER_SWEEPERS},
    }
    keys_too = {modes: False}  # "train" and "calibrate" are config groups too: a dict keyed by one is a config's
    for names in kinds.values():
        assert names and _names_a_part(ast.parse(f"x == {sorted(names)[0]!r}").body[0].value, names)  # type: ignore[attr-defined]
    found = []
    for path in PACKAGE.rglob("*.py"):
        nodes = [n for n in ast.walk(ast.parse(path.read_text(), str(path)))
                 if isinstance(n, (ast.Compare, ast.Dict, ast.MatchValue))]
        found += [f"{path.relative_to(PACKAGE)}:{n.lineno}: {ast.unparse(n)[:80]}"
                  for declaration, names in kinds.items() if path != Path(str(declaration.__file__))
                  for n in nodes if _names_a_part(n, names) and (keys_too.get(declaration, True)
                                                                 or not isinstance(n, ast.Dict))]
    assert not found, found


# The functions that take the whole config (a parameter named ``cfg`` or annotated ``RunnerConfig``) outside
# config/: where a job (or a rank's part of it) is started and its parts are built from the typed config. Every
# other function takes the part it uses (a ``PlanSpec``, a ``JobData``, a scheduler) or the values it reads.
BUILDERS = {
    "runner.cli:_hydra_job", "runner.launch.job.hydra_call:run_job", "runner.launch.job.driver:execute_job",
    "runner.launch.job.driver:reuse_job", "runner.launch.job.driver:pre_launch_checks",
    "runner.launch.job.driver:drive_workers", "runner.launch.job.driver:drive_plan",
    "runner.launch.job.plan_only:plan_only", "runner.launch.job.run_record:driver_run", "runner.data.layout:job_data",
    "runner.data.writer:write_data", "runner.plan.spec:plan_spec", "runner.track.mlflow_run:torchrun_run",
    "runner.train.worker:run", "runner.train.worker:train_rank", "runner.train.trainer:__init__",
    "runner.train.models:build_model", "runner.train.models:planning_model",
    "runner.train.calibrate:run_calibration", "runner.train.calibrate:_dense",
    "runner.train.calibrate:_tiny_job",
}
MAX_CONFIG_READERS = 25


def test_the_whole_config_is_read_only_where_a_job_s_parts_are_built() -> None:
    """At most ``MAX_CONFIG_READERS`` functions take the whole config: config/'s own and the builders above."""
    found: Set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if any(a.arg == "cfg" or (a.annotation is not None and "RunnerConfig" in ast.unparse(a.annotation))
                       for a in args):
                    found.add(f"{_module(path)}:{node.name}")
    outside = sorted(f for f in found if not f.startswith("runner.config.") and f not in BUILDERS)
    assert not outside, f"these take the whole config; give them the part or the values they read: {outside}"
    assert len(found) <= MAX_CONFIG_READERS, sorted(found)


def test_no_two_modules_share_a_name() -> None:
    """A module's name says what it owns, once: no two modules of the package (``__init__`` aside) have one name."""
    names: Dict[str, Set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            names.setdefault(path.stem, set()).add(_module(path))
    assert not {n: sorted(m) for n, m in names.items() if len(m) > 1}


MAX_ANY_SHARE, MAX_TYPE_IGNORES = 0.10, 15


def test_types_say_what_they_hold() -> None:
    """At most ``MAX_ANY_SHARE`` of the package's functions have a parameter annotated ``Any`` (``*args`` and
    ``**kwargs`` counted), and at most ``MAX_TYPE_IGNORES`` ``type: ignore`` comments (mypy runs in ``make lint``)."""
    functions = with_any = ignores = 0
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        ignores += text.count("type: ignore")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions += 1
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p is not None)]
                with_any += any(p.annotation is not None and ast.unparse(p.annotation) == "Any" for p in params)
    assert with_any <= MAX_ANY_SHARE * functions, (with_any, functions)
    assert ignores <= MAX_TYPE_IGNORES, ignores


def test_outside_plan_only_the_planner_s_door_is_imported() -> None:
    """The planner is a library with one door (``runner/plan/__init__.py``): no module of the package outside
    ``runner/plan/`` imports one of its modules, at any level; each name taken from the door is one it lists, and
    every name it lists resolves."""
    import runner.plan as door

    wrong = []
    for path in PACKAGE.rglob("*.py"):
        if (PACKAGE / "plan") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                wrong += [f"{_module(path)}: import {a.name}" for a in node.names if a.name.startswith("runner.plan")]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("runner.plan"):
                if node.module != "runner.plan":
                    wrong.append(f"{_module(path)}: from {node.module}")
                wrong += [f"{_module(path)}: {a.name} is not the door's" for a in node.names
                          if node.module == "runner.plan" and a.name not in door.__all__]
    assert not wrong, "past the planner's door (runner/plan/__init__.py):\n" + "\n".join(sorted(wrong))
    import importlib
    import types

    for path in (PACKAGE / "plan").rglob("*.py"):  # a module named as a door's name would shadow it once imported
        importlib.import_module(_module(path))
    assert [n for n in door.__all__ if getattr(door, n, None) is None or isinstance(getattr(door, n), types.ModuleType)
            ] == []
