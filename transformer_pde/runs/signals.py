"""SIGINT and SIGTERM stop a run cleanly, at once where Python can raise and at the next safe
point where it cannot.

Inside :func:`stop_on_signals` the two signals raise :class:`SignalReceived` and are also
recorded. An exception the interpreter swallows (a signal that lands in a garbage-collection
callback, such as JAX's, or a ``__del__``: Python only reports it, through
``sys.unraisablehook``) is not printed; the signal is delivered to the main thread again, so the
run stops where Python next can raise, instead of tracing on until the watchdog ends it. The
runner's safe points (:func:`check_interrupt`: after each checkpoint, after ``compute``, before
the data and the figures) raise for any recorded signal as well. Inside :func:`signals_deferred`
(the writes that complete a run) they are only recorded, and :func:`pending_signal` tells the
caller one came.

Python runs a handler only between bytecodes: a signal that lands while the main thread waits
in native code (one compiled XLA call, a kernel plan) would wait for it to return, minutes
perhaps. A watchdog thread therefore reads the signal from the interpreter's wakeup fd
(``signal.set_wakeup_fd``; native calls that wait release the GIL, so the thread runs): if the
run has not stopped :data:`WATCHDOG_GRACE_S` seconds after SIGINT/SIGTERM, it calls the hooks
registered with :func:`on_forced_stop` (the runner marks its directory "interrupted"; every
file was written atomically and checkpoints declare only whole chunks, so the directory is
consistent and ``--resume`` continues it) and ends the process with status 128 + N.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

WATCHDOG_GRACE_S = 3.0
"""Seconds a run has, after SIGINT/SIGTERM, to stop by itself before the watchdog ends it."""


class SignalReceived(BaseException):
    """SIGINT or SIGTERM arrived (raised from the handler, or at a safe point); ``signum`` is
    the signal. A BaseException, like KeyboardInterrupt: ``except Exception`` does not stop it."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum


class _SignalState:
    pending: list = []  # signals received since stop_on_signals began
    deferred: bool = False  # inside the final writes: record only
    stopping: bool = False  # a SignalReceived was raised and not swallowed: the run is stopping
    redeliveries: list = []  # threads delivering a swallowed signal again (joined as the block ends)
    forced_stop_hooks: list = []  # called by the watchdog before it ends the process


class _Watchdog:
    """Reads signal numbers from the wakeup fd; ends the process when the main thread does not
    stop within the grace time (module docstring)."""

    def __init__(self, signals, grace: float):
        self.signals, self.grace = {int(s) for s in signals}, grace
        self.done = threading.Event()
        self.r, self.w = os.pipe()
        os.set_blocking(self.w, False)
        self.previous_fd = signal.set_wakeup_fd(self.w, warn_on_full_buffer=False)
        self.thread = threading.Thread(target=self._watch, name="transformer-pde-watchdog", daemon=True)
        self.thread.start()

    def _watch(self):
        while True:
            try:
                data = os.read(self.r, 1)
            except OSError:
                return
            if not data or self.done.is_set():
                return
            signum = data[0]
            if signum not in self.signals:
                continue
            # the main thread's handler stops the run; give it the grace time (longer while it
            # completes the run's final writes)
            while not self.done.wait(self.grace):
                if not _SignalState.deferred:
                    self._force(signum)
                    return

    def _force(self, signum):
        for hook in list(_SignalState.forced_stop_hooks):
            try:
                hook(signum)
            except Exception:  # noqa: BLE001 - best effort: the process ends either way
                pass
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = str(signum)
        sys.stderr.write(f"interrupted ({name}) inside a native computation; stopped {self.grace:g} s "
                         f"later by the watchdog; the output directory is consistent (--resume "
                         f"continues it)\n")
        sys.stderr.flush()
        os._exit(128 + signum)

    def close(self):
        self.done.set()
        signal.set_wakeup_fd(self.previous_fd)
        try:
            os.write(self.w, b"\0")  # wake the thread: it sees done and returns
        except OSError:
            pass
        self.thread.join(timeout=1.0)
        for fd in (self.r, self.w):
            try:
                os.close(fd)
            except OSError:
                pass


@contextlib.contextmanager
def on_forced_stop(hook):
    """While the block runs, ``hook(signum)`` is called (from the watchdog thread) before the
    watchdog ends a run stuck in native code after a signal; it must leave files consistent."""
    _SignalState.forced_stop_hooks.append(hook)
    try:
        yield
    finally:
        _SignalState.forced_stop_hooks.remove(hook)


def _on_signal(signum, frame):
    _SignalState.pending.append(signum)
    if not (_SignalState.deferred or _SignalState.stopping):
        # Raised here where Python can (a prompt stop); if code that runs the handler swallows
        # it (a gc callback, a __del__), _unraisable_hook delivers the signal again. A signal
        # that comes while the run is already stopping is only recorded: its cleanup runs on.
        _SignalState.stopping = True
        raise SignalReceived(signum)


_REDELIVERY_DELAY_S = 0.01
"""The main thread leaves the callback that swallowed the exception before the signal comes again."""


def _redeliver(signum: int, main_thread: int) -> None:
    time.sleep(_REDELIVERY_DELAY_S)
    if _SignalState.stopping or _SignalState.deferred:  # a safe point raised meanwhile, or the
        return  # final writes began (they record signals; the watchdog has the recorded one)
    try:
        signal.pthread_kill(main_thread, signum)
    except (OSError, ValueError):  # the main thread has ended: nothing left to stop
        pass


def _unraisable_hook(previous):
    """A ``sys.unraisablehook`` that takes a swallowed :class:`SignalReceived` (no report) and
    delivers its signal to the main thread again, from another thread (a signal sent from
    inside the hook would raise in the hook, and be swallowed again); other reports go on to
    ``previous``."""

    def hook(unraisable):
        if isinstance(unraisable.exc_value, SignalReceived):
            _SignalState.stopping = False
            thread = threading.Thread(target=_redeliver, name="transformer-pde-signal-redelivery", daemon=True,
                                      args=(unraisable.exc_value.signum, threading.main_thread().ident))
            _SignalState.redeliveries.append(thread)
            thread.start()
        else:
            previous(unraisable)

    return hook


def pending_signal() -> int | None:
    """The first SIGINT/SIGTERM received in the current :func:`stop_on_signals` block, or None
    (ask inside the block: leaving it forgets them)."""
    return _SignalState.pending[0] if _SignalState.pending else None


def check_interrupt() -> None:
    """A safe point: raise :class:`SignalReceived` if a signal came, even one whose exception
    was swallowed where it landed."""
    if _SignalState.pending and not _SignalState.deferred:
        _SignalState.stopping = True
        raise SignalReceived(_SignalState.pending[0])


@contextlib.contextmanager
def stop_on_signals(signals=(signal.SIGINT, signal.SIGTERM), grace: float = WATCHDOG_GRACE_S):
    """While the block runs, SIGINT and SIGTERM stop a run (:class:`SignalReceived`) instead of
    killing the process, and the watchdog ends the process ``grace`` seconds after one if the
    run is stuck in native code; the previous handlers come back after it. Outside the main
    thread (where handlers cannot be set) the block runs without them."""
    _SignalState.pending = []
    _SignalState.deferred = False
    _SignalState.stopping = False
    _SignalState.redeliveries = []
    previous = {}
    for sig in signals:
        try:
            previous[sig] = signal.signal(sig, _on_signal)
        except ValueError:  # not in the main thread
            pass
    watchdog = _Watchdog(previous, grace) if previous else None
    previous_unraisable = sys.unraisablehook
    if previous:
        sys.unraisablehook = _unraisable_hook(previous_unraisable)
    try:
        yield
    finally:
        _SignalState.stopping = True  # a redelivery not yet sent is not sent: the block is over
        for thread in _SignalState.redeliveries:  # one in flight lands while our handler is set
            thread.join()
        if watchdog is not None:
            watchdog.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sys.unraisablehook = previous_unraisable
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


__all__ = ["WATCHDOG_GRACE_S", "SignalReceived", "check_interrupt", "on_forced_stop", "pending_signal",
           "signals_deferred", "stop_on_signals"]
