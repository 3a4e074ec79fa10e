"""``python -m runner diff A B``: differing config keys, tables whose sharding differs, headline metrics."""

from __future__ import annotations

from pathlib import Path

from conftest import cfg_for
from omegaconf import OmegaConf


def planned_folder(folder: Path, *overrides: str) -> Path:
    """A run folder as a job writes it (resolved config, plan report), planned in-process for 2 CPU ranks."""
    from runner.plan.planner import make_plan
    from runner.plan.report import write_plan_report
    from runner.plan.spec import plan_spec
    from runner.train.models import build_model
    from runner.train.optimizers import apply_sparse_optimizer

    cfg = cfg_for(*overrides)
    folder.mkdir(parents=True)
    (folder / "resolved.yaml").write_text(OmegaConf.to_yaml(OmegaConf.to_container(cfg, resolve=True)))
    model = build_model(cfg, "meta")
    apply_sparse_optimizer(model, cfg.optimizer)
    plan, best, seconds, _ = make_plan(plan_spec(cfg), model, 2, 2, "cpu")
    write_plan_report(plan_spec(cfg), plan, best, 2, 2, "cpu", folder / "plan", seconds)
    return folder


def test_diff_names_config_keys_tables_and_metrics(tmp_path: Path, capsys) -> None:
    from runner.track.diff import diff

    a = planned_folder(tmp_path / "a", "sharding=rowwise", "optimizer=sgd_sgd")
    b = planned_folder(tmp_path / "b", "sharding=tablewise")
    assert diff([str(a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    print("\n".join(out))
    assert out[0] == f"A: {a}" and out[1] == f"B: {b}"
    keys = {ln.split(":")[0].strip() for ln in out[3:out.index(next(x for x in out if x.startswith("sharding:")))]}
    assert {"sharding.name", "optimizer.name", "optimizer.sparse", "optimizer.dense"} <= keys, keys
    assert "sharding: 6 of 6 table(s) differ:" in out
    t0 = next(ln for ln in out if ln.strip().startswith("t0:"))
    assert "row_wise fused ranks 0,1 | table_wise fused rank" in t0, t0
    assert any(ln.strip().startswith("estimated step ms") for ln in out)
    assert diff([str(a), "no-such-run"]) == 2
    assert "no-such-run is neither a run folder nor a run" in capsys.readouterr().err


def test_sweep_report_says_what_differs_from_the_first_point() -> None:
    from runner.launch.sweep.sweep_report import vs_first

    first = {"params": {"a": 1, "b": "x"}, "types": {"t0": "table_wise", "t1": "table_wise"}}
    other = {"params": {"a": 2, "b": "x"}, "types": {"t0": "row_wise", "t1": "table_wise"}}
    same = {"params": {"a": 1, "b": "x"}, "types": {}}
    assert vs_first(first, first, ["a", "b"]) == "(the first point)"
    assert vs_first(other, first, ["a", "b"]) == "a=2; 1 tables sharded another way"
    assert vs_first(same, first, ["a", "b"]) == "the same config"
