"""SIGINT and SIGTERM stop a run cleanly, at once where Python can raise and at the next safe
point where it cannot.

Inside :func:`stop_on_signals` the two signals raise :class:`SignalReceived` and are also
recorded, so one whose exception was swallowed (a signal that lands in a garbage-collection
callback, which the interpreter only reports) still stops the run at the next safe point the
runner controls (:func:`check_interrupt`: after each checkpoint, after ``compute``, before the
data and the figures). Inside :func:`signals_deferred` (the writes that complete a run) they are
only recorded, and :func:`pending_signal` tells the caller one came.
"""

from __future__ import annotations

import contextlib
import signal


class SignalReceived(BaseException):
    """SIGINT or SIGTERM arrived (raised from the handler, or at a safe point); ``signum`` is
    the signal. A BaseException, like KeyboardInterrupt: ``except Exception`` does not stop it."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum


class _SignalState:
    pending: list = []  # signals received since stop_on_signals began
    deferred: bool = False  # inside the final writes: record only


def _on_signal(signum, frame):
    _SignalState.pending.append(signum)
    if not _SignalState.deferred:
        # Raised here where Python can (a prompt stop); if code that runs the handler swallows
        # it (a gc callback, a __del__), the recorded signal stops the run at the next safe point.
        raise SignalReceived(signum)


def pending_signal() -> int | None:
    """The first SIGINT/SIGTERM received in the current :func:`stop_on_signals` block, or None
    (ask inside the block: leaving it forgets them)."""
    return _SignalState.pending[0] if _SignalState.pending else None


def check_interrupt() -> None:
    """A safe point: raise :class:`SignalReceived` if a signal came, even one whose exception
    was swallowed where it landed."""
    if _SignalState.pending and not _SignalState.deferred:
        raise SignalReceived(_SignalState.pending[0])


@contextlib.contextmanager
def stop_on_signals(signals=(signal.SIGINT, signal.SIGTERM)):
    """While the block runs, SIGINT and SIGTERM stop a run (:class:`SignalReceived`) instead of
    killing the process; the previous handlers come back after it. Outside the main thread
    (where handlers cannot be set) the block runs without them."""
    _SignalState.pending = []
    _SignalState.deferred = False
    previous = {}
    for sig in signals:
        try:
            previous[sig] = signal.signal(sig, _on_signal)
        except ValueError:  # not in the main thread
            pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _SignalState.pending = []  # a later run outside this block must not see them


@contextlib.contextmanager
def signals_deferred():
    """Signals are recorded, not raised, in this block (the writes that complete a run)."""
    before = _SignalState.deferred
    _SignalState.deferred = True
    try:
        yield
    finally:
        _SignalState.deferred = before


__all__ = ["SignalReceived", "check_interrupt", "pending_signal", "signals_deferred", "stop_on_signals"]
