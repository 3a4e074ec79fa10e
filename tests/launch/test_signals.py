"""Stop signals that land while an elastic agent forks its workers: never a traceback, never lost.

Torch elastic's agent raises ``SignalException`` from its SIGTERM handler; when the signal lands inside
logging's at-fork handler (a worker being forked) Python can only print "Exception ignored" and the raise is
lost. The stress below forks in a loop while another process sends SIGTERM every few milliseconds, with
torch elastic's own handler, once bare (to show the hazard is real here) and once guarded by the runner.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import ROOT

STRESS = textwrap.dedent("""
    import os, random, select, signal, sys, time
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import api
    guarded = sys.argv[1] == "guarded"
    if guarded:
        from runner.runtime import signals
        signals.guard_elastic()
    signal.signal(signal.SIGTERM, api._terminate_process_handler)  # as PContext.start does
    parent, (ack_r, ack_w) = os.getpid(), os.pipe()
    killer = os.fork()
    if killer == 0:  # one SIGTERM at a time; each must come back as a stop within a few seconds
        rng, lost = random.Random(1), 0
        for _ in range(150):
            time.sleep(rng.uniform(0.0005, 0.004))
            os.kill(parent, signal.SIGTERM)
            if select.select([ack_r], [], [], 5.0)[0]:  # the agent's monitor takes 0.5 s; a busy machine more
                os.read(ack_r, 1)
            else:
                lost += 1
                break
        print("lost", lost, flush=True)
        os._exit(0)
    stops, acks = 0, 0
    while True:
        try:  # the ack inside the try: a signal sent once the killer has it lands here too
            while acks < stops:
                acks += 1
                os.write(ack_w, b"x")
            while os.waitpid(killer, os.WNOHANG)[0] == 0:
                child = os.fork()
                if child == 0:
                    os._exit(0)
                os.waitpid(child, 0)
                if guarded:  # the agent's monitoring loop: raises a stop whose first raise was lost
                    try:
                        LocalElasticAgent._monitor_workers(None, None)
                    except AttributeError:  # no worker group here: only the check before it counts
                        pass
            break
        except api.SignalException:
            stops += 1
            if guarded:  # an agent ends at its first stop; this loop goes on, so the stop counts as taken
                signals._guard.received = None
    print("stops", stops)
""")


def _stress(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", STRESS, mode], cwd=ROOT, text=True, capture_output=True,
                          timeout=120)


def test_stop_signal_during_fork_is_raised_without_a_traceback() -> None:
    bare = _stress("bare")  # torch elastic's handler alone: raises lost, tracebacks printed
    assert "Exception ignored" in bare.stderr and "lost 1" in bare.stdout, (bare.stdout, bare.stderr[-2000:])
    guarded = _stress("guarded")  # 150 signals, every one taken as a stop, nothing printed
    assert guarded.returncode == 0, guarded.stderr[-2000:]
    assert guarded.stderr == "", guarded.stderr[-2000:]
    assert "lost 0" in guarded.stdout and "stops 150" in guarded.stdout, guarded.stdout


def test_a_data_workers_thread_errors_go_to_the_log_not_the_terminal(tmp_path) -> None:
    """A DataLoader worker's fd-sharing thread reports an EOFError through ``sys.excepthook`` when its rank
    stops mid-receive; a thread's own uncaught error goes through ``threading.excepthook``: both reach the
    run's log, and the terminal keeps the job's one line."""
    code = textwrap.dedent(f"""
        import logging, sys, threading
        logging.basicConfig(filename={str(tmp_path / 'runner.log')!r}, level=logging.WARNING)
        from runner.runtime.logfile import thread_errors_to_log
        thread_errors_to_log("data-worker0")
        try:
            raise EOFError("peer closed")
        except EOFError:
            sys.excepthook(*sys.exc_info())  # as multiprocessing.resource_sharer does
        def fail():
            raise ConnectionResetError("reset")
        t = threading.Thread(target=fail); t.start(); t.join()
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    log = (tmp_path / "runner.log").read_text()
    assert "EOFError: peer closed" in log and "ConnectionResetError: reset" in log


def test_a_requeued_slurm_job_past_its_retries_does_not_run(monkeypatch, tmp_path) -> None:
    """Slurm requeued the job after a lost node (SLURM_RESTART_COUNT=1) and sweep.retries=0: attempt 2 is
    refused in one line, before anything runs."""
    import pytest
    from conftest import cfg_for

    from runner.config.errors import WorkerFailure
    from runner.launch import schedulers
    from runner.launch.job.hydra_call import _attempts, _Job

    for key, value in {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_NODEID": "1", "SLURM_NNODES": "2",
                       "SLURM_RESTART_COUNT": "1"}.items():
        monkeypatch.setenv(key, value)
    cfg = cfg_for("cluster=2node", "cluster.scheduler=slurm")
    with pytest.raises(WorkerFailure, match=r"Slurm requeued job 77 after it lost a node; sweep.retries=0 allows "
                                            r"1 attempt\(s\), so attempt 2 does not run"):
        scheduler, task = schedulers.task_of(cfg.cluster.scheduler)
        _attempts(_Job(cfg, tmp_path, None, 0, [], task, scheduler=scheduler))


HANGUP = textwrap.dedent("""
    import os, signal, sys
    from runner.runtime import signals
    for sig in (signal.SIGHUP, signal.SIGQUIT):  # as a terminal leaves them (a script's background job ignores them)
        signal.signal(sig, signal.SIG_DFL)
    if sys.argv[1] == "nohup":
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it
    signals.install()
    for sig in (signal.SIGHUP, signal.SIGQUIT):
        try:
            os.kill(os.getpid(), sig)
            for _ in range(1000):
                signals.check()
            print(sig.name, "ignored")
        except signals.Stopped as exc:
            signals.stopped(exc)
            print(sig.name, "stopped", exc.name, exc.exit_code)
""")


def test_a_closed_terminal_or_sigquit_stops_the_job_as_sigterm_does_unless_nohup() -> None:
    """SIGHUP (a closed terminal) and SIGQUIT become the same :class:`Stopped` as SIGTERM (the job ends KILLED
    with exit 128 + the signal, as ``test_driver_signal_ends_run_killed`` shows for SIGTERM); under ``nohup`` the
    driver keeps SIGHUP ignored and the job goes on."""
    plain = subprocess.run([sys.executable, "-c", HANGUP, "plain"], cwd=ROOT, text=True, capture_output=True,
                           timeout=60)
    assert plain.stdout.split("\n")[:2] == ["SIGHUP stopped SIGHUP 129", "SIGQUIT stopped SIGQUIT 131"], plain
    nohup = subprocess.run([sys.executable, "-c", HANGUP, "nohup"], cwd=ROOT, text=True, capture_output=True,
                           timeout=60)
    assert nohup.stdout.split("\n")[:2] == ["SIGHUP ignored", "SIGQUIT stopped SIGQUIT 131"], nohup


ENDING = textwrap.dedent("""
    import os, signal, sys, time, weakref
    from torch.distributed.elastic.multiprocessing import api
    from runner.runtime import signals
    from runner.runtime.process_end import exit_now
    signals.guard_elastic()
    signal.signal(signal.SIGTERM, api._terminate_process_handler)  # as PContext.start does
    class Held:
        pass
    held, (r, w) = Held(), os.pipe()
    def slow():  # a library's finalizer that takes a while at exit (torch's ~300 libraries, SQLAlchemy's pool)
        os.write(w, b"x")
        time.sleep(1.0)
        print("finalized", flush=True)
    weakref.finalize(held, slow)
    if os.fork() == 0:  # the driver stopping the job just as the agent ends after its workers failed
        os.read(r, 1)
        os.kill(os.getppid(), signal.SIGTERM)
        os._exit(0)
    exit_now(1)
""")


def test_a_stop_signal_while_an_agent_ends_prints_no_traceback() -> None:
    """An agent whose workers failed ends while the driver (its own write to the full run folder failed too) stops
    it: the SIGTERM lands in a finalizer run at exit, where a raise is printed as a traceback (CI, 2026-11-29, the
    full run folder test). The agent ends with its own status, its finalizers whole, nothing printed."""
    done = subprocess.run([sys.executable, "-c", ENDING], cwd=ROOT, text=True, capture_output=True, timeout=120)
    assert done.returncode == 1 and done.stderr == "", done.stderr[-2000:]
    assert done.stdout == "finalized\n", done.stdout
