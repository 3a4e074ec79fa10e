"""Ctrl-C and SIGTERM in the driver: a :class:`Stopped` raised where it is safe to stop.

``scancel``, ``timeout`` and container stops send SIGTERM; a terminal's Ctrl-C sends SIGINT. Both become
:class:`Stopped` (a ``KeyboardInterrupt``) carrying the signal, so that the job ends KILLED with exit code
128 + the signal's number. A write to the MLflow store runs :func:`uninterrupted`: a signal that arrives
meanwhile is raised when the write is done, never inside it (a write cut in the middle can leave the
embedded SQLite store locked, and the run's final status unwritten).

A raise from a signal handler can be lost: Python runs the handler at the next bytecode of the main thread,
and when that bytecode belongs to a finalizer or a weakref callback (a garbage collection inside SQLAlchemy,
say) the interpreter prints "Exception ignored" and carries on. So every signal is also recorded, and the
driver's waiting loops call :func:`check`, which raises it again until a handler has taken it
(:func:`stopped`).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any, Iterator, Optional


class Stopped(KeyboardInterrupt):
    """The job was stopped by ``signum`` (SIGINT: Ctrl-C; SIGTERM: scancel, timeout, a container stop)."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

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


_guard = _Guard()


def _on_signal(signum: int, frame: Any) -> None:  # Python runs it in the main thread
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


def _quiet_lost_raise(hook: Any) -> Any:
    def unraisable(info: Any) -> None:  # a Stopped lost in a finalizer: check() raises it, nothing to print
        if not isinstance(info.exc_value, Stopped):
            hook(info)
    unraisable.runner_quiet = True
    return unraisable


def install() -> None:
    """Route SIGINT and SIGTERM to :class:`Stopped` (in the main thread of the driver)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_signal)
        signal.signal(signal.SIGTERM, _on_signal)
        if not getattr(sys.unraisablehook, "runner_quiet", False):
            sys.unraisablehook = _quiet_lost_raise(sys.unraisablehook)


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
