"""A signal whose exception the interpreter swallows (it landed in a garbage-collection callback,
as JAX's is during tracing) still stops the run at once, and quietly: the CI failure of
2026-11-27, where such a SIGTERM was reported as "Exception ignored" and the run traced on until
the watchdog ended it."""

from __future__ import annotations

import gc
import signal
import sys
import time

import pytest

from transformer_pde.runs.signals import SignalReceived, _SignalState, pending_signal, stop_on_signals


def _sigterm_inside_a_gc_callback():
    fired = []

    def callback(phase, info):
        if phase == "start" and not fired:
            fired.append(True)
            signal.raise_signal(signal.SIGTERM)  # the handler raises here, inside the callback

    return callback, fired


def test_a_signal_swallowed_by_a_gc_callback_is_raised_again_without_a_report(capsys):
    """Checked by the mechanism, not the clock: the swallowed exception starts a redelivery
    (another if that one lands inside the collection too), and once that thread has sent the signal the main thread raises within a few
    bytecodes (no safe point, no watchdog: its grace is 60 s and the loop below is short)."""
    callback, fired = _sigterm_inside_a_gc_callback()
    steps = []
    with stop_on_signals(grace=60.0):
        gc.callbacks.append(callback)
        try:
            with pytest.raises(SignalReceived) as raised:
                gc.collect()  # the callback's exception is swallowed by the collector
                assert fired and pending_signal() == signal.SIGTERM
                assert _SignalState.redeliveries  # a redelivery started (one per swallowed exception)
                for thread in list(_SignalState.redeliveries):
                    thread.join()  # the signal has been sent again (the handler may raise here)
                for _ in range(1000):  # Python work with no safe point: the handler raises in it
                    steps.append(None)
        finally:
            gc.callbacks.remove(callback)
    assert raised.value.signum == signal.SIGTERM
    assert len(steps) < 1000  # raised by the redelivered signal, not after the work ran out
    assert "Exception ignored" not in capsys.readouterr().err


def test_a_second_signal_while_stopping_is_recorded_not_raised():
    """The run's cleanup (its except clause writing the directory's status) is not interrupted."""
    with stop_on_signals(grace=60.0):
        with pytest.raises(SignalReceived):
            signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)  # would raise again inside the cleanup
        assert pending_signal() == signal.SIGTERM


def test_other_unraisable_reports_still_reach_the_previous_hook():
    class Loud:
        def __del__(self):
            raise RuntimeError("from __del__")

    seen = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(type(u.exc_value))
    try:
        with stop_on_signals(grace=60.0):
            Loud()
    finally:
        sys.unraisablehook = previous
    assert seen == [RuntimeError]


def test_a_redelivery_pending_as_the_block_ends_is_not_sent_to_the_handler_after_it():
    """The block ends before the swallowed signal comes again: it must not reach the handler the
    block restores (by default SIGTERM's, which would end the process after the run finished)."""
    after = []
    restored = signal.signal(signal.SIGTERM, lambda signum, frame: after.append(signum))
    try:
        callback, fired = _sigterm_inside_a_gc_callback()
        with stop_on_signals(grace=60.0):
            gc.callbacks.append(callback)
            try:
                gc.collect()  # swallowed; its redelivery waits a moment, and the block ends first
            finally:
                gc.callbacks.remove(callback)
        time.sleep(0.2)
        assert fired and after == []
    finally:
        signal.signal(signal.SIGTERM, restored)
