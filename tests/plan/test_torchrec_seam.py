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
