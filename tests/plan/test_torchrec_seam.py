"""The planner's seam over TorchRec's private names: every listed name exists on the installed TorchRec; on
another TorchRec version the runner plans with TorchRec's stock planner, gives TorchRec's plan, and says so."""

from __future__ import annotations

import pytest
import torch
import torchrec
from conftest import cfg_for

from runner.plan.planner import EmbeddingShardingPlanner, build_planner, make_plan, torchrec_planner
from runner.plan.sharders import sharders_for
from runner.plan.speedups import torchrec_seam
from runner.plan.speedups.planning_loop import SearchLoopPlanner
from runner.train.models import build_model


def test_every_private_name_the_planner_uses_is_on_the_installed_torchrec() -> None:
    assert torchrec.__version__ == torchrec_seam.TESTED_WITH, "the pin and the seam's tested version disagree"
    assert torchrec_seam.missing() == []
    assert torchrec_seam.seam_note() is None


def test_another_torchrec_plans_with_its_stock_planner_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = cfg_for("mode=plan", "cluster=gpu_2x8", "sharding.proposer=greedy")
    assert type(build_planner(cfg, 16, 8, "cuda")) is SearchLoopPlanner
    monkeypatch.setattr(torchrec, "__version__", "9.9.0")
    torchrec_seam.seam_note.cache_clear()
    try:
        planner = build_planner(cfg, 16, 8, "cuda")
        assert type(planner) is EmbeddingShardingPlanner  # TorchRec's own, nothing of the runner's loop
        model = build_model(cfg, torch.device("meta"))
        notes: list = []
        plan, *_ = make_plan(cfg, model, 16, 8, "cuda", notes=notes)
        again = build_model(cfg, torch.device("meta"))
        stock = torchrec_planner(cfg, 16, 8, "cuda").plan(again, sharders_for(cfg.precision))
        assert str(plan) == str(stock)
        (line,) = [n for n in notes if "torchrec 9.9.0" in n]
        assert "stock planner" in line and f"torchrec=={torchrec_seam.TESTED_WITH}" in line
    finally:
        monkeypatch.undo()
        torchrec_seam.seam_note.cache_clear()
    assert torchrec_seam.seam_note() is None


# Private names of other libraries the runner uses, with their owner (not TorchRec's: not in the seam's list).
OTHER_PRIVATE = {
    "_amp_foreach_non_finite_check_and_unscale_": "torch (GradScaler's kernel)", "_deepcopy_dispatch": "copy",
    "_abort_process_group": "torch.distributed (NCCL's abort)",
    "_exit": "os", "_internal": "hydra (its core plugins' module path)", "_monitor_workers": "torch elastic",
    "_terminate_process_handler": "torch elastic", "_replace": "NamedTuple", "_run_exitfuncs": "atexit",
    "_shutdown": "threading", "_target_": "Hydra's instantiation key", "_to_mlflow_entity": "mlflow's datasets",
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
    assert not unlisted, f"private names used but not listed in runner/plan/speedups/torchrec_seam.py: {unlisted}"
    assert {"_enumerator", "_estimators", "_uniform_partition"} <= set(used) & listed  # the scan does find them
