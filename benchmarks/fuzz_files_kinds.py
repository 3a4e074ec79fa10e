"""The files ``make fuzz-files`` damages (:mod:`fuzz_files`): for each kind, how its clean folder is made (by the
runner's own writers, a real MLflow store and a real Optuna journal), which command reads it back and what that
reading is (the values the runner then uses), and which values the file's own rules allow (a damage that leaves a
value the runner could have written is another valid file, not a damaged one: it may be read as written).

Each reader runs in a forked child on its own copy of the clean folder (every path in its files moved to the copy:
:func:`relocate`), so a case never touches another's store or journal.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
PY = ROOT / ".venv" / "bin" / "python"
sys.path.insert(0, str(ROOT))
CAL_FILE = "this.calibration.yaml"
MISSING = object()  # the value of a key removed, as a domain is asked about it
Path_ = Tuple[Any, ...]  # where a value sits in a parsed file: keys and list indices from its root


@dataclass
class Kind:
    """One kind of file read back. ``files``: the damageable files (relative to the case folder) and their format
    (``json``, ``jsonl``, ``yaml``); ``read``: the reading (runs in the case folder; raises or exits to refuse);
    ``domain``: whether a value at a path is one the file's writer could have written (None: any of the type);
    ``subset``: whether a reading after a warning is the clean one less what was passed over; ``refusals``: the
    exception types that are a refusal."""

    name: str
    files: Dict[str, str]
    make: Callable[[Path], None]
    read: Callable[[Path], Any]
    domain: Callable[[str, Path_, Any], bool]
    subset: Callable[[Any, Any], bool]
    refusals: Tuple[type, ...] = (ValueError,)
    digest: bool = False  # a file with a digest: edits without a new digest must be refused


def uri(folder: Path) -> str:
    """The MLflow store of a folder (a real SQLite store, copied with the folder)."""
    return f"sqlite:///{folder / 'mlflow.db'}"


def relocate(clean: Path, case: Path) -> None:
    """A copy of ``clean`` at ``case`` whose files name the copy's paths (its store, its folders), not the clean's."""
    import shutil

    shutil.copytree(clean, case)
    for path in case.rglob("*"):
        if path.suffix in (".json", ".jsonl", ".yaml", ".log") and path.is_file():
            path.write_bytes(path.read_bytes().replace(str(clean).encode(), str(case).encode()))


def _finite(v: Any, low: float = -math.inf, high: float = math.inf) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and low <= v <= high


def _int(v: Any, low: int = 0, high: int = 2**62) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def _never(reading: Any, clean: Any) -> bool:
    return False


# -- calibration: cluster.calibration=<file> (check_file, for_job) and =auto (the cache folder) ------------------

def _fit(fixed: float, slope: float, unit: str) -> Dict[str, float]:
    return {"fixed_ms": fixed, "ms_per_unit": slope, "fit_error": 0.0, unit: slope}


def _lookups() -> Dict[str, Any]:
    one = {"fwd": {"fixed_ms": 2.0, "per_table_ms": 0.3, "ms_per_table_ksample": 1.0},
           "bwd": {"fixed_ms": 0.6, "per_table_ms": 0.1, "ms_per_table_ksample": 0.5}}
    return {k: json.loads(json.dumps(one)) for k in ("table_wise", "row_wise", "data_parallel")}


def make_calibration(folder: Path) -> None:
    """This machine's fingerprint (1 x 2 CPU workers) and constants as ``mode=calibrate`` fits them."""
    from runner.plan.cost.calibration import Calibration, save
    from runner.plan.cost.trust import PARTS
    from runner.runtime.hardware import fingerprint

    coll = {name: {"intra": {"latency_ms": 0.1, "bandwidth_gibps": 2.0, "fit_error": 0.0}}
            for name in ("all_to_all", "all_reduce", "reduce_scatter")}
    constants = {"collectives": coll, "intra_node_bandwidth": 2.0, "cross_node_bandwidth": None,
                 "device_bw_gibps": 17.5, "kernel_call_fwd_ms": 0.21, "kernel_call_bwd_ms": 0.13,
                 "bwd_compute_multiplier": 6.4, "fit_error_fwd": 0.01, "fit_error_bwd": float("inf"),
                 "sharded": _lookups(), "dense_fwd": _fit(0.3, 25.0, "ms_per_gflop"),
                 "dense_bwd": _fit(0.4, 80.0, "ms_per_gflop"), "optimizer": _fit(0.1, 0.5, "ms_per_mparam"),
                 "input": _fit(0.01, 0.01, "ms_per_ksample")}
    cal = Calibration(fingerprint("cpu", 1, 2), constants, {p: 0.01 for p in PARTS}, {p: True for p in PARTS}, {},
                      "2026-11-28T00:00:00Z", {p: 0.005 for p in PARTS})
    save(cal, folder / "cal" / CAL_FILE)


def _calibration_reading(cal: Any) -> Any:
    if cal is None:
        return None
    return {"constants": cal.constants, "trusted": cal.trusted, "fingerprint": cal.fingerprint, "format": cal.format}


def read_calibration(case: Path) -> Any:
    """``cluster.calibration=<file>``: the pre-check's :func:`check_file`, then what :func:`for_job` plans with."""
    from runner.plan.cost.calibration import check_file
    from runner.plan.cost.choice import for_job

    path = str(case / "cal" / CAL_FILE)
    check_file(path)
    chosen = for_job(SimpleNamespace(calibration=path, calibration_dir=None, nodes=1, workers_per_node=2),
                     "cpu", False)
    return {"calibration": _calibration_reading(chosen.calibration), "note": "fell back" in chosen.note}


def read_calibration_auto(case: Path) -> Any:
    """``cluster.calibration=auto`` over a folder holding the file: a file that cannot be used is skipped (the plan
    line says which and why), a part whose value fails its check falls back alone (the line names it)."""
    from runner.plan.cost.choice import for_job

    chosen = for_job(SimpleNamespace(calibration="auto", calibration_dir=str(case / "cal"), nodes=1,
                                     workers_per_node=2), "cpu", True)
    print(f"[fuzz] plan line: {chosen.note}")
    return {"calibration": _calibration_reading(chosen.calibration)}


def calibration_domain(file: str, path: Path_, value: Any) -> bool:
    """The calibration's documented ranges (docs/calibration.md): bandwidths in (0, 100 TB/s], times and slopes in
    [0, 1,000 s], a multiplier in (0, 10,000], a fit's error >= 0 or infinite, trust true or false."""
    if not path:
        return False
    leaf = str(path[-1])
    if path[0] == "constants":
        if leaf.startswith("fit_error"):
            return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
        if leaf.endswith("bandwidth") or leaf.endswith("_gibps"):
            return value is None or (_finite(value, 0, 1e14 / 2**30) and value > 0)
        if leaf == "bwd_compute_multiplier":
            return _finite(value, 0, 1e4) and value > 0
        return _finite(value, 0, 1e6)
    if path[0] == "fingerprint":
        return True  # another machine's calibration: not this hardware's, so not used (auto), or refused (a file)
    if path[0] == "trusted":
        return isinstance(value, bool)
    return path[0] in ("spread", "median_error", "made", "measurements") and not isinstance(value, (dict, list))


def calibration_subset(reading: Any, clean: Any) -> bool:
    """Skipped (auto: no calibration, said), or parts fallen back (said): each constant kept is the clean one's."""
    cal, base = reading.get("calibration"), clean["calibration"]
    if cal is None:
        return True
    kept = cal["constants"]
    return all(json.dumps(v, sort_keys=True) == json.dumps(base["constants"].get(k), sort_keys=True)
               for k, v in kept.items())


# -- the Optuna journal of a sweep folder (resume of an Optuna sweep) ---------------------------------------------

def make_journal(folder: Path) -> None:
    """A real study in the folder's journal: 5 trials of one float and one int, one of them pruned."""
    import optuna

    from runner.launch.sweep.study import journal_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", storage=journal_storage(folder / "sweep"))

    def objective(trial: Any) -> float:
        x, n = trial.suggest_float("x", 0.0, 1.0), trial.suggest_int("n", 1, 8)
        if trial.number == 3:
            raise optuna.TrialPruned()
        return (x - 0.3) ** 2 + n / 10

    study.optimize(objective, n_trials=5)


def read_journal(case: Path) -> Any:
    """What the Optuna sweeper's resume reads: the study from the journal, every trial and the best one."""
    import optuna

    from runner.launch.sweep.study import journal_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="s", storage=journal_storage(case / "sweep"))
    trials = [[t.number, t.state.name, dict(t.params), t.values] for t in study.trials]
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    return {"trials": trials, "best": [study.best_trial.number, study.best_value] if done else None}


def journal_domain(file: str, path: Path_, value: Any) -> bool:
    """A trial's value: any finite number (Optuna fails a trial told NaN); x in [0, 1] and n in 1..8 (the study's
    space); everything else (op codes, ids, states, dates) is Optuna's own bookkeeping."""
    leaf = path[-1] if path else None
    if len(path) >= 2 and path[-2] == "values":
        return _finite(value)
    if len(path) >= 2 and path[-2] == "params":
        return _finite(value, 0, 1) if leaf == "x" else _int(value, 1, 8)
    return leaf == "param_value_internal" and _finite(value, 0, 1)


def journal_subset(reading: Any, clean: Any) -> bool:
    """The study without its last change(s): every trial read is one of the clean study's at an earlier state."""
    base = {t[0]: t for t in clean["trials"]}
    for number, _state, params, values in reading["trials"]:
        if number not in base or any(base[number][2].get(k) != v for k, v in params.items()):
            return False
        if values is not None and values != base[number][3]:
            return False
    return True


# -- a run folder kept while the store was away: runner sync -------------------------------------------------------

def make_run(folder: Path) -> None:
    """A job's run folder as an outage leaves it: run.json names the run, the event log holds 6 metric steps, params
    and tags (each line marked with the writer id of events_writer.json), delivered.json says 2 lines reached the
    store and keeps the final status; status.json as the job wrote it. The store is a real MLflow SQLite store in
    the folder."""
    from runner.runtime import run_files
    from runner.track.events import EventLog, EventPump
    from runner.track.store import start_run

    run = folder / "run"
    run.mkdir(parents=True)
    store = uri(folder)
    run_id = start_run(store, "fuzz_files", "run", None, {"runner.record_id": "r1"})
    run_files.write_json(run / run_files.RUN_INFO, {"tracking_uri": store, "run_id": run_id})
    log = EventLog(run / run_files.EVENTS)
    log.params({"train.steps": "6", "model": "dlrm"})
    log.metrics({"train/loss": 0.9}, 0)
    log.close()
    EventPump(run / run_files.EVENTS, store, run_id, say=lambda line: None)()  # the first 2 lines reached the store
    log = EventLog(run / run_files.EVENTS)
    for step in range(1, 6):
        log.metrics({"train/loss": round(1.0 / (step + 1), 4), "train/samples_per_s": 1000.0 + step}, step)
    log.tags({"runner.plan": "tablewise"})
    log.close()
    run_files.update_json(run / run_files.DELIVERED, final={"status": "FINISHED", "error": None})
    run_files.write_status(run, "FINISHED", objective=0.5)


def read_run(case: Path) -> Any:
    """``python -m runner sync <run folder>`` (in-process, as the command runs it), then what the store holds."""
    from mlflow.tracking import MlflowClient

    from runner.track.sync import sync

    rc = sync([str(case / "run")])
    client = MlflowClient(uri(case))
    run = client.search_runs([client.get_experiment_by_name("fuzz_files").experiment_id])
    out = []
    for r in run:
        metrics = sorted({(k, m.step, repr(m.value)) for k in r.data.metrics
                          for m in client.get_metric_history(r.info.run_id, k)})
        out.append({"status": r.info.status, "metrics": metrics, "params": r.data.params,
                    "tags": {k: v for k, v in r.data.tags.items() if k.startswith("runner.plan")}})
    return {"rc": rc, "runs": out}


def run_domain(file: str, path: Path_, value: Any) -> bool:
    """The event log's metric values are any float rank 0 measured (a diverging loss is NaN), its steps and times
    counts; delivered.json's offset a line's start, its final status one of MLflow's; run.json's run id MLflow's. A
    metric, param or tag left out of an event is one the job did not log there."""
    leaf = path[-1] if path else None
    if file.endswith("events.jsonl"):
        if len(path) >= 2 and path[-2] == "metrics":
            return isinstance(value, float) or value is MISSING
        if leaf in ("step", "time"):
            return _int(value)
        return len(path) >= 2 and path[-2] in ("params", "tags") and (isinstance(value, str) or value is MISSING)
    if file.endswith("status.json"):
        return leaf == "objective" and _finite(value)
    return False


def run_subset(reading: Any, clean: Any) -> bool:
    """Lines passed over (said): the run's metrics are the clean run's less some, its params and status the same."""
    if reading["rc"] != 0 or len(reading["runs"]) != 1:
        return False
    got, base = reading["runs"][0], clean["runs"][0]
    return set(map(tuple, got["metrics"])) <= set(map(tuple, base["metrics"])) and got["status"] == base["status"]


# -- a finished point of a sweep: resume keeps it or runs it again -------------------------------------------------

POINT: Dict[str, Any] = {}  # the resolved config and tracking of the point (composed once, before the forks)


def make_point(folder: Path) -> None:
    """A finished plan-only point: its resolved config, status.json, results.json and run.json."""
    from omegaconf import OmegaConf

    from runner.runtime import run_files
    from runner.track import store

    cfg = _point_cfg()
    run = folder / "sweep" / "0"
    run.mkdir(parents=True)
    OmegaConf.save(cfg, run / run_files.RESOLVED, resolve=True)
    run_files.write_status(run, "FINISHED", objective=12.5)
    run_files.write_json(run / run_files.RESULTS, {"mode": "plan", "est_step_ms": 12.5})
    run_files.write_json(run / run_files.RUN_INFO, {"tracking_uri": store.tracking_uri(cfg.tracking.uri),
                                              "run_id": "0" * 32})


def _point_cfg() -> Any:
    if "cfg" not in POINT:
        from hydra import compose, initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        import runner.cli  # noqa: F401  (schema and resolvers)

        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            POINT["cfg"] = compose(config_name="config", overrides=["mode=plan", "tracking.uri=sqlite:////tmp/x.db"])
    return POINT["cfg"]


def read_point(case: Path) -> Any:
    """What ``resume`` does with the point: kept (its status, among them the objective the sweep reports) or run
    again (None)."""
    from omegaconf import OmegaConf

    from runner.launch.sweep.resume import kept_point

    cfg = _point_cfg()
    return {"kept": kept_point(OmegaConf.to_container(cfg, resolve=True), cfg.tracking, case / "sweep" / "0")}


def point_domain(file: str, path: Path_, value: Any) -> bool:
    """status.json's objective is any finite number; results.json's estimates any non-negative number."""
    leaf = path[-1] if path else None
    if file.endswith("status.json"):
        return leaf == "objective" and _finite(value)
    return file.endswith("results.json") and leaf == "est_step_ms" and _finite(value, 0)


def point_subset(reading: Any, clean: Any) -> bool:
    return reading["kept"] is None  # the point runs again (said)


# -- sweep.json: resume's command and the check that it is the same sweep ----------------------------------------

def make_sweep(folder: Path) -> None:
    from runner.runtime import run_files

    sweep = folder / "sweep"
    sweep.mkdir(parents=True)
    run_files.write_json(sweep / "sweep.json", {
        "parent_run_id": "a" * 32, "swept": ["train.seed"], "overrides": ["mode=plan", "train.seed=1,2"],
        "command": ["-m", "mode=plan", "train.seed=1,2"], "points": 2, "started": 1764300000.0, "paired": []})


def read_sweep(case: Path) -> Any:
    """``runner resume <sweep folder>``: the command it runs, then the check of that command against the folder's
    sweep, and the parent run the resumed sweep goes on under."""
    from runner.launch.sweep.resume import check_resume, resume_argv
    from runner.track.sweep_points import parent_run_id

    folder = case / "sweep"
    argv = resume_argv([str(folder)])
    now = [a for a in argv if a != "-m" and not a.startswith("hydra.sweep.dir=")]
    return {"argv": argv, "check": check_resume(folder, now, False), "parent": parent_run_id(str(folder))}


def sweep_domain(file: str, path: Path_, value: Any) -> bool:
    """The sweep's start time and point count are free numbers; the rest names the command and its run."""
    return (path == ("started",) and _finite(value, 0)) or (path == ("points",) and _int(value, 1))


# -- a pinned plan: sharding.plan=<file> ---------------------------------------------------------------------------

def make_plan(folder: Path) -> None:
    """The plan.json a real plan-only job writes (the default DLRM on 1 x 2 CPU workers), column-wise sharding
    among the tables so that shards are in it."""
    out = folder / "planjob"
    subprocess.run([str(PY), "-m", "runner", "mode=plan", "sharding=tablecolumnwise", f"hydra.run.dir={out}",
                    f"tracking.uri=sqlite:///{folder / 'plan.db'}"], cwd=ROOT, check=True, capture_output=True)
    (folder / "plan.json").write_bytes(next(out.glob("plan/plan.json")).read_bytes())


def read_plan(case: Path) -> Any:
    """What each worker does with ``sharding.plan=<file>``: the plan loaded for the model and world, as TorchRec's
    ParameterSharding per table (written back as the runner writes plans)."""
    from runner.config.tables import table_specs
    from runner.plan.plan_file import load_plan, plan_to_dict

    specs = table_specs(_point_cfg().model)
    return plan_to_dict(load_plan(str(case / "plan.json"), specs, 2, 2, "cpu"), specs)


def plan_domain(file: str, path: Path_, value: Any) -> bool:
    """Ranks are the job's (0 or 1); nothing else of a plan can change and still fit the model."""
    return (path[-1] == "rank" or (len(path) >= 2 and path[-2] == "ranks")) and _int(value, 0, 1)


# -- a checkpoint's meta.json: train.resume=<checkpoint> ------------------------------------------------------------

def make_checkpoint(folder: Path) -> None:
    step = folder / "checkpoints" / "step-00000010"
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(b"dcp")  # DCP's own file, whose presence marks a complete checkpoint
    (step / "meta.json").write_text(json.dumps({
        "step": 10, "time": 1764300000.0, "metrics": {"eval/auc": 0.71},
        "loss_scale": {"scale": 32768.0, "good_steps": 3, "skipped": 1}}, indent=2))


def read_checkpoint(case: Path) -> Any:
    """What a resumed job takes from ``train.resume=latest``: the start step and the fp16 loss scaler's state,
    loaded into the runner's own loss scaler (trainer._resume)."""
    from runner.train.checkpoint import read_meta, resolve

    root = case / "checkpoints"
    meta = read_meta(resolve("latest", root))
    scale = meta.get("loss_scale")
    if scale:
        from runner.train.split_step import LossScale

        scaler = LossScale()
        scaler.load_state_dict(scale)
        scale = scaler.state_dict()
    return {"step": meta.get("step", 0), "loss_scale": scale}


def checkpoint_domain(file: str, path: Path_, value: Any) -> bool:
    """The step a count; the metrics and time free numbers; the loss scale a positive finite number, its step
    counts counts."""
    leaf = path[-1] if path else None
    if path == ("loss_scale",):
        return value is MISSING  # a job without fp16's loss scaling saves none
    if path == ("step",):
        return _int(value, 0)
    if path and path[0] in ("metrics", "time"):
        return _finite(value)
    if leaf == "scale":
        return _finite(value) and value > 0
    return leaf in ("good_steps", "skipped") and _int(value, 0)


def kinds() -> List[Kind]:
    from runner.config.errors import PlanError
    from runner.train.checkpoint import CheckpointError

    cal = {f"cal/{CAL_FILE}": "yaml"}
    return [
        Kind("calibration", cal, make_calibration, read_calibration, calibration_domain, calibration_subset,
             digest=True),
        Kind("calibration-auto", cal, make_calibration, read_calibration_auto, calibration_domain,
             calibration_subset, digest=True),
        Kind("optuna-journal", {"sweep/optuna_journal.log": "jsonl"}, make_journal, read_journal, journal_domain,
             journal_subset),
        Kind("run-folder", {"run/events.jsonl": "jsonl", "run/delivered.json": "json", "run/run.json": "json",
                            "run/status.json": "json", "run/events_writer.json": "json"}, make_run, read_run,
             run_domain, run_subset),
        Kind("sweep-point", {"sweep/0/status.json": "json", "sweep/0/results.json": "json",
                             "sweep/0/run.json": "json"}, make_point, read_point, point_domain, point_subset),
        Kind("sweep-json", {"sweep/sweep.json": "json"}, make_sweep, read_sweep, sweep_domain, _never),
        Kind("plan-json", {"plan.json": "json"}, make_plan, read_plan, plan_domain, _never, (PlanError,)),
        Kind("checkpoint-meta", {"checkpoints/step-00000010/meta.json": "json"}, make_checkpoint, read_checkpoint,
             checkpoint_domain, _never, (CheckpointError,)),
    ]
