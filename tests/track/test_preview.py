"""``--dry-run``: each point of a sweep with its verdict and whether its config already ran in the experiment;
nothing is started or written (the store's bytes and the folder's files unchanged)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import runner.cli  # noqa: F401  (schema and resolvers)


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow  # MLflow and a dozen compositions: 14 s
def test_a_dry_run_previews_every_point_and_writes_nothing(tmp_path: Path, capsys) -> None:
    from hydra import compose
    from mlflow.tracking import MlflowClient
    from omegaconf import OmegaConf

    from runner.config import roles
    from runner.launch.sweep.precheck import hydra_conf
    from runner.launch.sweep.preview import preview
    from runner.plan.cost.choice import hashed

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = ["mode=plan", "model=dlrm", "cluster=local", "cluster.calibration=none", f"tracking.uri={store}",
              "tracking.experiment=preview"]
    with hydra_conf():  # an earlier FINISHED run of the point with reserve 0.2, tagged as jobs tag theirs
        cfg = compose(config_name="config", overrides=[*common, "sharding.storage_reserve_percent=0.2"])
    digest = roles.config_hash(hashed(cfg.cluster, cfg.mode, OmegaConf.to_container(cfg, resolve=True)))
    client = MlflowClient(store)
    # with its artifacts beside the store, as the runner makes an experiment (MLflow's own default for a SQLite store
    # is a "file:" path that it makes relative to the working directory)
    experiment = client.create_experiment("preview", artifact_location=(tmp_path / "mlartifacts").as_uri())
    run = client.create_run(experiment, tags={"runner.config_hash": digest})
    client.set_terminated(run.info.run_id, "FINISHED")
    client._tracking_client.store.engine.dispose()  # type: ignore[attr-defined]  (no handle left open)
    before, stray = _snapshot(tmp_path), Path("file:").exists()

    sweep = ["-m", *common, "sharding.storage_reserve_percent=0.1,0.2,1.5", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    assert preview(sweep) == 2
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4, lines
    assert lines[0].startswith("[dry-run] point 0: ") and lines[0].endswith("accepted; not run yet")
    assert lines[1].endswith(f"accepted; done before (run {run.info.run_id})"), lines[1]
    assert lines[2].endswith("refused: sharding.storage_reserve_percent=1.5 is not allowed; expected a fraction in "
                             "[0, 1)"), lines[2]
    assert lines[3].startswith("[dry-run] 3 point(s), 1 refused; launcher ") and "BasicSweeper" in lines[3]
    assert _snapshot(tmp_path) == before  # no sweep folder, the store's bytes as they were
    assert Path("file:").exists() == stray  # nor a folder MLflow makes for the read-only address, where the user is

    # a store that does not exist yet is not created
    assert preview(["-m", *common[:-2], f"tracking.uri=sqlite:///{tmp_path / 'new.db'}", "train.seed=1,2"]) == 0
    assert "not run yet (the store does not exist yet)" in capsys.readouterr().out
    assert not (tmp_path / "new.db").exists()
