"""One definition of "the same config" (runner.config.roles): every schema key classified; resume, the
``runner.config_hash`` tag (``sweep.reuse``) and plan-only enumeration reuse read it and agree."""

from __future__ import annotations

from pathlib import Path

from conftest import cfg_for
from omegaconf import OmegaConf

from runner.config import roles
from runner.config.keydocs import key_docs
from runner.config.schema import RunnerConfig

KEYS = [key for key, _, _ in key_docs(RunnerConfig)]


def test_every_schema_key_is_classified_by_an_entry_of_the_table() -> None:
    def entry(key: str) -> str | None:
        parts = key.split(".")
        return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in roles.ROLES),
                    None)

    unclassified = [k for k in KEYS if entry(k) is None]
    assert not unclassified, f"schema keys with no role in runner.config.roles.ROLES: {unclassified}"
    stale = [e for e in roles.ROLES if not any(k == e or k.startswith(e + ".") for k in KEYS)]
    assert not stale, f"ROLES entries that name no schema key: {stale}"
    assert set(roles.ROLES.values()) == {roles.ANSWER, roles.RECORD, roles.SWEEP}
    assert roles.role("tracking.experiment") == roles.RECORD and roles.role("tracking.objective.metric") == roles.SWEEP
    assert roles.role("sweep.retries") == roles.SWEEP and roles.role("cluster.intra_node_bandwidth") == roles.ANSWER
    wrong = [k for k in roles.NOT_ENUMERATED if k not in KEYS or roles.role(k) != roles.ANSWER]
    assert not wrong, f"NOT_ENUMERATED entries that are not answer keys of the schema: {wrong}"


def test_the_views_keep_exactly_their_roles_keys() -> None:
    tree = OmegaConf.to_container(cfg_for("mode=plan"), resolve=True)
    answer = roles.answer(tree)
    assert "tracking" not in answer and "sweep" not in answer and "name" not in answer["sharding"]
    assert answer["sharding"]["storage_reserve_percent"] == 0.15 and answer["sharding"]["constraints"] == {}
    enumerated = roles.enumerated(tree)
    assert "storage_reserve_percent" not in enumerated["sharding"]
    assert "intra_node_bandwidth" not in enumerated["cluster"]
    assert enumerated["sharding"]["types"] == answer["sharding"]["types"]
    assert enumerated["data"] == answer["data"] and enumerated["model"] == answer["model"]


CHANGES = {  # override -> whether the earlier point still answers it
    "tracking.run_name=another": True,
    "tracking.system_metrics=false": True,
    "sweep.retries=2": True,
    "tracking.objective.direction=max": True,
    "sharding.name=renamed": True,
    "tracking.experiment=elsewhere": False,
    "sharding.storage_reserve_percent=0.3": False,
    "cluster.intra_node_bandwidth=50": False,
    "train.seed=1": False,
}


def test_resume_and_reuse_agree_on_what_is_the_same_config(tmp_path: Path, capsys) -> None:
    from runner.launch.sweep.resume import config_digest, kept_point, reusable, reuse_asked
    from runner.plan.cost.choice import hashed
    from runner.runtime import run_files
    from runner.track import store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    base = ("mode=plan", f"tracking.uri={uri}", "tracking.experiment=roles", "sweep.reuse=true")
    before = cfg_for(*base)
    point = tmp_path / "0"  # the earlier point: its folder as a job leaves it, and its FINISHED run
    point.mkdir()
    OmegaConf.save(before, point / run_files.RESOLVED, resolve=True)
    run_files.write_status(point, "FINISHED", objective=1.0)
    run_files.write_json(point / run_files.RESULTS, {"mode": "plan", "est_step_ms": 1.0})
    run_id = store.start_run(uri, "roles", "earlier", None, {"runner.config_hash": roles.config_hash(
        hashed(before.cluster, before.mode, OmegaConf.to_container(before, resolve=True)))})  # as the job's run has it
    store.end_run(uri, run_id, "FINISHED")
    run_files.write_json(point / run_files.RUN_INFO, {"tracking_uri": uri, "run_id": run_id})

    for change, same in CHANGES.items():
        now = cfg_for(*base, change)
        resolved = OmegaConf.to_container(now, resolve=True)
        kept = kept_point(resolved, now.tracking, point) is not None
        assert reuse_asked(now.mode, now.sweep.reuse)
        found = reusable(config_digest(now.cluster, now.mode, resolved), now.tracking)
        assert kept == (found is not None) == same, (change, kept, found)
        assert found is None or found.info.run_id == run_id
        out = capsys.readouterr().out
        assert ("it runs again" in out) == change.startswith("tracking.experiment"), (change, out)
