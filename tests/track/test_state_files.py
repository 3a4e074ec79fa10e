"""State files the runner reads back, damaged as a full disk, a stopped copy or a crash leaves them: the event
log (a garbled line, a torn last line) and its delivery record; each gives at most one line saying what was
passed over, and what can be delivered is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Tuple

from mlflow.tracking import MlflowClient

from runner.runtime.run_files import DELIVERED
from runner.track.events import EventLog, EventPump
from runner.track.store import start_run


def _log(path: Path, steps: int) -> None:
    log = EventLog(path)
    for step in range(steps):
        log.metrics({"train/loss": 1.0 / (step + 1)}, step)
    log.close()


def test_a_garbled_and_a_torn_line_are_passed_over_the_rest_delivered(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = start_run(uri, "state_files", "events", None, {})
    events = tmp_path / "events.jsonl"
    _log(events, 6)
    lines = events.read_bytes().splitlines(keepends=True)
    lines[2] = b'{"kind": "metr\\x00\\xff garbled\n'  # a complete line that is not an event
    events.write_bytes(b"".join(lines) + b'{"kind": "metrics", "metr')  # and a last line cut short
    said: List[str] = []
    pump = EventPump(events, uri, run_id, say=said.append)
    assert pump()
    steps = [m.step for m in MlflowClient(uri).get_metric_history(run_id, "train/loss")]
    assert sorted(steps) == [0, 1, 3, 4, 5]  # all but the garbled one; the torn one waits
    assert len(said) == 1 and "1 damaged line(s)" in said[0] and str(events) in said[0], said
    delivered = json.loads((tmp_path / DELIVERED).read_text())["offset"]
    assert delivered == sum(len(x) for x in lines)  # up to the torn line, which is not consumed

    for damage in (b"", b'{"offset": 12', b"\x00\x01garbage", b'{"offset": 7}'):  # emptied, cut, garbled, mid-line
        (tmp_path / DELIVERED).write_bytes(damage)
        said.clear()
        again = EventPump(events, uri, run_id, say=said.append)
        assert len(said) == 1 and str(tmp_path / DELIVERED) in said[0] and "from its start" in said[0], (damage, said)
        assert again.pending() == 6  # every complete line, from the start


def test_a_damaged_sweep_json_is_named_and_its_parent_found_by_its_folder(tmp_path: Path, capsys) -> None:
    import pytest

    from runner.launch.sweep.parent import SWEEP_FILE, _resumable_parent
    from runner.launch.sweep.resume import resume_args
    from runner.track.store import experiment_id

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    parent = start_run(uri, "state_files", "sweep", None, {"runner.kind": "sweep", "runner.sweep_dir": str(sweep)})
    good = json.dumps({"parent_run_id": parent, "command": ["-m", "train.seed=1,2"], "overrides": []})
    for damage in (good[:20], "", "\x00\xff not json", "[1, 2]"):  # cut short, emptied, garbled, not a record
        (sweep / SWEEP_FILE).write_text(damage)
        with pytest.raises(ValueError) as refused:
            resume_args(sweep, [])
        assert str(sweep / SWEEP_FILE) in str(refused.value) and "\n" not in str(refused.value)
        assert "hydra.sweep.dir=" in str(refused.value)  # what to do
        assert _resumable_parent(uri, experiment_id(uri, "state_files"), sweep) == parent  # no second parent
        out = capsys.readouterr().out
        assert f"{sweep / SWEEP_FILE} cannot be read back; the sweep's parent run {parent} found" in out, out


DAMAGES = {"cut short": lambda b: b[: max(1, len(b) // 3)], "emptied": lambda b: b"",
           "garbled": lambda b: b"\x00\xff" + b[::-1], "not a record": lambda b: b"[1, 2, 3]"}


def test_a_finished_point_whose_files_are_damaged_runs_again_and_says_why(tmp_path: Path, capsys) -> None:
    from conftest import cfg_for
    from omegaconf import OmegaConf

    from runner.launch.sweep.resume import kept_point
    from runner.runtime import run_files

    cfg = cfg_for("mode=plan")
    run = tmp_path / "0"
    run.mkdir()
    for name in (run_files.STATUS, run_files.RESULTS, run_files.RESOLVED):
        for how, damage in DAMAGES.items():
            run_files.write_status(run, "FINISHED", objective=1.0)
            run_files.write_json(run / run_files.RESULTS, {"mode": "plan", "est_step_ms": 1.0})
            OmegaConf.save(cfg, run / run_files.RESOLVED, resolve=True)
            assert kept_point(OmegaConf.to_container(cfg, resolve=True), cfg.tracking, run) is not None  # intact: kept
            capsys.readouterr()
            (run / name).write_bytes(damage((run / name).read_bytes()))
            if name == run_files.RESOLVED and how == "not a record":
                (run / name).write_text("- 1\n- 2\n")
            assert kept_point(OmegaConf.to_container(cfg, resolve=True), cfg.tracking, run) is None, (name, how)
            out = capsys.readouterr().out
            assert out.count("\n") == 1 and f"{run / name} cannot be read back; the point runs again" in out, out


def test_a_damaged_pinned_plan_or_checkpoint_file_is_one_line(tmp_path: Path, capsys) -> None:
    import pytest
    from conftest import cfg_for

    from runner.config.errors import PlanError
    from runner.config.tables import table_specs
    from runner.plan.plan_file import load_plan
    from runner.train.checkpoint import BEST, META, CheckpointError, _read_best, read_meta

    cfg = cfg_for()
    plan = tmp_path / "plan.json"
    good = json.dumps({"m": {t.name: {"sharding_type": "table_wise", "ranks": [0]} for t in table_specs(cfg.model)}})
    step = tmp_path / "step-10"
    step.mkdir()
    for how, damage in DAMAGES.items():
        plan.write_bytes(damage(good.encode()))
        with pytest.raises(PlanError) as refused:
            load_plan(str(plan), table_specs(cfg.model), 2, 2, "cpu")
        assert f"sharding.plan={plan}: not a plan JSON" in str(refused.value) and "\n" not in str(refused.value), how
        (step / META).write_bytes(damage(b'{"step": 10, "metrics": {}}'))
        with pytest.raises(CheckpointError) as bad:
            read_meta(step)
        assert f"checkpoint {step}: its {META} cannot be read back" in str(bad.value)
        assert "train.resume" in str(bad.value) and "\n" not in str(bad.value)
        (tmp_path / BEST).write_bytes(damage(b'{"path": "x", "metric": "eval/auc", "value": 0.7}'))
        assert _read_best(tmp_path / BEST) is None
        assert f"{tmp_path / BEST} cannot be read back" in capsys.readouterr().out


def test_sync_of_a_folder_whose_run_json_is_damaged_says_so(tmp_path: Path, capsys) -> None:
    from runner.runtime import run_files
    from runner.track.sync import sync

    run_folder = tmp_path / "run"
    run_folder.mkdir()
    for how, damage in DAMAGES.items():
        (run_folder / run_files.RUN_INFO).write_bytes(damage(b'{"tracking_uri": "sqlite:///x.db", "run_id": "abc"}'))
        assert sync([str(run_folder)]) == 1, how
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{run_folder / run_files.RUN_INFO} cannot be read back" in err[0], (how, err)


def test_a_damaged_study_journal_is_one_line_and_the_sweep_ends_failed(tmp_path: Path, capsys) -> None:
    """The Optuna study's journal in the sweep folder: a garbled journal, one that is not Optuna's, or a study file
    of the old format (Optuna 2.10's pickle) ends the command in one line (exit 2) with the sweep's parent run
    FAILED; a last record cut short (a stop while it was written) is survived, said in a line, the study read
    without it."""
    import optuna
    import pytest
    from mlflow.tracking import MlflowClient

    from runner.launch.sweep import parent as sweep_module
    from runner.launch.sweep.study import JOURNAL_FILE, OLD_STUDY_FILE, journal_storage

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    folder = tmp_path / "sweep"
    study = optuna.create_study(study_name="s", storage=journal_storage(folder))
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=3)
    path = folder / JOURNAL_FILE
    good = path.read_bytes()
    path.write_bytes(good + good.splitlines(keepends=True)[-1][:20])  # the last record cut short
    assert len(optuna.load_study(study_name="s", storage=journal_storage(folder)).trials) == 3
    assert "was cut short" in capsys.readouterr().err
    damages = {"garbled": lambda: path.write_bytes(b"\x00\xff" + good[::-1]),
               "not a record": lambda: path.write_bytes(b"[1, 2, 3]\n"),
               "old format": lambda: (path.unlink(), (folder / OLD_STUDY_FILE).write_bytes(b"\x80\x04pickled"))}
    for how, damage in damages.items():
        parent = start_run(uri, "state_files", "study", None, {"runner.kind": "sweep"})
        sweep_module._Running.sweep = (uri, parent, folder)  # the sweep's parent is open when the study loads
        damage()
        with pytest.raises(SystemExit) as stopped:
            journal_storage(folder)
        assert stopped.value.code == 2, how
        err = capsys.readouterr().err.strip().splitlines()
        kind = "study file" if how == "old format" else "study journal"
        assert len(err) == 1 and err[0].startswith(f"error: the Optuna {kind} "), err
        run = MlflowClient(uri).get_run(parent)
        assert run.info.status == "FAILED", how  # not left RUNNING


def test_a_driver_s_fields_name_its_process_across_pid_reuse(tmp_path: Path) -> None:
    """``driver.json`` names the driver by pid and start (psutil): the live driver is not gone; one whose
    pid now belongs to a process started at another time, or to no process, is."""
    import os
    import subprocess
    import sys

    from runner.runtime import run_files

    fields = run_files.driver_fields(29500)
    assert fields["pid"] == os.getpid() and isinstance(fields["started"], float)
    run_files.write_json(tmp_path / run_files.DRIVER, fields)
    assert run_files.driver_gone(tmp_path) is None
    run_files.write_json(tmp_path / run_files.DRIVER, {**fields, "started": fields["started"] - 60})  # pid reused
    assert "is gone, killed outright" in str(run_files.driver_gone(tmp_path))
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    run_files.write_json(tmp_path / run_files.DRIVER, {**fields, "pid": int(ended.stdout)})  # no such process now
    assert f"(pid {int(ended.stdout)}) is gone" in str(run_files.driver_gone(tmp_path))


def test_files_of_the_wrong_shape_are_refused_or_passed_over_naming_the_file(tmp_path: Path, capsys) -> None:
    """What make fuzz-files found (each a traceback, a misleading line or a value used that no writer wrote): an
    event line of the right kind whose values are not (a metric given as a record, a time past int64, a param
    None) is passed over as damaged, not taken for an outage; a run.json whose run id is not text, sweep.json whose
    command holds a non-text argument, a point's status.json of no ending or run.json without its store, a journal
    record whose id or value is not a count or a finite number, are each one line naming the file."""
    import optuna
    import pytest

    from runner.launch.sweep.resume import resume_args
    from runner.launch.sweep.study import JOURNAL_FILE, journal_storage
    from runner.runtime import run_files
    from runner.track.sync import sync

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = start_run(uri, "state_files", "shapes", None, {})
    events = tmp_path / "events.jsonl"
    _log(events, 3)
    lines = events.read_bytes().splitlines(keepends=True)
    bad = [{"kind": "metrics", "metrics": {"train/loss": {"v": 1}}, "step": 3, "time": 1},
           {"kind": "metrics", "metrics": {"train/loss": 1.0}, "step": 4, "time": 10**30},
           {"kind": "params", "params": {"train.steps": None}}]
    events.write_bytes(b"".join(lines) + b"".join((json.dumps(e) + "\n").encode() for e in bad))
    said: List[str] = []
    assert EventPump(events, uri, run_id, say=said.append)()  # delivered, not "the store is unreachable"
    assert sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, "train/loss")) == [0, 1, 2]
    assert len(said) == 1 and "3 damaged line(s)" in said[0], said

    run_folder = tmp_path / "run"
    run_folder.mkdir()
    run_files.write_json(run_folder / run_files.RUN_INFO, {"tracking_uri": uri, "run_id": 12})
    assert sync([str(run_folder)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{run_folder / run_files.RUN_INFO} cannot be read back" in err[0], err

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    run_files.write_json(sweep / "sweep.json", {"command": ["-m", ["x"]], "overrides": []})
    with pytest.raises(ValueError, match="sweep.json cannot be read back"):
        resume_args(sweep, [])

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", storage=journal_storage(tmp_path / "study"))
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=2)
    path = tmp_path / "study" / JOURNAL_FILE
    good = path.read_bytes().splitlines(keepends=True)
    for key, value in (("trial_id", float("nan")), ("trial_id", 2**63), ("op_code", "text")):
        record = json.loads(good[-1])
        record[key] = value
        path.write_bytes(b"".join(good[:-1]) + (json.dumps(record) + "\n").encode())
        with pytest.raises(SystemExit):
            journal_storage(tmp_path / "study")
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{path} cannot be read back" in err[0] and f"{key}=" in err[0], err


def test_a_point_whose_status_is_no_ending_or_whose_run_is_nowhere_runs_again_said(tmp_path: Path, capsys) -> None:
    from conftest import cfg_for
    from omegaconf import OmegaConf

    from runner.launch.sweep.resume import kept_point
    from runner.runtime import run_files
    from runner.track import store

    cfg = cfg_for("mode=plan")
    now = OmegaConf.to_container(cfg, resolve=True)
    run = tmp_path / "0"
    run.mkdir()
    OmegaConf.save(cfg, run / run_files.RESOLVED, resolve=True)
    for name, record in ((run_files.STATUS, {"format": 3, "record": {"status": "FINISHED"}}),
                         (run_files.RUN_INFO, {"tracking_uri": 12})):
        run_files.write_status(run, "FINISHED", objective=1.0)
        run_files.write_json(run / run_files.RUN_INFO, {"tracking_uri": store.tracking_uri(cfg.tracking.uri)})
        assert kept_point(now, cfg.tracking, run) is not None
        run_files.write_json(run / name, record)
        assert kept_point(now, cfg.tracking, run) is None
        assert f"{run / name} cannot be read back; the point runs again" in capsys.readouterr().out


def _kept_run(tmp_path: Path, name: str) -> Tuple[str, Path, str]:
    """A run folder whose MLflow run was started and whose two step events were kept while the store was away."""
    from runner.runtime import run_files

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_folder = tmp_path / "run"
    run_folder.mkdir()
    run_id = start_run(uri, "state_files", name, None, {})
    run_files.write_json(run_folder / run_files.RUN_INFO, {"tracking_uri": uri, "run_id": run_id})
    _log(run_folder / run_files.EVENTS, 2)
    return uri, run_folder, run_id


def test_a_lost_delivery_file_delivers_the_job_s_own_ending(tmp_path: Path) -> None:
    """delivered.json cut short after the job ended while the store was away: sync ends the run with the ending
    status.json records (before: the run stayed RUNNING for ever)."""
    from runner.runtime import run_files
    from runner.track.sync import sync

    uri, run_folder, run_id = _kept_run(tmp_path, "lost_file")
    run_files.write_status(run_folder, "FINISHED")
    (run_folder / run_files.DELIVERED).write_text('{"final": {"status": "FINI')
    assert sync([str(run_folder)]) == 0
    assert MlflowClient(uri).get_run(run_id).info.status == "FINISHED"


def test_sync_says_what_it_passed_over_and_a_journal_value_outside_its_range_is_refused(tmp_path: Path,
                                                                                        capsys) -> None:
    """make fuzz-files: runner sync passed over damaged event lines without a word, took a delivered.json of no
    delivery record's keys for one, and a journal whose parameter value lay outside its range was replayed."""
    import optuna
    import pytest

    from runner.launch.sweep.study import JOURNAL_FILE, journal_storage
    from runner.runtime import run_files
    from runner.track.sync import sync

    uri, run_folder, run_id = _kept_run(tmp_path, "said")
    with (run_folder / run_files.EVENTS).open("a") as f:
        f.write(json.dumps({"kind": "metrics", "metrics": {"x": 1.0}, "step": "text"}) + "\n")
    run_files.write_status(run_folder, "FINISHED")
    run_files.write_json(run_folder / run_files.DELIVERED, {"format": 3, "record": {"final": {"status": "FINISHED"}}})
    assert sync([str(run_folder)]) == 0
    out = capsys.readouterr().out
    assert "1 damaged line(s)" in out and f"{run_folder / run_files.DELIVERED} cannot be read back" in out, out
    assert MlflowClient(uri).get_run(run_id).info.status == "FINISHED"

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", storage=journal_storage(tmp_path / "study"))
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=1)
    path = tmp_path / "study" / JOURNAL_FILE
    lines = path.read_bytes().splitlines(keepends=True)
    i = next(n for n, line in enumerate(lines) if b"param_value_internal" in line)
    record = json.loads(lines[i])
    record["param_value_internal"] = -0.5
    lines[i] = (json.dumps(record) + "\n").encode()
    path.write_bytes(b"".join(lines))
    with pytest.raises(SystemExit):
        journal_storage(tmp_path / "study")
    assert "x=-0.5 is outside its range" in capsys.readouterr().err


def test_lines_of_another_writer_are_passed_over_a_restarted_one_s_delivered(tmp_path: Path) -> None:
    """make fuzz-files (seed 38125): two writers' lines interleaved in one events.jsonl were both delivered. Each
    line carries its writer's id, the run folder's (events_writer.json, made by the job's first writer and taken by
    every later one): a rank 0 restarted in the job relogs its steps and is delivered; the lines of a process of
    another writer id, interleaved with the job's, are passed over in one line naming the file and the writers."""
    from runner.runtime.run_files import EVENTS_WRITER
    from runner.track.events import log_writer

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = start_run(uri, "state_files", "writers", None, {})
    events = tmp_path / "events.jsonl"
    job, intruder = EventLog(events), EventLog(events)
    assert job.writer == intruder.writer == log_writer(events)  # one job's processes share the folder's id
    intruder.writer = job.writer + 1  # as a process of another job's log (its id another)
    for step in range(4):
        job.metrics({"train/loss": 1.0 / (step + 1)}, step)
        intruder.metrics({"train/loss": 5.0 + step}, step + 1)
    restarted = EventLog(events)  # a rank 0 restarted by torch elastic: from its checkpoint at step 2, again
    for step in (2, 3):
        restarted.metrics({"train/loss": 0.1 * step}, step)
    for log in (job, intruder, restarted):
        log.close()
    said: List[str] = []
    assert EventPump(events, uri, run_id, say=said.append)()
    stored = sorted((m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, "train/loss"))
    assert stored == sorted([(s, 1.0 / (s + 1)) for s in range(4)] + [(2, 0.2), (3, 0.1 * 3)]), stored
    assert len(said) == 1 and str(events) in said[0] and "4 line(s) written by another process" in said[0], said
    assert f"writer {job.writer + 1}, not the job's {job.writer}" in said[0], said

    (tmp_path / EVENTS_WRITER).write_text("{")  # the mark's record damaged: every line is the job's, as before
    assert log_writer(events) is None and EventLog(events).writer != job.writer


def test_sync_delivers_the_ending_an_earlier_attempt_kept_in_its_set_aside_folder(tmp_path: Path) -> None:
    """A chaos run's finding (tests/faults/test_chaos.py): an attempt whose agent was killed while the store was away
    kept its FAILED ending in delivered.json; its retry set those files aside (previous/1/), where no sync looked, and
    the run stayed RUNNING. runner sync of the folder (or its sweep) delivers earlier jobs' kept endings too."""
    from runner.runtime import run_files
    from runner.track.sync import kept_runs, sync

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = tmp_path / "sweep"
    point = sweep / "0"
    point.mkdir(parents=True)
    (sweep / "sweep.json").write_text("{}")
    first = start_run(uri, "state_files", "attempt 1", None, {})
    run_files.write_json(point / run_files.RUN_INFO, {"tracking_uri": uri, "run_id": first})
    _log(point / run_files.EVENTS, 2)
    run_files.update_json(point / run_files.DELIVERED, final={"status": "FAILED", "error": "the agent was killed"})
    run_files.set_aside_previous(point)
    second = start_run(uri, "state_files", "attempt 2", None, {})
    run_files.write_json(point / run_files.RUN_INFO, {"tracking_uri": uri, "run_id": second})
    run_files.update_json(point / run_files.DELIVERED, final={"status": "FINISHED", "error": None})
    assert kept_runs(sweep) == [point / "previous" / "1", point]
    assert sync([str(sweep)]) == 0
    client = MlflowClient(uri)
    assert [client.get_run(r).info.status for r in (first, second)] == ["FAILED", "FINISHED"]
    assert [m.step for m in client.get_metric_history(first, "train/loss")] == [0, 1]


def test_a_trial_s_objective_is_what_its_job_logged_while_the_store_is_away(tmp_path: Path) -> None:
    """A chaos run's finding (tests/faults/test_chaos.py): a trial of a study on [eval/auc, eval/ne] that ended while
    the store was away was told NE = inf (the worst), as NE was read from the store alone; its run got the real NE
    later from sync, and the Pareto front disagreed with the store. The objective is read from the job's results,
    else its event log (the values its run gets), and only then the store."""
    from runner.runtime.run_files import EVENTS
    from runner.track.objective import objective_value

    log = EventLog(tmp_path / EVENTS)
    log.metrics({"eval/auc": 0.7, "plan/max_mem_bytes": 5.0}, 10)
    log.metrics({"plan/max_mem_bytes": 4.0}, 20)
    log.close()
    away = {"eval_auc": 0.71, "eval_ne": 0.93, "run_id": "r", "tracking_uri": "http://127.0.0.1:9"}
    wanted = [("eval/auc", "max"), ("eval/ne", "min"), ("plan/max_mem_bytes", "min"), ("eval/other", "max")]
    assert objective_value(wanted, away, tmp_path) == [0.71, 0.93, 4.0, float("-inf")]


def test_sync_passes_over_a_run_the_store_deleted(tmp_path: Path, capsys) -> None:
    """The chaos test's next finding: a resume replaces a killed point's earlier run (soft-deleted, so the parent keeps
    one child per point) while that attempt's set-aside folder still kept reports; runner sync then failed on it for
    good (the store refuses a deleted run). It is passed over in one line, nothing left kept."""
    from runner.runtime import run_files
    from runner.track.sync import kept_runs, sync

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_folder = tmp_path / "sweep" / "0"
    run_folder.mkdir(parents=True)
    run_id = start_run(uri, "state_files", "replaced", None, {})
    run_files.write_json(run_folder / run_files.RUN_INFO, {"tracking_uri": uri, "run_id": run_id})
    _log(run_folder / run_files.EVENTS, 2)
    run_files.update_json(run_folder / run_files.DELIVERED, final={"status": "KILLED", "error": "stopped"})
    MlflowClient(uri).delete_run(run_id)
    assert sync([str(run_folder)]) == 0
    out = capsys.readouterr().out
    assert f"its MLflow run {run_id} was deleted" in out and "nothing delivered" in out, out
    assert kept_runs(tmp_path / "sweep") == []


def test_sync_ends_a_point_run_no_run_folder_names(tmp_path: Path, capsys) -> None:
    """The chaos test's finding (CI, seed 938946): a point's run created in the store whose job ended before its folder
    named it stayed RUNNING, empty, for good. A sweep's sync ends such a run KILLED; a run a folder names, one a
    folder's kept record will adopt, and one younger than a live job needs to name its own are left alone."""
    import time

    from runner.runtime import run_files
    from runner.track.store import RECORD_TAG, experiment_id
    from runner.track.sync import LOST_TAG, PARENT_DIR, sync

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = tmp_path / "sweep"
    (sweep / "0").mkdir(parents=True)
    (sweep / PARENT_DIR).mkdir()
    (sweep / "sweep.json").write_text("{}")
    parent = start_run(uri, "state_files", "sweep", None, {})
    run_files.write_json(sweep / PARENT_DIR / run_files.RUN_INFO, {"tracking_uri": uri, "run_id": parent})
    client, exp = MlflowClient(uri), experiment_id(uri, "state_files")
    then = int(time.time() * 1000) - 60_000
    made = {name: client.create_run(exp, start_time=then if name != "young" else None,
                                    tags={"mlflow.parentRunId": parent, RECORD_TAG: name}).info.run_id
            for name in ("named", "kept", "lost", "young")}
    run_files.write_json(sweep / "0" / run_files.RUN_INFO, {"tracking_uri": uri, "run_id": made["named"]})
    (sweep / "1").mkdir()
    run_files.write_json(sweep / "1" / run_files.RUN_INFO, {"tracking_uri": uri, "run_id": None, "pending": {
        "experiment": "state_files", "name": "kept", "tags": {RECORD_TAG: "kept", "mlflow.parentRunId": parent}}})
    run_files.update_json(sweep / "1" / run_files.DELIVERED, final={"status": "KILLED", "error": "stopped"})
    assert sync([str(sweep)]) == 0
    status = {name: client.get_run(run_id).info.status for name, run_id in made.items()}
    assert status == {"named": "RUNNING", "kept": "KILLED", "lost": "KILLED", "young": "RUNNING"}, status
    assert LOST_TAG in client.get_run(made["lost"]).data.tags and LOST_TAG not in client.get_run(made["kept"]).data.tags
    assert f"MLflow run {made['lost']}, which no run folder names" in capsys.readouterr().out
