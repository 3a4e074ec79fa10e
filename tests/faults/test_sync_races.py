"""``runner sync`` racing the processes that deliver the same run folders: the sweep itself, and its resume.

Against a real ``mlflow server`` on 127.0.0.1 that is away as the sweep begins (its runs are kept in the sweep
folder): syncs started while the spooled sweep still trains, and while ``runner resume`` of it runs, leave the
store with each run once (one parent, each point once, its child) and each metric of each event log once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest
from conftest import FAST, ROOT, MlflowServer
from test_faults import Job, descendants, wait_gone
from test_tracking_outage import _each_once, _syncs_at_once, _text

pytestmark = [pytest.mark.slow, pytest.mark.faults]


RACE_WITHIN_S = 600  # the raced sweep or resume ends in about a minute here; past this it waits on something


def _syncs_while(proc: subprocess.Popen, sweep: Path, logs: Path, start: Callable[[], bool] = lambda: True) -> list:
    """Two ``runner sync`` of ``sweep`` at once, again and again from when ``start()`` until ``proc`` ends (at most
    :data:`RACE_WITHIN_S`: then the test fails, naming what each sync said last); each one's code and output."""
    deadline = time.monotonic() + RACE_WITHIN_S
    while not start() and proc.poll() is None:
        time.sleep(0.01)
    done: list = []
    while proc.poll() is None:
        assert time.monotonic() < deadline, (f"still running after {RACE_WITHIN_S} s beside the syncs; their last "
                                             f"words: {[text[-500:] for _, text in done[-2:]]}")
        done += _syncs_at_once([sweep, sweep], logs)
        time.sleep(0.2)  # a core left to the process raced
    return done


def _no_damage(synced: list) -> None:
    """Each sync ended in its own time, without a traceback; an error is only a point not started yet, or the store
    not up yet."""
    for code, text in synced:
        assert code in (0, 1) and "Traceback" not in text and "unexpected" not in text, text[-3000:]
        errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
        assert all("not a run folder of the runner" in ln or "still unreachable" in ln for ln in errors), errors


def test_a_sync_while_the_spooled_sweep_trains(tmp_path: Path) -> None:
    """Issue 79, item 1: a training sweep begun while its store is away; the server comes up while the first point
    trains, and pairs of syncs run until the sweep ends (each point's driver delivers its own folder meanwhile, and
    the sweep keeps its parent's ending): after one more sync, each run is once in the store, each metric once."""
    server = MlflowServer(tmp_path / "server")
    sweep, exp = tmp_path / "sweep", "sync_while_sweeping"
    short = [a for a in FAST if not a.startswith("train.steps=")]
    job = Job(tmp_path / "job", server.url, exp, ["-m", *short, "train.steps=2500,200", "cluster.workers_per_node=1",
                                                   f"hydra.sweep.dir={sweep}"])
    job.until(lambda: "unreachable" in job.out.read_text(), 180)  # the sweep began without its store
    up = threading.Thread(target=server.start)  # 15-30 s here: the syncs meanwhile find it away, then back
    up.start()
    try:
        t0 = time.monotonic()
        tree = descendants(job.proc.pid)
        synced = _syncs_while(job.proc, sweep, tmp_path)
        up.join()
        assert job.finish(10) == 0, job.err.read_text()[-3000:]
        assert wait_gone(tree, 10) == []
        _no_damage(synced)
        delivered = [text for code, text in synced if "reports delivered to MLflow run" in text]
        assert delivered, "no sync delivered while the sweep ran"
        from runner.track.sync import sync

        assert sync([str(sweep)]) == 0  # the parent's ending, which the sweep kept
        found = _each_once(server.url, exp, sweep, ["steps=200", "steps=2500"])
        assert all(r.info.status == "FINISHED" for r in found)
        print(f"sync while sweeping: {len(synced)} syncs in {time.monotonic() - t0:.0f}s ({len(delivered)} "
              f"delivering); {len(found)} runs, each once")
    finally:
        server.stop()
        if job.proc.poll() is None:
            job.proc.kill()


def test_a_sync_while_the_sweep_is_resumed(tmp_path: Path) -> None:
    """Issue 79, item 1: a plan-only sweep spooled while its store was away, then ``runner resume`` of it with the
    server up and pairs of syncs until the resume ends: the resume and a sync both reach the kept parent (before,
    each created one: two parents, the points under one of them); one parent, each point once, each metric once."""
    server = MlflowServer(tmp_path / "server")
    sweep, exp = tmp_path / "sweep", "sync_while_resuming"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    first = subprocess.run([sys.executable, "-m", "runner", "-m", "mode=plan", "cluster.cross_node_bandwidth=3,12,50",
                            f"tracking.uri={server.url}", f"tracking.experiment={exp}", f"hydra.sweep.dir={sweep}"],
                           cwd=ROOT, env=env, text=True, capture_output=True, timeout=300)
    assert first.returncode == 0 and "python -m runner sync" in first.stdout, first.stderr[-3000:]
    server.start()
    resume = None
    try:
        out = (tmp_path / "resume.out").open("w")
        resume = subprocess.Popen([sys.executable, "-m", "runner", "resume", str(sweep)], cwd=ROOT, env=env,
                                  stdout=out, stderr=subprocess.STDOUT, text=True)
        # the first syncs as the resume takes the sweep folder, just before it opens the parent: the race's moment
        synced = _syncs_while(resume, sweep, tmp_path, lambda: str(resume.pid) in _text(sweep / ".runner.lock"))
        text = (tmp_path / "resume.out").read_text()
        assert resume.wait(10) == 0 and "Traceback" not in text, text[-3000:]
        _no_damage(synced)
        from runner.track.sync import sync

        assert sync([str(sweep)]) == 0
        found = _each_once(server.url, exp, sweep, ["xbw=12.0", "xbw=3.0", "xbw=50.0"])
        parent = next(r for r in found if r.data.tags.get("runner.kind") == "sweep")
        assert parent.data.metrics["sweep/points"] == 3
        print(f"sync while resuming: {len(synced)} syncs; {len(found)} runs, each once")
    finally:
        server.stop()
        if resume is not None and resume.poll() is None:
            resume.kill()
