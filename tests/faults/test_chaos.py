"""Chaos over a whole study (issue 79, item 5): an asynchronous Optuna study of short training trials while a chaos
thread kills, at random moments, a worker, an agent, the MLflow server (started again on its port) and at last the
sweep's own process; then ``runner resume`` and ``runner sync``.

After it every trial is once in the journal and has one FINISHED run in the store (an attempt that a kill ended is
KILLED or FAILED beside it, and ran again), none is left RUNNING, no process of the study is left, and the Pareto
front kept in ``optimization_results.yaml`` is the non-dominated set of the runs' metrics. A new seed each run (its
moments and trials differ); a failure names it: ``RUNNER_CHAOS_SEED=<seed>`` replays its draw.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, List, Optional

import pytest
from conftest import FAST, ROOT, MlflowServer, processes_tagged, runs
from test_faults import _parent

pytestmark = [pytest.mark.slow, pytest.mark.faults]

TRIALS = 6
OBJECTIVES = ["eval/auc", "eval/ne"]  # maximize, minimize: a Pareto front


def _running_worker(sweep: Path, but: Optional[int] = None) -> Optional[tuple]:
    """(trial's job number, its rank 0's pid) of a trial that trains now, other than job ``but``."""
    for pid_file in sorted(sweep.glob("[0-9]*/pids/rank0.pid")):
        job = int(pid_file.parent.parent.name)
        try:
            pid = int(pid_file.read_text())
        except (OSError, ValueError):
            continue
        if job != but and not (pid_file.parent.parent / "status.json").exists() and Path(f"/proc/{pid}").exists():
            return job, pid
    return None


def _until(ready: Callable[[], object], within: float, stop: threading.Event) -> object:
    deadline = time.monotonic() + within
    while not stop.is_set() and time.monotonic() < deadline:
        found = ready()
        if found:
            return found
        time.sleep(0.05)
    return None


def _chaos(rng: random.Random, sweep: Path, sweep_proc: subprocess.Popen, server: MlflowServer, said: List[str],
           stop: threading.Event) -> None:
    """The chaos thread: a worker, an agent (of another trial), the server (started again), then the sweep."""
    hit = _until(lambda: _running_worker(sweep), 120, stop)
    time.sleep(rng.uniform(0.0, 1.5))
    if hit and (hit := _running_worker(sweep) or hit):
        os.kill(hit[1], signal.SIGKILL)  # torch elastic restarts it (cluster.max_restarts=1)
        said.append(f"worker of job {hit[0]}")
    time.sleep(rng.uniform(0.5, 2.0))
    other = _until(lambda: _running_worker(sweep, but=hit[0] if hit else None), 120, stop)
    if isinstance(other, tuple) and (agent := _parent(other[1])) > 1:
        os.kill(agent, signal.SIGKILL)  # the job fails from a fault: sweep.retries runs it again
        said.append(f"agent of job {other[0]}")
    time.sleep(rng.uniform(0.5, 2.0))
    server.stop(signal.SIGKILL)
    said.append("mlflow server")
    time.sleep(rng.uniform(0.5, 3.0))
    server.start()
    done = lambda: len(list(sweep.glob("[0-9]*/status.json")))  # noqa: E731
    ended = rng.randint(2, 4)  # drawn once, so that a seed replays its moments
    _until(lambda: done() >= ended, 240, stop)
    time.sleep(rng.uniform(0.0, 2.0))
    if sweep_proc.poll() is None:
        sweep_proc.kill()
        said.append(f"sweep after {done()} trials ended")


def _dominated(a: List[float], b: List[float]) -> bool:
    """Whether ``a`` (AUC, NE) is dominated by ``b``: AUC no lower, NE no higher, not the same."""
    return b[0] >= a[0] and b[1] <= a[1] and a != b


def test_an_optuna_study_survives_kills_of_a_worker_an_agent_its_store_and_its_sweep(tmp_path: Path) -> None:
    import optuna
    import yaml

    from runner.launch.sweep.study import journal_storage

    seed = int(os.environ.get("RUNNER_CHAOS_SEED") or random.randrange(10**6))
    rng = random.Random(seed)
    t0 = time.monotonic()
    server = MlflowServer(tmp_path / "server")
    server.start()
    sweep, exp, tag = tmp_path / "sweep", "chaos", uuid.uuid4().hex
    env = dict(os.environ, PYTHONUNBUFFERED="1", RUNNER_TEST_TAG=tag)
    env.pop("MLFLOW_TRACKING_URI", None)
    short = [a for a in FAST if not a.startswith("train.steps=")]
    args = ["-m", *short, "train.steps=150", "train.checkpoint.every_steps=50", "cluster.workers_per_node=1",
            "cluster.max_restarts=1", "sweep.retries=1", "optimizer.sparse_lr=interval(0.01,0.5)",
            "hydra/sweeper=optuna", "hydra/sweeper/sampler=random", f"hydra.sweeper.sampler.seed={seed}",
            f"hydra.sweeper.n_trials={TRIALS}", "hydra.sweeper.n_jobs=2", "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2", "hydra.sweeper.direction=[maximize,minimize]",
            "tracking.objective.more_metrics=[eval/ne]", f"tracking.uri={server.url}", f"tracking.experiment={exp}",
            f"hydra.sweep.dir={sweep}"]
    out = (tmp_path / "sweep.out").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "runner", *args], cwd=ROOT, env=env, stdout=out,
                            stderr=subprocess.STDOUT)
    said: List[str] = []
    stop = threading.Event()
    chaos = threading.Thread(target=_chaos, args=(rng, sweep, proc, server, said, stop), daemon=True)
    chaos.start()
    try:
        proc.wait(300)
        stop.set()
        chaos.join(60)
        where = f"RUNNER_CHAOS_SEED={seed}, killed: {', '.join(said)}"
        left = _until(lambda: not processes_tagged(tag), 45, threading.Event())  # each ends by itself (30 s grace)
        assert left, (where, [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in processes_tagged(tag)])
        if server.proc is None:  # the chaos stopped before it started the server again
            server.start()
        said_after = {}
        for command in (["resume", str(sweep)], ["sync", str(sweep)]):
            done = subprocess.run([sys.executable, "-m", "runner", *command], cwd=ROOT, env=env, text=True,
                                  capture_output=True, timeout=300)
            said_after[command[0]] = done.stdout[-4000:]
            assert done.returncode == 0, (where, command[0], done.stdout[-3000:], done.stderr[-3000:])
            assert "Traceback" not in done.stdout + done.stderr, (where, done.stderr[-3000:])
        assert processes_tagged(tag) == [], where

        study = optuna.load_study(study_name="runner", storage=journal_storage(sweep))
        states = [(t.number, t.state.name, t.values) for t in study.trials]  # a failure shows each trial's end
        assert [t.number for t in study.trials] == list(range(TRIALS)), (where, states)
        assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials), \
            (where, states, (tmp_path / "sweep.out").read_text()[-3000:], said_after["resume"])
        found = runs(server.url, exp)
        parents = [r for r in found if r.data.tags.get("runner.kind") == "sweep"]
        assert [p.info.status for p in parents] == ["FINISHED"], (where, [p.info.status for p in parents])
        trials = [r for r in found if r.data.tags.get("runner.kind") == "job"]
        assert all(r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id for r in trials), where
        assert not [r for r in trials if r.info.status == "RUNNING"], where
        finished = {int(r.data.tags["runner.job"]): r for r in trials if r.info.status == "FINISHED"}
        counts = [int(r.data.tags["runner.job"]) for r in trials if r.info.status == "FINISHED"]
        assert sorted(counts) == list(range(TRIALS)), (where, sorted(counts))  # each trial's record once
        assert all(r.info.status in ("KILLED", "FAILED") for r in trials if r not in finished.values()), where
        values = {j: [r.data.metrics[m] for m in OBJECTIVES] for j, r in finished.items()}
        for t in study.trials:  # what the study was told is what the store holds
            assert t.values == pytest.approx(values[t.number]), (where, t.number, t.values, values[t.number])
        front = {j for j, v in values.items() if not any(_dominated(v, w) for w in values.values())}
        kept = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
        assert {f["trial"] for f in kept["pareto_front"]} == front, (where, kept, values)
        assert kept["trials"] == TRIALS and kept["failed"] == 0, (where, kept)
        print(f"chaos ({where}): {TRIALS} trials, {len(trials)} runs ({len(trials) - TRIALS} ended by a kill), "
              f"front {sorted(front)}, {time.monotonic() - t0:.0f} s")
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
        server.stop()
