"""No process outlives the one that started it: agents die with their driver, workers with their agent.

An agent runs in its own session (so that one signal stops it and its workers), which also means that
nothing stops it when its driver dies by SIGKILL (the OOM killer, ``kill -9``). Each child therefore asks
the kernel for a parent-death signal (Linux ``prctl(PR_SET_PDEATHSIG)``), then checks that its parent is
still the one it expected (it may have died before the request); where the kernel offers no such signal,
a daemon thread watches the parent's pid instead.

A process that has done its work ends at once (:func:`exit_now`): tearing down torch's and TorchRec's
modules at interpreter exit takes about a second per process, paid by the agent and the driver of every
job, one after the other (docs/benchmarks.md, "Figures behind the code's choices").
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, List, NoReturn, Optional, Tuple

from runner.config.errors import WorkerFailure
from runner.runtime import signals

PR_SET_PDEATHSIG = 1
WATCH_S = 1.0  # the fallback's polling interval
DRIVER_PID = "RUNNER_DRIVER_PID"  # set by the driver for its agents
AGENT_PID = "RUNNER_AGENT_PID"  # set by an agent for its workers
SWEEP_PID = "RUNNER_SWEEP_PID"  # set by a sweep's process for the pool's processes that run its points
_SWEEP_WATCHED: List[int] = []


def _request_death_signal(sig: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def _watch(parent: int, sig: int) -> None:
    while True:
        time.sleep(WATCH_S)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)


def die_with_parent(env_var: str, sig: int = signal.SIGKILL) -> None:
    """End this process with ``sig`` when its parent dies. The parent is the pid in ``env_var`` when set
    (what the parent said it is: this process may have been orphaned before it got here), else the
    current parent."""
    expected: Optional[str] = os.environ.get(env_var)
    parent = int(expected) if expected and expected.isdigit() else os.getppid()
    armed = _request_death_signal(sig)
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), sig)
    if not armed:
        threading.Thread(target=_watch, args=(parent, sig), name="parent-watch", daemon=True).start()


def end_with_sweep(sig: int = signal.SIGTERM, grace_s: float = 30.0) -> None:
    """In a pool's process running a sweep's points (joblib's worker, a child of the sweep's process): ``sig`` to this
    process once the sweep's process is gone (a SIGKILL, the OOM killer), so that the point it runs ends KILLED and
    the process with it (SIGKILL ``grace_s`` later where it is still there); elsewhere nothing. Polled, not the
    kernel's parent-death signal: that follows the thread that started the process, and the pool is started by
    threads of the sweep's process that end before it does."""
    expected = os.environ.get(SWEEP_PID, "")
    if _SWEEP_WATCHED or not expected.isdigit() or int(expected) == os.getpid() or os.getppid() != int(expected):
        return
    sweep = int(expected)
    _SWEEP_WATCHED.append(sweep)

    def watch() -> None:
        while os.getppid() == sweep:
            time.sleep(WATCH_S)
        os.kill(os.getpid(), sig)
        time.sleep(grace_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="sweep-watch", daemon=True).start()


def exit_now(code: object) -> NoReturn:
    """End this process as ``sys.exit(code)`` would, without the interpreter's teardown of every module:
    threads are ended and joined and exit handlers run (logging's flush, the prewarmed agent's stop) as at
    a normal exit, then the streams are flushed and the process ends."""
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): the message on stderr, status 1
        print(code, file=sys.stderr)
        code = 1
    signals.ending()  # a stop signal from here on (the driver stopping an agent that failed) raises nowhere
    # as the interpreter ends: threading's exit hooks (e.g. concurrent.futures and joblib stop their worker
    # pools), then the other threads joined, then the exit handlers
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None and threading.current_thread() is threading.main_thread():
        shutdown()
    atexit._run_exitfuncs()
    _flush_output()
    os._exit(code)


def _flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (e.g. `| head`): nothing more can be said there
            stream.flush()


def fork_helper(work: Callable[[], None], env_var: str = "RUNNER_PLAN_HELPER_PARENT") -> int:
    """Fork a helper that runs ``work()`` and ends (status 0, or 1 where it raised: the caller then does the work
    itself): Ctrl-C and SIGTERM at their defaults, ended when this process dies (:func:`die_with_parent`), no
    interpreter teardown. The helper's pid, in this process; raises ``OSError`` where the fork fails."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            die_with_parent(env_var)
            work()
        except BaseException:  # noqa: BLE001  (the caller does what the helper did not)
            code = 1
        finally:
            os._exit(code)
    return pid


def reap(pid: int, kill: bool = False) -> None:
    """Wait for the helper ``pid`` to end (``kill``: SIGKILL it first: it is done, or given up on)."""
    if kill:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def give_up(pid: int, fd: int) -> None:
    """A :func:`fork_answer` process whose answer is no longer wanted: its pipe closed, it killed and reaped."""
    os.close(fd)
    reap(pid, kill=True)


_PARTING: List[Any] = []  # in a fork_answer process: what it made, dropped by its os._exit, not freed one by one


def keep_until_exit(*objects: Any) -> None:
    """In a process of :func:`fork_answer` (it ends with ``os._exit``), keep ``objects`` to its end, so that
    freeing them (a chosen plan's millions of shards: seconds) does not delay its answer; elsewhere nothing."""
    if _PARTING:
        _PARTING.extend(objects)


def fork_answer(work: Callable[[], Any], env_var: str = "RUNNER_PLAN_HELPER_PARENT") -> Tuple[int, int]:
    """Fork a process that does ``work()`` and sends back its value, or the exception it raised with its traceback,
    then ends, whatever happens (no interpreter teardown; stop signals at their defaults, those ignored here left
    ignored; ended when this process dies); ``(pid, fd)`` for :func:`answer_of`. Raises ``OSError`` where the fork
    fails (nothing left open)."""
    _flush_output()  # nothing buffered here is written twice
    read, write = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read)
        os.close(write)
        raise
    if pid == 0:
        try:
            _PARTING.append(None)  # (this process keeps what it is asked to: keep_until_exit)
            os.close(read)
            for sig in signals.STOP_SIGNALS:  # at their defaults, but one this process ignores (nohup) stays so
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    signal.signal(sig, signal.SIG_DFL)
            die_with_parent(env_var)
            try:
                answer: Tuple[Any, ...] = ("value", work())
            except BaseException as exc:  # noqa: BLE001 - raised again in the parent
                answer = ("raised", exc, traceback.format_exc())
            try:
                data = pickle.dumps(answer)
            except Exception as exc:  # noqa: BLE001 - what does not pickle: its type and line
                what, where = (answer[1], answer[2]) if answer[0] == "raised" else (exc, traceback.format_exc())
                data = pickle.dumps(("raised", RuntimeError(f"{type(what).__name__}: {what}"), where))
            _flush_output()  # a closed pipe (`| head`) must not keep this process going
            with os.fdopen(write, "wb") as pipe:  # its length first: a fork of this process may hold the pipe open
                pipe.write(len(data).to_bytes(8, "little") + data)
        finally:
            os._exit(0)
    os.close(write)
    return pid, read


def helper_answer(pid: int, fd: int, meanwhile: Callable[[], None], name: str) -> Optional[Any]:
    """:func:`answer_of` for a helper whose work this process does itself where it gives none: its value, or None
    where it failed, died or was stopped alone (a stop of this process is raised)."""
    try:
        return answer_of(pid, fd, meanwhile, name=name)
    except signals.Stopped:
        if signals.received() is not None:
            raise
        return None
    except Exception:  # noqa: BLE001 - its failure is this process's work to do
        return None


def answer_of(pid: int, fd: int, meanwhile: Callable[[], None], every_s: float = 0.05, name: str = "the process"
              ) -> Any:
    """The value the process of :func:`fork_answer` sent, or its exception raised here (its traceback in a note),
    calling ``meanwhile()`` every ``every_s`` while it works; the process reaped (killed first where this ends
    before it: ``meanwhile`` raised, a stop). Where it ended with no answer: :class:`signals.Stopped` for a stop
    signal, else :class:`WorkerFailure` naming it (``name``) and how it ended."""
    data, status = bytearray(), None

    def whole() -> bool:  # its length, then that many bytes
        return len(data) >= 8 and len(data) >= 8 + int.from_bytes(data[:8], "little")

    try:
        with os.fdopen(fd, "rb", buffering=0) as pipe:
            while not whole():
                signals.check()
                if select.select([pipe], [], [], every_s)[0]:
                    chunk = pipe.read(1 << 20)
                    if not chunk:
                        break
                    data += chunk
                else:
                    meanwhile()
        _, status = os.waitpid(pid, 0)
    finally:
        if status is None:
            reap(pid, kill=True)
    if not whole():
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) in signals.STOP_SIGNALS:
            raise signals.Stopped(os.WTERMSIG(status))
        raise WorkerFailure(f"{name} (pid {pid}) ended with no answer: {_ended_how(status)}", fault=True)
    try:
        answer = pickle.loads(bytes(data[8:]))
    except Exception as exc:  # noqa: BLE001 - e.g. an exception whose arguments do not make it again
        raise RuntimeError(f"{name} (pid {pid}) sent an answer that does not load here: {exc}") from None
    if answer[0] == "value":
        return answer[1]
    raised: BaseException = answer[1]
    raised.add_note(f"(raised in process {pid}:)\n{answer[2].rstrip()}")
    raise raised


def _ended_how(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status))
        return f"killed by {sig.name}" + (" (the out-of-memory killer, or kill -9)" if sig == signal.SIGKILL else "")
    return f"exit status {os.waitstatus_to_exitcode(status)}"
