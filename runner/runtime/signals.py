"""Ctrl-C, SIGTERM, SIGHUP and SIGQUIT in the driver: a :class:`Stopped` raised where it is safe to stop.

``scancel``, ``timeout`` and container stops send SIGTERM; a terminal's Ctrl-C sends SIGINT; a closed terminal
SIGHUP; Ctrl-backslash SIGQUIT. Each becomes
:class:`Stopped` (a ``KeyboardInterrupt``) carrying the signal, so that the job ends KILLED with exit code
128 + the signal's number. A write to the MLflow store runs :func:`uninterrupted`: a signal that arrives
meanwhile is raised when the write is done, never inside it (a write cut in the middle can leave the
embedded SQLite store locked, and the run's final status unwritten).

A raise from a signal handler can be lost: Python runs the handler at the next bytecode of the main thread,
and when that bytecode belongs to a finalizer or a weakref callback (a garbage collection inside SQLAlchemy,
say) the interpreter prints "Exception ignored" and carries on. So every signal is also recorded, and the
driver's waiting loops call :func:`check`, which raises it again until a handler has taken it
(:func:`stopped`).

Torch elastic's agents raise its ``SignalException`` from their handler in the same way, and fork their
workers with logging's at-fork handlers running (a raise there is lost and can leave logging's lock held).
:func:`guard_elastic` records those signals too, holds them across a fork, keeps a lost raise off the
terminal, and raises it again from the agent's monitoring loop; the workers it forks take the signals'
default action (they end at once, quietly, as spawned workers do).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any, Iterator, Optional


class Stopped(KeyboardInterrupt):
    """The job was stopped by ``signum`` (SIGINT: Ctrl-C; SIGTERM: scancel, timeout, a container stop)."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    def __reduce__(self) -> tuple:  # made again from its number (its args hold the name)
        return (Stopped, (self.signum,))

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def stopped(exc: BaseException) -> Stopped:
    """``exc`` as a :class:`Stopped` (a plain ``KeyboardInterrupt`` is Ctrl-C's SIGINT); the signal counts
    as taken from here on (:func:`check` no longer raises it)."""
    _guard.received = None
    return exc if isinstance(exc, Stopped) else Stopped(signal.SIGINT)


class _Guard:
    depth = 0
    pending: Optional[int] = None  # arrived during an uninterrupted write: raised after it
    received: Optional[int] = None  # arrived and not yet taken by a handler (see check)
    lost: Optional[int] = None  # an elastic agent's stop whose raise was lost (see guard_elastic)
    ending = False  # the process is running its exit handlers (see ending)
    stops_while_ending = 0


_guard = _Guard()


def ending() -> None:
    """This process is ending (its exit handlers run, then it exits): a stop signal from here on is not raised, as
    a raise inside a library's finalizer would be printed as a traceback and cut the finalizer short (the driver
    stops an agent that is already ending after a failure). A second stop signal ends the process at once."""
    _guard.ending = True


def _while_ending(signum: int) -> bool:
    """True when the process is ending: the signal is taken here (see :func:`ending`)."""
    if not _guard.ending:
        return False
    _guard.stops_while_ending += 1
    if _guard.stops_while_ending > 1:
        os._exit(128 + signum)
    return True


def _on_signal(signum: int, frame: Any) -> None:  # Python runs it in the main thread
    if _while_ending(signum):
        return
    _guard.received = signum
    if _guard.depth > 0:
        _guard.pending = signum  # raised when the write in progress is done
        return
    raise Stopped(signum)


def received() -> Optional[str]:
    """The name of a Ctrl-C or SIGTERM this process got and no handler has taken yet (None: none)."""
    return None if _guard.received is None else signal.Signals(_guard.received).name


def check() -> None:
    """Raise :class:`Stopped` for a signal whose first raise was lost (see the module's doc)."""
    if _guard.received is not None and _guard.depth == 0 and threading.current_thread() is threading.main_thread():
        raise Stopped(_guard.received)


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}


class _Fork:
    under_way = False  # between the before- and after-fork handlers: a raise there would be lost


def _enter_fork() -> None:  # registered last, so it runs before logging's handler takes its lock
    _Fork.under_way = True
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def _leave_fork() -> None:  # in the parent; registered last, so it runs after logging's handler
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    _Fork.under_way = False


def _start_worker() -> None:
    """In a forked worker: stop signals end it at once, quietly, as in a spawned one (the agent's handler,
    inherited, would raise wherever the worker happens to be, even before its first line, and print a
    traceback); then the signals held across the fork arrive."""
    for sig in STOP_SIGNALS:
        try:
            signal.signal(sig, signal.SIG_DFL)
        except ValueError:  # forked from a thread other than the main one: nothing to reset there
            break
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    _Fork.under_way = False


def guard_elastic() -> None:
    """Make torch elastic's stop signals safe in this agent: the first is raised as torch elastic raises it
    (later ones, while the agent stops, are not: a raise inside its shutdown would cut it short), none is
    raised while the process forks a worker, a raise Python lost (printed as "Exception ignored") is kept off
    the terminal and raised again by the agent's monitoring loop, and forked workers end quietly on a stop
    signal (the default action), as spawned ones do."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import api

    def stop(signum: int) -> BaseException:
        return api.SignalException(f"Process {os.getpid()} got signal: {signal.Signals(signum)}",
                                   sigval=signal.Signals(signum))

    def on_signal(signum: int, frame: Any) -> None:
        if _while_ending(signum):
            return
        if _guard.received is not None:  # the agent is stopping already (or will at its next check)
            return
        _guard.received = signum
        if _Fork.under_way:  # raised by the monitoring loop instead
            _guard.lost = signum
            return
        raise stop(signum)

    def monitor_then_check(self: LocalElasticAgent, worker_group: Any) -> Any:
        if _guard.lost is not None:  # the handler's raise was lost: stop now, as the raise would have
            signum, _guard.lost = _guard.lost, None
            raise stop(signum)
        return monitor(self, worker_group)

    api._terminate_process_handler = on_signal  # PContext.start installs it by this name
    monitor = LocalElasticAgent._monitor_workers
    LocalElasticAgent._monitor_workers = monitor_then_check
    os.register_at_fork(before=_enter_fork, after_in_parent=_leave_fork, after_in_child=_start_worker)
    _quiet_unraisable((Stopped, api.SignalException))


def _quiet_unraisable(kinds: tuple) -> None:
    hook = sys.unraisablehook
    base = getattr(hook, "runner_base", hook)

    def unraisable(info: sys.UnraisableHookArgs) -> None:  # a stop signal lost in a finalizer: raised again elsewhere
        if isinstance(info.exc_value, kinds):
            _guard.lost = getattr(info.exc_value, "signum", None) or int(getattr(info.exc_value, "sigval", 0)) or None
        else:
            base(info)
    unraisable.runner_base = base  # type: ignore[attr-defined]
    sys.unraisablehook = unraisable


def install() -> None:
    """Route SIGINT, SIGTERM, SIGHUP (a closed terminal) and SIGQUIT to :class:`Stopped` (in the main thread of
    the driver). A SIGHUP or SIGQUIT the user chose to ignore (``nohup``) stays ignored: the job goes on."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            if sig in (signal.SIGHUP, signal.SIGQUIT) and signal.getsignal(sig) == signal.SIG_IGN:
                continue
            signal.signal(sig, _on_signal)
        _quiet_unraisable((Stopped,))  # check() raises it again


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Run the block whole: a Ctrl-C or SIGTERM meanwhile is raised as :class:`Stopped` after it. Only the
    main thread's blocks count: signals are taken there, and another thread's write must not hold them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _guard.depth += 1
    try:
        yield
    finally:
        _guard.depth -= 1
        if _guard.depth == 0 and _guard.pending is not None:
            signum, _guard.pending = _guard.pending, None
            raise Stopped(signum)
