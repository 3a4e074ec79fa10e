"""The tracking server dies mid-run: training goes on, nothing it would have logged is lost.

Against a real ``mlflow server`` killed with SIGKILL while a job trains and started again later (on the
same port and store): reports made meanwhile reach the run, with their original steps and times, either
when the driver sees the server back, or with ``python -m runner sync`` after the job ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FAST, ROOT, MlflowServer, forkserver, runs, to_the_background
from test_faults import Job

pytestmark = [pytest.mark.slow, pytest.mark.faults]


def kept_points(run_folder: Path, key: str) -> dict:
    """step -> unix ms of ``key`` in rank 0's event log: what the store must hold."""
    events = [json.loads(line) for line in (run_folder / "events.jsonl").read_text().splitlines()]
    return {e["step"]: e["time"] for e in events if e["kind"] == "metrics" and key in e["metrics"]}


def stored_points(url: str, run_id: str, key: str) -> dict:
    from mlflow.tracking import MlflowClient

    return {m.step: m.timestamp for m in MlflowClient(url).get_metric_history(run_id, key)}


def test_server_outage_mid_run_and_after_the_end(tmp_path: Path) -> None:
    """Two jobs against one server, which dies while both train: one (``live``) goes on until the server is
    back and delivers its backlog; the other (``late``) ends while the server is away, keeps its ending, and
    ``python -m runner sync`` delivers it once the server is back."""
    server = MlflowServer(tmp_path / "server")
    server.start()
    try:
        one = [*FAST, "train.log_every=5", "cluster.workers_per_node=1"]  # a core left for the server's restart
        live = Job(tmp_path / "live", server.url, "outage", [*one, "train.steps=100000"])
        late_steps = 600  # enough that it cannot end (and deliver its ending) before the kill below
        late = Job(tmp_path / "late", server.url, "outage_end", [*one, f"train.steps={late_steps}"])
        live.wait_for("delivered.json")
        late.wait_for("delivered.json")
        server.stop(signal.SIGKILL)
        # it trains until the server is back
        to_the_background(int((live.run_folder / "pids" / "rank0.pid").read_text()))
        # 1. the server stays away until ``late`` ended: its ending is kept, with one sync command to deliver it
        assert late.finish(120) == 0, late.err.read_text()[-2000:]  # training finished: exit 0
        out = late.out.read_text()
        assert "tracking pending" in out and f"python -m runner sync {late.run_folder}" in out, out[-2000:]
        # 2. the server is back while ``live`` trains: its driver delivers the backlog
        restart_s = server.start()
        deadline = time.monotonic() + 120
        while f"{server.url} is back" not in live.out.read_text():
            assert live.proc.poll() is None and time.monotonic() < deadline, live.out.read_text()[-2000:]
            time.sleep(0.5)
        time.sleep(3)  # a few more reports after the outage
        live.proc.send_signal(signal.SIGTERM)
        assert live.finish() == 143
        out = live.out.read_text()
        assert out.count("unreachable (") == 1 and out.count(f"{server.url} is back") == 1, out[-3000:]
        assert "Retrying" not in out + live.err.read_text()
        (run,) = runs(server.url, "outage")
        assert run.info.status == "KILLED"
        if len(os.sched_getaffinity(0)) > 1:  # one worker takes every core: the prewarmed agent's torch (loaded
            assert run.data.tags["runner.agent_prewarmed"] == "false"  # for the default's two) is not used
        want = kept_points(live.run_folder, "train/loss")
        got = stored_points(server.url, run.info.run_id, "train/loss")
        assert got == want and len(want) > 10  # every point, at the step and time rank 0 measured it

        (run,) = runs(server.url, "outage_end")
        before = len(stored_points(server.url, run.info.run_id, "train/loss"))
        assert run.info.status == "RUNNING"
        sync = subprocess.run([sys.executable, "-m", "runner", "sync", str(late.run_folder)], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert sync.returncode == 0, sync.stderr
        (run,) = runs(server.url, "outage_end")
        want = kept_points(late.run_folder, "train/loss")
        got = stored_points(server.url, run.info.run_id, "train/loss")
        assert run.info.status == "FINISHED" and got == want and len(want) == late_steps // 5
        assert "eval/auc" in run.data.metrics
        print(f"outage: server back after {restart_s:.0f}s, {len(kept_points(live.run_folder, 'train/loss'))} "
              f"points all stored; after the end: {before} stored before sync, {len(got)} after")
    finally:
        server.stop()


def _spooled_copy(sweep: Path, to: Path, experiment: str) -> None:
    """A second spooled sweep from ``sweep`` without running one more sweep: its folder copied, each kept run's
    record (``run.json``'s ``pending``) pointed at ``experiment`` with a record id of its own (the id a sync
    finds an earlier creation by), so that its runs are not the first sweep's."""
    import shutil
    import uuid

    shutil.copytree(sweep, to)
    for info_path in to.glob("*/run.json"):
        info = json.loads(info_path.read_text())
        info["pending"]["experiment"] = experiment
        info["pending"]["tags"]["runner.record_id"] = uuid.uuid4().hex
        info_path.write_text(json.dumps(info))


def _sync_in_child(folder: str, go: object, out: str) -> None:
    """One ``runner sync`` as a process of its own (from the fork server: no second import of the stack), its output
    in ``out``, started when ``go`` is set so that every sync of the race starts at the same moment."""
    from runner.cli import _sync

    sys.stdout = sys.stderr = open(out, "w", buffering=1)  # pytest's capture replaced them with its own
    go.wait(60)  # type: ignore[attr-defined]
    code = _sync([folder])
    sys.stdout.flush()
    os._exit(code)


SYNC_WITHIN_S = 120  # a sync of these few runs takes seconds; past this it hung, and is stopped


def _syncs_at_once(folders: list, logs: Path) -> list:
    """``runner sync`` of each of ``folders`` (a folder named n times: n syncs of it), all at once; each one's
    exit code and output (a sync still running after :data:`SYNC_WITHIN_S` is killed: its code is then None).

    Forked by the fork server (conftest's :func:`forkserver`), never by this process: in a whole suite a sync forked
    from here hung holding a point's delivery lock, and the sweep it raced waited for that lock until the suite's
    time ran out."""
    ctx = forkserver()
    go = ctx.Event()
    outs = [logs / f"sync{len(folders)}_{i}.out" for i in range(len(folders))]
    procs = [ctx.Process(target=_sync_in_child, args=(str(f), go, str(o))) for f, o in zip(folders, outs, strict=True)]
    for p in procs:
        p.start()
    go.set()
    deadline = time.monotonic() + SYNC_WITHIN_S
    for p in procs:
        p.join(max(deadline - time.monotonic(), 0.1))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)
    return [(p.exitcode if p.exitcode is not None and p.exitcode >= 0 else None,
             _text(o) + (f"\n[test] sync killed after {SYNC_WITHIN_S} s" if p.exitcode is None or p.exitcode < 0
                         else "")) for p, o in zip(procs, outs, strict=True)]


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _each_once(url: str, experiment: str, sweep: Path,
               points: tuple = ("xbw=12.0", "xbw=3.0", "xbw=50.0")) -> list:
    """Every run of the spooled ``sweep`` in ``experiment`` exactly once (one parent, each of ``points`` (run names)
    once, a child of it), FINISHED, and each metric value of each point's event log stored once (no step twice);
    its runs."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(url)
    found = runs(url, experiment)
    parents = [r for r in found if r.data.tags.get("runner.kind") == "sweep"]
    names = sorted(r.info.run_name for r in found if r not in parents)
    assert len(parents) == 1 and names == sorted(points), [r.info.run_name for r in found]
    assert all(r.info.status == "FINISHED" for r in found)
    assert all(r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id for r in found if r not in parents)
    for point in [*sweep.glob("[0-9]*"), sweep / "parent"]:
        run_id = json.loads((point / "run.json").read_text())["run_id"]
        kept = [(k, e["step"]) for e in map(json.loads, (point / "events.jsonl").read_text().splitlines())
                if e["kind"] == "metrics" for k in e["metrics"]]
        stored = [(k, m.step) for k in {k for k, _ in kept} for m in client.get_metric_history(run_id, k)]
        assert sorted(stored) == sorted(kept), point
    return found


def test_a_sweep_started_while_its_store_is_down_keeps_its_parent(tmp_path: Path) -> None:
    """Issue 47, item 5: a plan-only sweep whose server is down as it starts says so once (no Hydra warning), writes
    its report from the points, ends with one sync command for the sweep; after the server is up, that sync creates
    the parent with every point as its child, exactly once (a second sync changes nothing).

    Issue 79, item 1: two syncs of the sweep at once, and three of a second spooled sweep at once, take turns on
    each run folder (before, two at once made 12 runs of 6 here, and one of them failed with a traceback): the
    store holds each run once and each metric once, and a sync that waited says so in one line."""
    from mlflow.tracking import MlflowClient

    server = MlflowServer(tmp_path / "server")  # its port, before it runs
    sweep = tmp_path / "sweep"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([sys.executable, "-m", "runner", "-m", "mode=plan", "cluster.cross_node_bandwidth=3,12,50",
                           f"tracking.uri={server.url}", "tracking.experiment=down_at_start",
                           f"hydra.sweep.dir={sweep}"], cwd=ROOT, env=env, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "Warning" not in out + proc.stderr and "raised TrackingError" not in out + proc.stderr
    assert out.count("unreachable (") == 1 and f"python -m runner sync {sweep}/" not in out, out[-3000:]
    assert out.strip().splitlines()[-1].endswith(f"deliver them with: python -m runner sync {sweep}"), out[-1000:]
    assert (sweep / "report" / "report.md").exists() and (sweep / "report" / "points.csv").exists()
    _spooled_copy(sweep, tmp_path / "sweep3", "down_at_start_3")
    server.start()
    try:
        t0 = time.monotonic()
        synced = _syncs_at_once([sweep, sweep], tmp_path)
        two_s = time.monotonic() - t0
        t0 = time.monotonic()
        synced3 = _syncs_at_once([tmp_path / "sweep3"] * 3, tmp_path)
        three_s = time.monotonic() - t0
        for code, text in synced + synced3:
            assert code == 0 and "4 of 4 runs complete" in text and "Traceback" not in text, text[-3000:]
            assert text.count("waiting for it to finish") <= 1, text  # one line per sync, however many folders
        from runner.track.sync import sync

        assert sync([str(sweep)]) == 0  # again: nothing left, nothing made twice
        client = MlflowClient(server.url)
        found = _each_once(server.url, "down_at_start", sweep)
        _each_once(server.url, "down_at_start_3", tmp_path / "sweep3")
        parent = next(r for r in found if r.data.tags.get("runner.kind") == "sweep")
        assert parent.info.status == "FINISHED" and parent.data.metrics["sweep/points"] == 3
        assert "report" in [a.path for a in client.list_artifacts(parent.info.run_id)]
        assert json.loads((sweep / "sweep.json").read_text())["parent_run_id"] == parent.info.run_id
        print(f"syncs at once: 2 in {two_s:.1f}s, 3 in {three_s:.1f}s; 4 runs each in the store")
    finally:
        server.stop()
