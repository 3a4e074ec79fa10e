"""The planner's seam over TorchRec's private names: every listed name exists on the installed TorchRec; on
another TorchRec version the runner plans with TorchRec's stock planner, gives TorchRec's plan, and says so."""

from __future__ import annotations

import pytest
import torch
import torchrec
from conftest import cfg_for

from runner.plan.planner import EmbeddingShardingPlanner, build_planner, make_plan, torchrec_planner
from runner.plan.sharders import sharders_for
from runner.plan.spec import plan_spec
from runner.plan.torchrec_adapter import torchrec_seam
from runner.plan.torchrec_adapter.planning_loop import SearchLoopPlanner
from runner.train.models import build_model


def test_every_private_name_the_planner_uses_is_on_the_installed_torchrec() -> None:
    assert torchrec.__version__ == torchrec_seam.TESTED_WITH, "the pin and the seam's tested version disagree"
    assert torchrec_seam.missing() == []
    assert torchrec_seam.seam_note() is None


def _remember(tmp_path, monkeypatch: pytest.MonkeyPatch, passed: bool, reason: str) -> None:
    """A TorchRec of another version whose conformance verdict is already remembered (in a cache of the test's)."""
    import json

    from runner.plan.torchrec_adapter import conformance

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    conformance.cache_folder().mkdir(parents=True)
    (conformance.cache_folder() / f"{conformance.stack_key()}.json").write_text(
        json.dumps({"passed": passed, "reason": reason}))
    monkeypatch.setattr(torchrec, "__version__", "9.9.0")
    torchrec_seam.forget()


def test_a_torchrec_failing_the_conformance_check_plans_with_its_stock_planner_and_says_why(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = cfg_for("mode=plan", "cluster=gpu_2x8", "sharding.proposer=greedy")
    assert type(build_planner(plan_spec(cfg), 16, 8, "cuda")) is SearchLoopPlanner
    reason = "conformance check failed: the greedy proposer's plan differs from TorchRec's own"
    _remember(tmp_path, monkeypatch, False, reason)
    try:
        planner = build_planner(plan_spec(cfg), 16, 8, "cuda")
        assert type(planner) is EmbeddingShardingPlanner  # TorchRec's own, nothing of the runner's loop
        model = build_model(cfg, torch.device("meta"))
        notes: list = []
        plan, *_ = make_plan(plan_spec(cfg), model, 16, 8, "cuda", notes=notes)
        again = build_model(cfg, torch.device("meta"))
        stock = torchrec_planner(plan_spec(cfg), 16, 8, "cuda").plan(again, sharders_for(cfg.precision))
        assert str(plan) == str(stock)
        (line,) = [n for n in notes if "torchrec 9.9.0" in n]
        assert reason in line and line.endswith("planned with TorchRec's stock planner and proposers, without the "
                                                "runner's search")
    finally:
        monkeypatch.undo()
        torchrec_seam.forget()
    assert torchrec_seam.seam_note() is None


def test_a_torchrec_passing_the_conformance_check_keeps_the_runners_planner(tmp_path, monkeypatch) -> None:
    cfg = cfg_for("mode=plan", "cluster=gpu_2x8", "sharding.proposer=greedy")
    _remember(tmp_path, monkeypatch, True, "conformance check passed: (the built-in problem)")
    try:
        assert type(build_planner(plan_spec(cfg), 16, 8, "cuda")) is SearchLoopPlanner
        notes: list = []
        make_plan(plan_spec(cfg), build_model(cfg, torch.device("meta")), 16, 8, "cuda", notes=notes)
        (line,) = [n for n in notes if "torchrec 9.9.0" in n]
        assert "conformance check passed" in line and line.endswith("planned with the runner's planner")
    finally:
        monkeypatch.undo()
        torchrec_seam.forget()


def test_the_conformance_check_finds_a_torchrec_proposer_that_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the pinned TorchRec the check passes; a TorchRec whose dynamic-programming proposer proposes otherwise
    (only its last proposal kept, as a changed release might) fails it, naming the proposer."""
    from torchrec.distributed.planner.proposers import DynamicProgrammingProposer

    from runner.launch import conformance_check as conformance

    assert conformance.failures(("dynamic_programming",)) == []
    feedback = DynamicProgrammingProposer.feedback

    def changed(self, *args, **kwargs):
        feedback(self, *args, **kwargs)
        self._proposal_list = self._proposal_list[-1:]
    monkeypatch.setattr(DynamicProgrammingProposer, "feedback", changed)
    assert conformance.failures(("dynamic_programming",)) == [
        "the dynamic_programming proposer's plan differs from TorchRec's own"]


def test_no_module_path_that_only_some_supported_releases_have_outside_its_function() -> None:
    """FBGEMM's and TorchRec's module paths that moved between supported releases are imported only in
    ``runtime/moved_names.py``, and its functions find the names on the installed stack."""
    import re
    from pathlib import Path

    from runner.runtime import moved_names as moved

    root = Path(torchrec_seam.__file__).resolve().parents[3] / "runner"
    found = {}
    for path in root.rglob("*.py"):
        if path.name == "moved_names.py":
            continue
        for module in re.findall(r"(?:from|import)\s+((?:fbgemm_gpu|torchrec)[\w.]*)", path.read_text()):
            if module in moved.VERSIONED or any(module in places for places in moved.PLACES.values()):
                found.setdefault(str(path), []).append(module)
    assert not found, found
    assert moved.weight_decay_mode().DECOUPLE is not None and moved.cache_algorithm().LRU is not None
    assert moved.multipass_prefetch_config()._fields


# Private names of other libraries the runner uses, with their owner (not TorchRec's: not in the seam's list).
OTHER_PRIVATE = {
    "_amp_foreach_non_finite_check_and_unscale_": "torch (GradScaler's kernel)", "_deepcopy_dispatch": "copy",
    "_abort_process_group": "torch.distributed (NCCL's abort)",
    "_exit": "os", "_internal": "hydra (its core plugins' module path)", "_monitor_workers": "torch elastic",
    "_terminate_process_handler": "torch elastic", "_replace": "NamedTuple", "_run_exitfuncs": "atexit",
    "_shutdown": "threading", "_target_": "Hydra's instantiation key", "_to_mlflow_entity": "mlflow's datasets",
    "_core": "Hydra's joblib launcher (the arguments it gives joblib)", "_executor": "joblib's loky pool",
    "_optimizer_classes": "torch's apply_optimizer_in_backward (what it records on a parameter)",
    "_optimizer_kwargs": "torch's apply_optimizer_in_backward",
    "_contains": "optuna's distributions (whether a value is inside the range)",
    "_trial_id": "optuna's FrozenTrial (its storage id, to tell an interrupted trial again)",
}


def _lhs(line: str) -> str:
    """What a line assigns to (the text before its first ``=`` that is not a comparison), or ''."""
    for i, ch in enumerate(line):
        if ch == "=" and line[i - 1:i] not in ("=", "!", "<", ">") and line[i + 1:i + 2] != "=":
            return line[:i]
    return ""


def test_every_private_name_used_anywhere_in_the_runner_is_listed() -> None:
    """A scan of runner/ (training included): each ``._name`` read and each ``getattr(x, "_name")`` that the runner
    does not define itself is TorchRec's and listed in the seam, or another library's named here. A new use of a
    TorchRec private name without listing it fails here."""
    import re
    from pathlib import Path

    root = Path(torchrec_seam.__file__).resolve().parents[3] / "runner"
    used: dict = {}
    defined = set()
    for path in root.rglob("*.py"):
        text = path.read_text()
        defined |= set(re.findall(r"^\s*(?:def|class)\s+(_\w+)", text, re.M))
        defined |= set(re.findall(r"^(_\w+)\s*(?::[^=\n]*)?=", text, re.M))
        for line in text.splitlines():
            defined |= {f"_{n}" for n in re.findall(r"\b(?:self|cls)\._(\w+)", _lhs(line))}
            defined |= set(re.findall(r"^\s+(_[A-Za-z]\w*)\s*(?::[^=\n]*)?=", line))  # class attributes
        for name in re.findall(r"\.(_[A-Za-z]\w*)", text) + re.findall(r"getattr\([^,]+,\s*\"(_[A-Za-z]\w*)\"", text):
            if not name.startswith("__"):
                used.setdefault(name, set()).add(str(path.relative_to(root.parent)))
    listed = {n for names in torchrec_seam.ATTRIBUTES.values() for n in names}
    listed |= {n for names in torchrec_seam.MODULE_NAMES.values() for n in names} | set(torchrec_seam.PYTHON_PRIVATE)
    unlisted = {n: sorted(files) for n, files in used.items() if n not in defined | listed | set(OTHER_PRIVATE)}
    assert not unlisted, f"private names used but not listed in the seam (torchrec_seam.py): {unlisted}"
    assert {"_enumerator", "_estimators", "_uniform_partition"} <= set(used) & listed  # the scan does find them


_WITHOUT = """
import sys
{remove}
sys.argv = ["runner", *sys.argv[1:]]
from runner.cli import main
try:
    main()
finally:
    loaded = sorted(m for m in sys.modules
                    if m.startswith("runner.plan.torchrec_adapter.")
                    and not m.endswith((".torchrec_seam", ".conformance")))
    print("adapter modules loaded:", loaded or "none", flush=True)
"""
# an attribute TorchRec's class no longer sets (its __init__ keeps it under another name, as a renaming release
# would); the adapter modules, which import TorchRec's private functions, are not imported at all
_GONE = {
    "torchrec.distributed.batched_embedding_kernel.EmbeddingFusedOptimizer._emb_module":
        "from torchrec.distributed.batched_embedding_kernel import EmbeddingFusedOptimizer as E\n"
        "init = E.__init__\n"
        "def renamed(self, *a, **k):\n    init(self, *a, **k)\n    self.emb = self.__dict__.pop('_emb_module')\n"
        "E.__init__ = renamed",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(_GONE))
def test_a_torchrec_without_a_listed_name_plans_with_its_stock_planner(tmp_path, store, name) -> None:
    """A subprocess whose TorchRec lacks one listed name: the plan-only job succeeds with TorchRec's stock planner,
    its report, its run and its output say so in the one note line, and no module of the adapter but the version
    check was imported."""
    import subprocess
    import sys

    from conftest import ROOT, runs

    experiment = f"stock-{name.rsplit('.', 1)[1]}"
    proc = subprocess.run([sys.executable, "-c", _WITHOUT.format(remove=_GONE[name]), "mode=plan",
                           "sharding.proposer=greedy", f"tracking.uri={store}", f"tracking.experiment={experiment}",
                           f"hydra.run.dir={tmp_path}"], cwd=ROOT, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "adapter modules loaded: none" in proc.stdout
    note = f"lacks 1 name(s) the runner's planner relies on ({name}): planned with TorchRec's stock planner"
    assert note in (tmp_path / "plan" / "report.md").read_text() and note in proc.stdout
    (run,) = runs(store, experiment)
    assert run.info.status == "FINISHED" and run.data.tags["runner.plan_source"] == "torchrec"
    assert run.data.tags["runner.planner"] == "stock"
    assert note in run.data.tags["runner.plan_note"]
    assert "plan done: no plan fits" not in proc.stdout


def test_only_the_adapter_reaches_into_torchrec_and_only_after_the_version_check() -> None:
    """Outside ``runner/plan/torchrec_adapter/`` no listed planner name is used and no module imports the adapter at
    module level (but its version check, which imports nothing of TorchRec's); training's two listed names are
    DMP's and the fused optimizer's, not the planner's."""
    import re
    from pathlib import Path

    root = Path(torchrec_seam.__file__).resolve().parents[3] / "runner"
    adapter = root / "plan" / "torchrec_adapter"
    training = {"_dmp_wrapped_module", "_emb_module"}
    listed = {n for names in torchrec_seam.ATTRIBUTES.values() for n in names} - training
    listed |= {n for names in torchrec_seam.MODULE_NAMES.values() for n in names}
    outside: dict = {}
    for path in root.rglob("*.py"):
        if adapter in path.parents:
            continue
        text = path.read_text()
        for line in text.splitlines():
            if line.startswith(("from runner.plan.torchrec_adapter", "import runner.plan.torchrec_adapter")) \
                    and not any(m in line for m in ("torchrec_seam", "conformance")):
                outside.setdefault(str(path), []).append(line)
        for name in listed:
            if re.search(rf"[.\"]{name}\b", text):
                outside.setdefault(str(path), []).append(name)
    assert not outside, outside
    seam = (adapter / "torchrec_seam.py").read_text()
    assert not re.search(r"^(from|import) torchrec", seam, re.M)


def test_outside_plan_nothing_asks_the_version_gate_or_imports_the_adapter() -> None:
    """The gate is asked, and the adapter reached, only through ``runner/plan/`` (``plan/planner.py``'s
    ``runners_planner``, ``reusable_model``, ``plan_entries``): outside it, no import of an adapter module at any
    level, but the moved names (any stage may need them) and the conformance check itself."""
    import re
    from pathlib import Path

    root = Path(torchrec_seam.__file__).resolve().parents[3] / "runner"
    found = {}
    for path in root.rglob("*.py"):
        if (root / "plan") in path.parents or path.name == "conformance_check.py":
            continue
        text = path.read_text()
        hits = [m for m in re.findall(r"(?:from|import)\s+runner\.plan\.torchrec_adapter(?:\.(\w+)|\s+import\s+(\w+))",
                                      text) if "moved" not in m]
        hits += re.findall(r"\bseam_note\(", text)
        if hits:
            found[str(path.relative_to(root))] = hits
    assert not found, found
